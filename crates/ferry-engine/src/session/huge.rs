//! Postcopy onto hugetlb backing, where the kernel places memory 2 MiB at a
//! time: `UFFDIO_COPY` into a hugetlb range takes whole huge pages, and a
//! touch of a missing one faults for the whole page.
//!
//! ```text
//!  switchover  every huge page holding a missing 4K page is dropped whole
//!              (MADV_REMOVE); its other pages ("extras", current here but
//!              gone with it) are asked for again, or staged as zeros
//!  fault       the handler asks for every page of the huge page that is
//!              neither staged nor asked for yet
//!  arrival     pages (answers, the push, zeros) collect in a 2 MiB staging
//!              buffer; the 512th places the huge page with one UFFDIO_COPY
//! ```
//!
//! As in QEMU, whose source resends whole host pages around each dirty
//! small page (`postcopy_chunk_hostpages`), the unit that goes missing is
//! the huge page; here the destination does the rounding, so the wire is
//! the same for every backing. A huge page is placed once, so a page
//! arriving after its huge page was placed is dropped, as on 4K.

use ferry_vm::{DirtyPages, Gfn, PAGE_SIZE};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// 4K pages in a 2 MiB huge page.
pub(crate) const HUGE_PAGES: u64 = 512;

/// One huge page being filled.
struct Staged {
    buf: Vec<u8>,
    have: [u64; (HUGE_PAGES / 64) as usize],
    count: u64,
}

impl Staged {
    fn new() -> Self {
        Staged {
            buf: vec![0; HUGE_PAGES as usize * PAGE_SIZE],
            have: [0; (HUGE_PAGES / 64) as usize],
            count: 0,
        }
    }

    fn has(&self, k: u64) -> bool {
        self.have[(k / 64) as usize] & (1 << (k % 64)) != 0
    }
}

/// The huge pages being filled, by huge-page index.
#[derive(Default)]
pub(crate) struct HugeStaging {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    staged: HashMap<u64, Staged>,
    /// Completed (handed out to be placed): a late duplicate of one of
    /// their pages must not start filling them again.
    completed: HashSet<u64>,
}

/// A huge page whose 512 pages are all in: ready to place.
pub(crate) struct Complete {
    /// Its first frame.
    pub first: Gfn,
    /// Its 2 MiB.
    pub bytes: Vec<u8>,
}

impl HugeStaging {
    /// Copies the whole pages of `bytes`, frames from `first`, into their
    /// staging buffers, except those `placed` says are in guest memory;
    /// returns the huge pages this completed.
    pub fn stage(&self, first: Gfn, bytes: &[u8], placed: impl Fn(Gfn) -> bool) -> Vec<Complete> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State { staged, completed } = &mut *state;
        let mut done = Vec::new();
        for (i, page) in bytes.chunks_exact(PAGE_SIZE).enumerate() {
            let g = first.0 + i as u64;
            let (h, k) = (g / HUGE_PAGES, g % HUGE_PAGES);
            if placed(Gfn(g)) || completed.contains(&h) {
                continue;
            }
            let s = staged.entry(h).or_insert_with(Staged::new);
            s.buf[k as usize * PAGE_SIZE..(k as usize + 1) * PAGE_SIZE].copy_from_slice(page);
            if !s.has(k) {
                s.have[(k / 64) as usize] |= 1 << (k % 64);
                s.count += 1;
            }
            if s.count == HUGE_PAGES {
                completed.insert(h);
                if let Some(s) = staged.remove(&h) {
                    done.push(Complete {
                        first: Gfn(h * HUGE_PAGES),
                        bytes: s.buf,
                    });
                }
            }
        }
        done
    }

    /// Whether `gfn` waits in a staging buffer.
    pub fn holds(&self, gfn: Gfn) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .staged
            .get(&(gfn.0 / HUGE_PAGES))
            .is_some_and(|s| s.has(gfn.0 % HUGE_PAGES))
    }

    /// Huge pages partly filled.
    pub fn partial(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .staged
            .len()
    }
}

/// `missing` rounded out to whole huge pages, in frames (of a guest of
/// `pages`, a whole number of huge pages): the runs to drop.
pub(crate) fn rounded_runs(missing: &DirtyPages, pages: u64) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (first, count) in missing.runs() {
        let lo = first.0 / HUGE_PAGES * HUGE_PAGES;
        let hi = (first.0 + count)
            .div_ceil(HUGE_PAGES)
            .saturating_mul(HUGE_PAGES)
            .min(pages);
        match runs.last_mut() {
            Some((f, n)) if *f + *n >= lo => *n = (*n).max(hi - *f),
            _ => runs.push((lo, hi - lo)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_512th_page_completes_a_huge_page_and_placed_pages_are_skipped() {
        let s = HugeStaging::default();
        let page = |b: u8| vec![b; PAGE_SIZE];
        // Pages 510 and 511 of huge page 0, and page 512 (huge page 1).
        let two = [page(1), page(2), page(3)].concat();
        assert!(s.stage(Gfn(510), &two, |_| false).is_empty());
        assert!(s.holds(Gfn(511)) && s.holds(Gfn(512)) && !s.holds(Gfn(0)));
        assert_eq!(s.partial(), 2);
        // The rest of huge page 0, with page 7 already placed: it stays
        // incomplete until page 7 comes, which it never does here...
        let rest = vec![9u8; 510 * PAGE_SIZE];
        assert!(s.stage(Gfn(0), &rest, |g| g == Gfn(7)).is_empty());
        // ...so page 7 arriving later completes it.
        let done = s.stage(Gfn(7), &page(7), |_| false);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].first, Gfn(0));
        let b = &done[0].bytes;
        assert_eq!(b[7 * PAGE_SIZE], 7);
        assert_eq!(b[510 * PAGE_SIZE], 1);
        assert_eq!(b[511 * PAGE_SIZE], 2);
        assert_eq!(b[0], 9);
        assert!(!s.holds(Gfn(0)));
        assert_eq!(s.partial(), 1);
    }

    #[test]
    fn missing_pages_round_out_to_whole_huge_pages() {
        let mut m = DirtyPages::new(2048);
        for g in [3, 4, 600, 1023, 1024, 2047] {
            m.set(Gfn(g));
        }
        assert_eq!(rounded_runs(&m, 2048), vec![(0, 2048)]);
        let mut m = DirtyPages::new(2048);
        m.set(Gfn(5));
        m.set(Gfn(1600));
        assert_eq!(rounded_runs(&m, 2048), vec![(0, 512), (1536, 512)]);
        assert!(rounded_runs(&DirtyPages::new(2048), 2048).is_empty());
    }
}
