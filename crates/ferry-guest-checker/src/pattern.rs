//! One worker: a region of its own, each page stamped with its number and
//! a generation, checked before each rewrite; and the largest gap between
//! two readings of CLOCK_MONOTONIC while it works.

use super::Counters;
use ferry_guest_checker::line::{NOTED_GAPS, NOTED_GAP_MS};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
/// Pages written between two pace checks (and looks at `stop`). The clock
/// is read after every page: a worker held to a few pages a second (a
/// dirty quota, a slow host) would otherwise report the time it takes to
/// write this many pages as a pause, where it was only slowed.
const PACE_EVERY: usize = 16;
/// A paced worker this far behind its rate (the guest was paused, or the
/// host is slow) starts its schedule afresh rather than bursting to catch up.
const BEHIND: Duration = Duration::from_millis(100);

/// Holds a worker to `bytes_per_sec` (0: as fast as it can).
struct Pace {
    bytes_per_sec: u64,
    since: Instant,
    bytes: u64,
}

impl Pace {
    fn new(bytes_per_sec: u64) -> Self {
        Pace {
            bytes_per_sec,
            since: Instant::now(),
            bytes: 0,
        }
    }

    /// Counts `bytes` written; when the worker is ahead of its rate, the
    /// instant it may write again.
    fn wrote(&mut self, bytes: u64) -> Option<Instant> {
        if self.bytes_per_sec == 0 {
            return None;
        }
        self.bytes += bytes;
        let due = Duration::from_secs_f64(self.bytes as f64 / self.bytes_per_sec as f64);
        let elapsed = self.since.elapsed();
        if elapsed > due + BEHIND {
            *self = Pace::new(self.bytes_per_sec);
            return None;
        }
        (due > elapsed).then(|| self.since + due)
    }
}

/// Reads the clock, counting the gap since the reading `last` (which it
/// becomes); the reading.
fn sample(last: &mut Instant, c: &Counters) -> Instant {
    let now = Instant::now();
    let gap = now.duration_since(*last).as_nanos() as u64;
    c.max_gap_ns.fetch_max(gap, Ordering::Relaxed);
    c.window_gap_ns.fetch_max(gap, Ordering::Relaxed);
    if gap as f64 >= NOTED_GAP_MS * 1e6 {
        note(c, now, gap);
    }
    *last = now;
    now
}

/// Keeps a long gap for the next line: the [`NOTED_GAPS`] longest of the
/// window, where it ended among them.
fn note(c: &Counters, end: Instant, gap_ns: u64) {
    let mut gaps = c.window_gaps.lock().unwrap_or_else(|e| e.into_inner());
    if gaps.len() < NOTED_GAPS {
        gaps.push((end, gap_ns));
    } else if let Some(shortest) = gaps.iter_mut().min_by_key(|(_, ns)| *ns) {
        if shortest.1 < gap_ns {
            *shortest = (end, gap_ns);
        }
    }
}

/// Reads the clock until `until` (or `stop`), keeping the largest gap
/// between two readings: a paced worker waits by spinning, not sleeping,
/// so that a pause of the guest while it waits is seen whole.
fn spin_until(until: Instant, last: &mut Instant, c: &Counters, stop: &AtomicBool) {
    loop {
        let now = sample(last, c);
        if now >= until || stop.load(Ordering::Relaxed) {
            return;
        }
        std::hint::spin_loop();
    }
}

/// The stamp of `page` of worker `worker` in `generation`: never zero, and
/// distinct per page, worker and generation.
fn stamp(worker: u64, page: u64, generation: u64) -> u64 {
    (worker << 56) ^ (generation << 32) ^ page ^ 0x5a5a_0000_0000_0001
}

/// Runs until `stop`: rewrites every page of its region each generation,
/// checking that it still holds the last generation's stamp, at most
/// `bytes_per_sec` (0: as fast as it can).
pub fn run(worker: u64, bytes: u64, bytes_per_sec: u64, c: &Counters, stop: &AtomicBool) {
    let mut pace = Pace::new(bytes_per_sec);
    let pages = (bytes as usize / PAGE).max(1);
    let mut region = vec![0u64; pages * PAGE / 8];
    let words = PAGE / 8;
    for page in region.chunks_exact_mut(words) {
        // SAFETY: a valid, aligned element of the region; the volatile
        // write makes the kernel fault the page in (a zeroed allocation
        // is not yet backed), which a plain store of zero would not.
        unsafe { std::ptr::write_volatile(&mut page[0], 0) };
    }
    c.tid.store(super::sched::tid(), Ordering::Relaxed);
    c.ready.store(true, Ordering::Release);
    let mut last = Instant::now();
    let mut generation = 0u64;
    while !stop.load(Ordering::Relaxed) {
        generation += 1;
        for page in 0..pages {
            let at = page * words;
            let expect = if generation == 1 {
                0
            } else {
                stamp(worker, page as u64, generation - 1)
            };
            // The first and last word of the page: a page lost whole or
            // torn shows in one of them.
            if region[at] != expect || region[at + words - 1] != expect {
                c.mismatches.fetch_add(1, Ordering::Relaxed);
            }
            let s = stamp(worker, page as u64, generation);
            region[at] = s;
            region[at + words - 1] = s;
            c.pages.fetch_add(1, Ordering::Relaxed);
            sample(&mut last, c);
            if page % PACE_EVERY == 0 {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                if let Some(until) = pace.wrote((PACE_EVERY * PAGE) as u64) {
                    spin_until(until, &mut last, c, stop);
                }
            }
        }
        c.generations.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_never_zero_and_differ_by_page_worker_and_generation() {
        assert_ne!(stamp(0, 0, 0), 0);
        assert_ne!(stamp(0, 1, 1), stamp(0, 2, 1));
        assert_ne!(stamp(0, 1, 1), stamp(1, 1, 1));
        assert_ne!(stamp(0, 1, 1), stamp(0, 1, 2));
    }

    #[test]
    fn a_window_keeps_its_longest_gaps() {
        let c = Counters::default();
        let t0 = Instant::now();
        let ms = |n: u64| n * 1_000_000;
        for i in 0..(NOTED_GAPS as u64 + 4) {
            note(&c, t0 + Duration::from_millis(i), ms(20 + i));
        }
        // The 4 shortest made way; a shorter one than all kept does not
        // get in.
        note(&c, t0, ms(21));
        let kept = c.window_gaps.lock().unwrap();
        assert_eq!(kept.len(), NOTED_GAPS);
        let least = kept.iter().map(|&(_, ns)| ns).min().unwrap();
        assert_eq!(least, ms(24));
    }

    #[test]
    fn a_worker_finds_nothing_wrong_in_memory_that_keeps_its_writes() {
        let c = Counters::default();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| run(0, 1 << 20, 0, &c, &stop));
            while c.generations.load(Ordering::Relaxed) < 3 {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_eq!(c.mismatches.load(Ordering::Relaxed), 0);
        assert!(c.pages.load(Ordering::Relaxed) >= 3 * 256);
    }

    #[test]
    fn a_paced_worker_keeps_to_its_rate_and_reads_the_clock_while_it_waits() {
        let c = Counters::default();
        let stop = AtomicBool::new(false);
        // 64 KiB/s: each sample's 64 KiB takes a second. A worker that
        // slept that long would show a gap of about that; one that spins on
        // the clock shows only what the host took from it.
        let rate = 64 << 10;
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| run(0, 1 << 20, rate, &c, &stop));
            std::thread::sleep(Duration::from_millis(2500));
            stop.store(true, Ordering::Relaxed);
        });
        let secs = started.elapsed().as_secs_f64();
        let written = c.pages.load(Ordering::Relaxed) * PAGE as u64;
        // At most the rate, plus the two samples a worker may be ahead by
        // (it counts a sample as it starts it, and stops at the next).
        assert!(
            written as f64 <= rate as f64 * secs + (2 * PACE_EVERY * PAGE) as f64,
            "{written} bytes in {secs} s"
        );
        assert!(written > 0);
        assert!(
            c.max_gap_ns.load(Ordering::Relaxed) < 500_000_000,
            "gap {} ns",
            c.max_gap_ns.load(Ordering::Relaxed)
        );
    }
}
