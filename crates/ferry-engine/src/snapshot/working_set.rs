//! The snapshot's working set: the pages the guest touched in its last
//! seconds before the pause, newest first. A lazy restore brings them in
//! before the rest ([`super::RestoreMode::LazyWorkingSet`]): a guest that
//! runs on from the pause touches first what it was touching then.
//!
//! Why from the dirty logs: they are the one record of the guest's recent
//! touches that every VM in the contract offers, and a live snapshot reads
//! them anyway. They see writes only, one set per round (no order within a
//! round), so the order is by round, newest first, and by address within a
//! round. A VM that also keeps an access log ([`ferry_vm::AccessLog`])
//! adds the pages its guest only read (`super::accesses`): a guest that
//! reads more than it writes would otherwise fault on them after a lazy
//! restore.

use ferry_vm::{DirtyPages, Gfn};
use std::time::{Duration, Instant};

/// How far back before the pause a round's writes count.
pub const WINDOW: Duration = Duration::from_secs(2);

/// One live round's touches: what the dirty logs saw written, and what
/// the access log saw accessed (where there is one).
struct Round {
    at: Instant,
    written: DirtyPages,
    accessed: Option<DirtyPages>,
}

/// The working set at a pause ([`Recorder::finish`]).
#[derive(Debug, PartialEq)]
pub struct Finished {
    /// Runs of frames, in the order a lazy restore brings them in.
    pub runs: Vec<(u64, u64)>,
    /// Of its pages, those only the access log saw (read, never written
    /// in the window); 0 without one.
    pub read_pages: u64,
}

/// The harvests of the live rounds still inside [`WINDOW`].
pub struct Recorder {
    recent: Vec<Round>,
}

impl Recorder {
    /// Nothing recorded yet.
    pub fn new() -> Self {
        Recorder { recent: Vec::new() }
    }

    /// Records a live round's harvests taken at `at`: `written` from the
    /// dirty logs, `accessed` from the access log where there is one;
    /// forgets the rounds already too old to count.
    pub fn record(&mut self, at: Instant, written: &DirtyPages, accessed: Option<&DirtyPages>) {
        self.recent
            .retain(|r| at.saturating_duration_since(r.at) <= WINDOW);
        self.recent.push(Round {
            at,
            written: written.clone(),
            accessed: accessed.cloned(),
        });
    }

    /// The working set at a pause at `paused_at`: `first` (a restore's
    /// first touches) first, then the pause's touches, then the recorded
    /// rounds', newest first. `last` and `last_accessed` are the pause's
    /// harvests, each holding the latest live round's too (as the pages
    /// the pause writes hold them), so that round's touches lead.
    pub fn finish(
        self,
        first: &[u64],
        last: &DirtyPages,
        last_accessed: Option<&DirtyPages>,
        paused_at: Instant,
    ) -> Finished {
        let (mut runs, mut taken) = in_order(first, last.pages());
        let within: Vec<&Round> = self
            .recent
            .iter()
            .rev()
            .take_while(|r| paused_at.saturating_duration_since(r.at) <= WINDOW)
            .collect();
        let mut written = last.clone();
        within.iter().for_each(|r| written.merge(&r.written));
        let sets = std::iter::once((last, last_accessed))
            .chain(within.iter().map(|r| (&r.written, r.accessed.as_ref())));
        let mut read_pages = 0;
        for (round_written, round_accessed) in sets {
            let mut fresh = DirtyPages::new(round_written.pages());
            let touched = round_written
                .iter()
                .chain(round_accessed.into_iter().flat_map(|a| a.iter()));
            for g in touched {
                if !taken.contains(g) {
                    fresh.set(g);
                    taken.set(g);
                    read_pages += u64::from(!written.contains(g));
                }
            }
            runs.extend(fresh.runs().into_iter().map(|(g, n)| (g.0, n)));
        }
        Finished { runs, read_pages }
    }
}

/// `frames` in their order, each once (and only those of a guest of
/// `pages` frames), as runs of consecutive frames; and the set of them.
pub fn in_order(frames: &[u64], pages: u64) -> (Vec<(u64, u64)>, DirtyPages) {
    let mut taken = DirtyPages::new(pages);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &g in frames.iter().filter(|&&g| g < pages) {
        if taken.contains(Gfn(g)) {
            continue;
        }
        taken.set(Gfn(g));
        match runs.last_mut() {
            Some((first, n)) if *first + *n == g => *n += 1,
            _ => runs.push((g, 1)),
        }
    }
    (runs, taken)
}

/// Pages in `runs`.
pub fn pages(runs: &[(u64, u64)]) -> u64 {
    runs.iter().map(|&(_, n)| n).sum()
}

/// The file's form: (first, count) pairs of little-endian u64s.
pub fn encode(runs: &[(u64, u64)]) -> Vec<u8> {
    runs.iter()
        .flat_map(|&(first, n)| first.to_le_bytes().into_iter().chain(n.to_le_bytes()))
        .collect()
}

/// Reads [`encode`]'s form back, for a guest of `frames` frames.
pub fn decode(bytes: &[u8], frames: u64) -> Result<Vec<(u64, u64)>, String> {
    if !bytes.len().is_multiple_of(16) {
        return Err(format!(
            "its working set is {} bytes, not whole runs",
            bytes.len()
        ));
    }
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    bytes
        .chunks_exact(16)
        .map(|run| {
            let (first, n) = (u64_at(&run[..8]), u64_at(&run[8..]));
            match first.checked_add(n) {
                Some(end) if n > 0 && end <= frames => Ok((first, n)),
                _ => Err(format!(
                    "its working set names {n} frames from {first:#x}; the guest has {frames}"
                )),
            }
        })
        .collect()
}

/// The fill's order for `runs`: the aligned chunks of `chunk` frames that
/// hold a page of the working set, each once, in the order the working
/// set first reaches them (so newest first), as `(first, chunk)` runs.
///
/// Why whole chunks: the newest round's pages lie scattered wherever the
/// guest wrote last, and read page by page they cost a read and a copy
/// each; a chunk costs one of each. A guest's hot set is mostly whole
/// chunks anyway, and where it is not, the few cold pages read with it
/// cost less than the reads saved.
pub fn chunks(runs: &[(u64, u64)], chunk: u64) -> Vec<(u64, u64)> {
    let end = runs.iter().map(|&(g, n)| g + n).max().unwrap_or(0);
    let mut seen = vec![false; end.div_ceil(chunk) as usize];
    let mut order = Vec::new();
    for &(first, n) in runs.iter().filter(|&&(_, n)| n > 0) {
        for c in first / chunk..=(first + n - 1) / chunk {
            if !std::mem::replace(&mut seen[c as usize], true) {
                order.push((c * chunk, chunk));
            }
        }
    }
    order
}

/// Every frame of `runs`, in order.
pub fn frames(runs: &[(u64, u64)]) -> impl Iterator<Item = Gfn> + '_ {
    runs.iter()
        .flat_map(|&(first, n)| (first..first + n).map(Gfn))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(frames: &[u64]) -> DirtyPages {
        let mut d = DirtyPages::new(64);
        frames.iter().for_each(|&g| d.set(Gfn(g)));
        d
    }

    #[test]
    fn chunks_come_in_the_order_the_working_set_reaches_them() {
        let runs = [(9, 2), (1, 1), (40, 1), (3, 1), (17, 1)];
        assert_eq!(chunks(&runs, 8), vec![(8, 8), (0, 8), (40, 8), (16, 8)]);
        assert!(chunks(&[], 8).is_empty());
        assert_eq!(chunks(&[(0, 0), (3, 1)], 8), vec![(0, 8)]);
    }

    #[test]
    fn the_newest_writes_come_first_and_each_page_once() {
        let now = Instant::now();
        let mut r = Recorder::new();
        r.record(now, &set(&[40, 41]), None);
        r.record(now, &set(&[1, 2, 3]), None);
        let runs = r.finish(&[], &set(&[2, 3, 9]), None, now).runs;
        assert_eq!(runs, vec![(2, 2), (9, 1), (1, 1), (40, 2)]);
        assert_eq!(pages(&runs), 6);
        assert_eq!(decode(&encode(&runs), 64).unwrap(), runs);
    }

    #[test]
    fn rounds_older_than_the_window_do_not_count() {
        let now = Instant::now();
        let mut r = Recorder::new();
        r.record(now, &set(&[7]), None);
        let later = now + WINDOW + Duration::from_millis(1);
        r.record(later, &set(&[8]), None);
        assert_eq!(r.finish(&[], &set(&[]), None, later).runs, vec![(8, 1)]);
    }

    #[test]
    fn a_restore_s_first_touches_come_first_in_their_order() {
        let now = Instant::now();
        let mut r = Recorder::new();
        r.record(now, &set(&[1, 2, 3]), None);
        // Touched in this order after a restore; 30 twice, 99 past the guest.
        let first = [30, 31, 5, 30, 99, 2];
        let runs = r.finish(&first, &set(&[2, 9]), None, now).runs;
        assert_eq!(runs, vec![(30, 2), (5, 1), (2, 1), (9, 1), (1, 1), (3, 1)]);
        // Without a running guest, the first touches are all there is.
        assert_eq!(in_order(&first, 64).0, vec![(30, 2), (5, 1), (2, 1)]);
    }

    #[test]
    fn pages_only_read_join_their_round_and_are_counted() {
        let now = Instant::now();
        let mut r = Recorder::new();
        // An older round wrote 40 and read 20-21; the latest live round
        // wrote 1 and read 1 and 30; the pause's harvests saw 2 written and
        // 5 read, and hold the latest round's too, as in a snapshot.
        r.record(now, &set(&[40]), Some(&set(&[20, 21, 40])));
        r.record(now, &set(&[1]), Some(&set(&[1, 30])));
        let done = r.finish(&[], &set(&[1, 2]), Some(&set(&[1, 5, 30])), now);
        assert_eq!(done.runs, vec![(1, 2), (5, 1), (30, 1), (20, 2), (40, 1)]);
        // 5, 30, 20 and 21 were only read; 1 and 40 were written too.
        assert_eq!(done.read_pages, 4);
        let mut r = Recorder::new();
        r.record(now, &set(&[1]), None);
        let written_only = r.finish(&[], &set(&[1, 2]), None, now);
        assert_eq!(
            (written_only.runs, written_only.read_pages),
            (vec![(1, 2)], 0)
        );
    }

    #[test]
    fn a_run_past_the_guest_or_empty_is_refused() {
        assert!(decode(&encode(&[(60, 5)]), 64).is_err());
        assert!(decode(&encode(&[(3, 0)]), 64).is_err());
        assert!(decode(&[0; 15], 64).is_err());
        assert!(decode(&encode(&[(u64::MAX, 2)]), 64).is_err());
    }
}
