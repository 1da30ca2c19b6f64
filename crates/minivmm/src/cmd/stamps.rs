//! The host's time of each checker line, as its console file grows, to
//! tell how far the guest's clock fell behind across a move.
//!
//! The checker's gaps are read off the guest's own clock. A VMM that stops
//! the kvmclock for part of the pause (QEMU reads it as it saves the
//! device state and sets the destination's to that value, so the device
//! state's transfer, load and start do not count) hides that part from
//! them: the guest's clock falls behind the host's by it instead. One that sets the clock on by
//! the time that passed (ferry's kvm state, `KVM_CLOCK_REALTIME`) leaves
//! it in the gaps. Each line carries the guest's clock (`clock_ms`); the
//! host notes when it arrived. A line can arrive late (a destination that
//! holds its guest's outputs until the commit sends them in a burst), never
//! early, so the least of (host time - guest time) over a console is its
//! offset, and the destination's less the source's is what the clock lost.
//!
//! The same offset places the host's moment of the switchover on the
//! guest's clock, and with it the gap the pause made among those each line
//! lists ([`switchover_gap_ms`]): a throttle's stalls just before the
//! pause fall in the same lines, and are not the pause.

use ferry_guest_checker::line::{Gap, Line};
use minivmm::vm::unix_ms;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the console files are read: often enough to place a line
/// within a few ms, seldom enough to cost the emulated host little.
const POLL: Duration = Duration::from_millis(10);

/// One checker line, as the host saw it arrive.
#[derive(Clone, Debug, PartialEq)]
pub struct Stamp {
    /// On the destination's console (else the source's).
    pub destination: bool,
    /// When the host saw the line whole: its CLOCK_REALTIME, in ms since
    /// the epoch (the clock QEMU stamps its events with, and minivmm its
    /// pause).
    pub host_ms: f64,
    /// The guest's clock in the line (`clock_ms`).
    pub clock_ms: f64,
    /// The longest gaps it lists, on the guest's clock.
    pub gaps: Vec<Gap>,
}

/// Follows a source's and a destination's console files.
pub struct Stamper {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Stamp>>,
}

impl Stamper {
    /// Starts following `source` and `destination` (which may not exist
    /// yet) from their start.
    pub fn start(source: PathBuf, destination: PathBuf) -> Stamper {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut files =
                [(source, false), (destination, true)].map(|(path, destination)| Followed {
                    path,
                    destination,
                    file: None,
                    partial: String::new(),
                    partial_seen_ms: 0.0,
                });
            let mut stamps = Vec::new();
            loop {
                let last = stopping.load(Ordering::Acquire);
                for f in &mut files {
                    f.read_lines(&mut stamps);
                }
                if last {
                    return stamps;
                }
                std::thread::sleep(POLL);
            }
        });
        Stamper { stop, thread }
    }

    /// Follows the consoles `source` and `destination` in `dir`, removed
    /// first: a file left from an earlier run would be read as this one's.
    pub fn follow(dir: &std::path::Path, source: &str, destination: &str) -> Stamper {
        let (source, destination) = (dir.join(source), dir.join(destination));
        let _ = std::fs::remove_file(&source);
        let _ = std::fs::remove_file(&destination);
        Stamper::start(source, destination)
    }

    /// Stops following, after a last read; the lines seen.
    pub fn finish(self) -> Vec<Stamp> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or_default()
    }
}

/// One console file, read as it grows.
struct Followed {
    path: PathBuf,
    destination: bool,
    /// Open once it exists; reads go on from where the last stopped.
    file: Option<std::fs::File>,
    /// The end of what was read, not yet a whole line.
    partial: String,
    /// When the host first saw the start of `partial`.
    partial_seen_ms: f64,
}

impl Followed {
    /// Stamps the whole checker lines written since the last read.
    fn read_lines(&mut self, stamps: &mut Vec<Stamp>) {
        use std::io::Read;
        if self.file.is_none() {
            self.file = std::fs::File::open(&self.path).ok();
        }
        let Some(file) = &mut self.file else {
            return;
        };
        let mut new = Vec::new();
        if file.read_to_end(&mut new).is_err() || new.is_empty() {
            return;
        }
        self.add(&String::from_utf8_lossy(&new), unix_ms(), stamps);
    }

    /// Takes `new` text, read at `host_ms`, stamping each line it completes.
    fn add(&mut self, new: &str, host_ms: f64, stamps: &mut Vec<Stamp>) {
        // A line is stamped when its start was seen, not its end: the
        // guest reads its clock just before it prints the line, and a
        // serial port takes a VM exit per byte, tens of ms for a line
        // inside the SVM host, which would place the pause that late.
        let mut seen_ms = match self.partial.is_empty() {
            true => host_ms,
            false => self.partial_seen_ms,
        };
        self.partial.push_str(new);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            let host_ms = std::mem::replace(&mut seen_ms, host_ms);
            if let Some(Ok(l)) = Line::parse(&line) {
                stamps.push(Stamp {
                    destination: self.destination,
                    host_ms,
                    clock_ms: l.clock_ms,
                    gaps: l.gaps,
                });
            }
        }
        self.partial_seen_ms = seen_ms;
    }
}

/// Keeps `stamps` and the moment of the pause in `path`, one JSON line
/// per checker line and a last one for the pause, for a reader who wants
/// to place a gap by hand; a failure to write is only reported.
pub fn keep(path: &std::path::Path, stamps: &[Stamp], paused_unix_ms: Option<f64>) {
    let mut text = String::new();
    for s in stamps {
        let gaps: Vec<[f64; 2]> = s.gaps.iter().map(|g| [g.end_ms, g.ms]).collect();
        let j = serde_json::json!({
            "destination": s.destination, "host_ms": s.host_ms,
            "clock_ms": s.clock_ms, "gaps": gaps,
        });
        text += &format!("{j}\n");
    }
    text += &format!(
        "{}\n",
        serde_json::json!({ "paused_unix_ms": paused_unix_ms })
    );
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("minivmm: {}: {e}", path.display());
    }
}

/// The least of (host time - guest time) over one console's lines: the
/// host's time at the guest clock's zero, to within the lines' delay.
fn offset(stamps: &[Stamp], destination: bool) -> Option<f64> {
    stamps
        .iter()
        .filter(|s| s.destination == destination && s.clock_ms > 0.0)
        .map(|s| s.host_ms - s.clock_ms)
        .reduce(f64::min)
}

/// How far the guest's clock fell behind the host's from the source's
/// console to the destination's, in ms (see the module's docs); `None`
/// without lines on both.
pub fn clock_lost_ms(stamps: &[Stamp]) -> Option<f64> {
    Some(offset(stamps, true)? - offset(stamps, false)?)
}

/// How much earlier than its listed start a gap may begin and still be
/// taken as the pause's, in ms: the lines' delay, which the offset
/// overstates by (the stamper reads the consoles every [`POLL`]).
const PLACE_SLACK_MS: f64 = 30.0;

/// The host's moment of the pause (`paused_unix_ms`) on the guest's clock,
/// by the consoles' offset; `None` without a source line. The offset is
/// the lines' least delay too late, so the estimate is early by as much: a
/// gap that began up to the slack after it began before the pause. The
/// least over both consoles: a source's lines come late under a throttle
/// (a vCPU held while it prints), and a destination's clock never runs
/// ahead of the source's (a VMM that stops the clock puts it behind, where
/// the source's offset is less).
fn pause_on_guest_clock(stamps: &[Stamp], paused_unix_ms: f64) -> Option<f64> {
    let source = offset(stamps, false)?;
    Some(paused_unix_ms - offset(stamps, true).map_or(source, |d| d.min(source)))
}

/// The pause the guest saw at the switchover: the longest gap, among those
/// the lines list, that spans the moment the host paused the guest
/// (`paused_unix_ms`, on the stamps' clock), placed on the guest's clock
/// by the consoles' offset. A gap that ended just before the pause, within
/// the lines' least delay, can be taken for one that spans it. `None`
/// where no listed gap spans it (a checker too old to list its gaps, a
/// pause under [`NOTED_GAP_MS`], or one a throttle's stalls crowded out of
/// its line: [`switchover_gap_at_most_ms`]).
///
/// [`NOTED_GAP_MS`]: ferry_guest_checker::line::NOTED_GAP_MS
pub fn switchover_gap_ms(stamps: &[Stamp], paused_unix_ms: f64) -> Option<f64> {
    let at = pause_on_guest_clock(stamps, paused_unix_ms)?;
    stamps
        .iter()
        .flat_map(|s| &s.gaps)
        .filter(|g| g.start_ms() <= at + PLACE_SLACK_MS && g.end_ms >= at)
        .map(|g| g.ms)
        .reduce(f64::max)
}

/// Where no listed gap spans the pause ([`switchover_gap_ms`] is `None`):
/// the longest the pause's gap can have been, from the lines it must have
/// been noted in. Its gap ended after the pause, so the destination's
/// first line, or the one after that, took it (a line a second later: a
/// worker that read no clock for that long after the resume has a gap
/// longer than any throttle's stall, and its line lists it); a line lists the
/// [`NOTED_GAPS`] longest of its window, so one that lists that many
/// without the pause's had it no longer than the shortest it lists, and
/// one that lists fewer did not have it (or had it under
/// [`NOTED_GAP_MS`]). The bound is the larger of the two lines'. `None`
/// without both lines, or where a listed gap spans the pause.
///
/// [`NOTED_GAPS`]: ferry_guest_checker::line::NOTED_GAPS
/// [`NOTED_GAP_MS`]: ferry_guest_checker::line::NOTED_GAP_MS
pub fn switchover_gap_at_most_ms(stamps: &[Stamp], paused_unix_ms: f64) -> Option<f64> {
    use ferry_guest_checker::line::{NOTED_GAPS, NOTED_GAP_MS};
    if switchover_gap_ms(stamps, paused_unix_ms).is_some() {
        return None;
    }
    let at = pause_on_guest_clock(stamps, paused_unix_ms)?;
    let mut after: Vec<&Stamp> = stamps
        .iter()
        .filter(|s| s.destination && s.clock_ms >= at - PLACE_SLACK_MS)
        .collect();
    after.sort_by(|a, b| a.clock_ms.total_cmp(&b.clock_ms));
    let most = |s: &Stamp| match s.gaps.len() >= NOTED_GAPS {
        true => s.gaps.iter().map(|g| g.ms).reduce(f64::min),
        false => Some(NOTED_GAP_MS),
    };
    match after.as_slice() {
        [first, second, ..] => Some(most(first)?.max(most(second)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checker line, as the guest prints it.
    fn line(seq: u64, clock_ms: f64) -> String {
        Line {
            seq,
            clock_ms,
            ..Line::default()
        }
        .format()
    }

    fn stamp(destination: bool, host_ms: f64, clock_ms: f64) -> Stamp {
        Stamp {
            destination,
            host_ms,
            clock_ms,
            gaps: Vec::new(),
        }
    }

    #[test]
    fn the_pause_is_the_gap_that_spans_the_hosts_moment_not_a_throttles_before_it() {
        let gap = |end_ms, ms| Gap { end_ms, ms };
        // The guest's clock is at 0 at host time 10,000; lines arrive
        // 2-6 ms late. Under a throttle, the gaps of 390 and 400 ms end
        // before the pause at host 13,500 (guest 3,500); the pause's own
        // gaps, one per vCPU, are 180 and 150 ms; after it, 60 ms.
        let stamps = [
            stamp(false, 11_002.0, 1_000.0),
            stamp(false, 12_006.0, 2_000.0),
            Stamp {
                gaps: vec![gap(2_900.0, 390.0), gap(3_450.0, 400.0)],
                ..stamp(false, 13_003.0, 3_000.0)
            },
            Stamp {
                gaps: vec![gap(3_660.0, 180.0), gap(3_662.0, 150.0)],
                ..stamp(true, 14_005.0, 4_000.0)
            },
            Stamp {
                gaps: vec![gap(4_500.0, 60.0)],
                ..stamp(true, 15_004.0, 5_000.0)
            },
        ];
        assert_eq!(switchover_gap_ms(&stamps, 13_500.0), Some(180.0));
        // A vCPU asleep on the throttle when the pause came saw both as
        // one gap: that is what it saw.
        let mut merged = stamps.clone();
        merged[3].gaps.push(gap(3_661.0, 500.0));
        assert_eq!(switchover_gap_ms(&merged, 13_500.0), Some(500.0));
        // No listed gap spans it, or no source line to place it by.
        assert_eq!(switchover_gap_ms(&stamps, 14_300.0), None);
        assert_eq!(switchover_gap_ms(&stamps[3..], 13_500.0), None);
    }

    #[test]
    fn a_pause_crowded_out_of_its_line_is_bounded_by_the_shortest_it_lists() {
        use ferry_guest_checker::line::{NOTED_GAPS, NOTED_GAP_MS};
        let gap = |end_ms, ms| Gap { end_ms, ms };
        // As in run b1: the first line after the pause at guest 3,500
        // lists the throttle's stalls before it, 8 of 190-710 ms, and
        // not the pause; the next lists two short gaps.
        let stalls: Vec<Gap> = (0..NOTED_GAPS)
            .map(|i| gap(2_000.0 + 150.0 * i as f64, 190.0 + 70.0 * i as f64))
            .collect();
        let mut stamps = vec![
            stamp(false, 11_002.0, 1_000.0),
            stamp(false, 12_006.0, 2_000.0),
            Stamp {
                gaps: stalls.clone(),
                ..stamp(true, 14_005.0, 4_000.0)
            },
            Stamp {
                gaps: vec![gap(4_400.0, 33.0), gap(4_450.0, 41.0)],
                ..stamp(true, 15_004.0, 5_000.0)
            },
        ];
        assert_eq!(switchover_gap_ms(&stamps, 13_500.0), None, "not listed");
        assert_eq!(switchover_gap_at_most_ms(&stamps, 13_500.0), Some(190.0));
        // The next line full too: it may have been there, up to its
        // shortest.
        stamps[3].gaps = stalls
            .iter()
            .map(|g| gap(g.end_ms + 2_000.0, g.ms + 60.0))
            .collect();
        assert_eq!(switchover_gap_at_most_ms(&stamps, 13_500.0), Some(250.0));
        // Neither full: it was under the shortest a line lists.
        stamps[2].gaps.truncate(3);
        stamps[3].gaps.truncate(3);
        assert_eq!(
            switchover_gap_at_most_ms(&stamps, 13_500.0),
            Some(NOTED_GAP_MS)
        );
        // One line after the pause only: no bound.
        assert_eq!(switchover_gap_at_most_ms(&stamps[..3], 13_500.0), None);
        // A source line made just before the pause, within the placing
        // slack, cannot hold the pause's gap: the destination's first two
        // lines count, the second of them full (at most 250 ms).
        stamps[3].gaps = stalls
            .iter()
            .map(|g| gap(g.end_ms + 2_000.0, g.ms + 60.0))
            .collect();
        stamps.insert(
            2,
            Stamp {
                gaps: stalls.iter().map(|g| gap(g.end_ms, 20.0)).collect(),
                ..stamp(false, 13_490.0, 3_490.0)
            },
        );
        assert_eq!(switchover_gap_at_most_ms(&stamps, 13_500.0), Some(250.0));
    }

    #[test]
    fn a_clock_stopped_for_the_pause_falls_behind_by_it() {
        // Lines each second of guest time; the guest was stopped 80 ms
        // and its clock with it; each line arrives 3-9 ms after it is made.
        let stamps = [
            stamp(false, 1003.0, 1000.0),
            stamp(false, 2009.0, 2000.0),
            stamp(false, 3004.0, 3000.0),
            stamp(true, 4083.0, 4000.0),
            stamp(true, 5086.0, 5000.0),
        ];
        assert_eq!(clock_lost_ms(&stamps), Some(80.0));
    }

    #[test]
    fn lines_held_back_and_sent_late_do_not_count_as_lost_time() {
        // A clock set on by the pause: no time lost, though the first two
        // destination lines came out together when their hold ended.
        let stamps = [
            stamp(false, 1004.0, 1000.0),
            stamp(false, 2003.0, 2000.0),
            stamp(true, 5200.0, 3000.0),
            stamp(true, 5200.0, 4000.0),
            stamp(true, 5003.5, 5000.0),
        ];
        assert_eq!(clock_lost_ms(&stamps), Some(0.5));
    }

    #[test]
    fn without_lines_on_both_sides_nothing_is_claimed() {
        assert_eq!(clock_lost_ms(&[]), None);
        assert_eq!(clock_lost_ms(&[stamp(false, 1.0, 0.5)]), None);
        // A checker too old to stamp its lines (clock 0) tells nothing.
        assert_eq!(
            clock_lost_ms(&[stamp(false, 1.0, 0.0), stamp(true, 2.0, 0.0)]),
            None
        );
    }

    #[test]
    fn the_stamper_sees_lines_as_the_files_grow() {
        let dir = std::env::temp_dir().join(format!("minivmm-stamps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, dst) = (dir.join("source.console"), dir.join("destination.console"));
        let _ = std::fs::remove_file(&src);
        let _ = std::fs::remove_file(&dst);
        let stamper = Stamper::start(src.clone(), dst.clone());
        std::fs::write(&src, format!("kernel noise\n{}\n", line(1, 10.0))).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // A line written in two pieces counts once, when whole.
        let second = line(2, 20.0);
        let (a, b) = second.split_at(10);
        std::fs::write(&dst, a).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let mut f = std::fs::OpenOptions::new().append(true).open(&dst).unwrap();
        std::io::Write::write_all(&mut f, format!("{b}\n").as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let stamps = stamper.finish();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(stamps.len(), 2, "{stamps:?}");
        assert!(!stamps[0].destination && stamps[1].destination);
        assert_eq!((stamps[0].clock_ms, stamps[1].clock_ms), (10.0, 20.0));
        // Seen in the order written (the second begun 50 ms after the
        // first was whole).
        assert!(stamps[1].host_ms > stamps[0].host_ms, "{stamps:?}");
    }

    #[test]
    fn a_line_is_stamped_when_its_start_was_seen() {
        let mut f = Followed {
            path: PathBuf::new(),
            destination: false,
            file: None,
            partial: String::new(),
            partial_seen_ms: 0.0,
        };
        let (one, two, three) = (line(1, 1.0), line(2, 2.0), line(3, 3.0));
        let mut stamps = Vec::new();
        // Line 1 starts at 100 and ends at 160; line 2 starts and ends at
        // 160, line 3 starts there and ends at 230.
        f.add(&one[..20], 100.0, &mut stamps);
        f.add(&one[20..], 130.0, &mut stamps);
        f.add(&format!("\n{two}\n{}", &three[..5]), 160.0, &mut stamps);
        f.add(&format!("{}\n", &three[5..]), 230.0, &mut stamps);
        let at: Vec<f64> = stamps.iter().map(|s| s.host_ms).collect();
        assert_eq!(at, [100.0, 160.0, 160.0]);
    }
}
