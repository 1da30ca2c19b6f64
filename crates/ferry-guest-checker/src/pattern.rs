//! One worker: a region of its own, each page stamped with its number and
//! a generation, checked before each rewrite; and the largest gap between
//! two readings of CLOCK_MONOTONIC while it works.

use super::Counters;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

const PAGE: usize = 4096;

/// The stamp of `page` of worker `worker` in `generation`: never zero, and
/// distinct per page, worker and generation.
fn stamp(worker: u64, page: u64, generation: u64) -> u64 {
    (worker << 56) ^ (generation << 32) ^ page ^ 0x5a5a_0000_0000_0001
}

/// Runs until `stop`: rewrites every page of its region each generation,
/// checking that it still holds the last generation's stamp.
pub fn run(worker: u64, bytes: u64, c: &Counters, stop: &AtomicBool) {
    let pages = (bytes as usize / PAGE).max(1);
    let mut region = vec![0u64; pages * PAGE / 8];
    let words = PAGE / 8;
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
            if page % 16 == 0 {
                let now = Instant::now();
                let gap = now.duration_since(last).as_nanos() as u64;
                c.max_gap_ns.fetch_max(gap, Ordering::Relaxed);
                c.window_gap_ns.fetch_max(gap, Ordering::Relaxed);
                last = now;
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
    fn a_worker_finds_nothing_wrong_in_memory_that_keeps_its_writes() {
        let c = Counters::default();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| run(0, 1 << 20, &c, &stop));
            while c.generations.load(Ordering::Relaxed) < 3 {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_eq!(c.mismatches.load(Ordering::Relaxed), 0);
        assert!(c.pages.load(Ordering::Relaxed) >= 3 * 256);
    }
}
