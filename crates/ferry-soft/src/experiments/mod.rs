//! The seed experiments. Each returns a `ferry_report::Report` whose first
//! table is shaped like the seed's, with every ratio measured in the same run.
//!
//! * [`dirty_log`]: eager splitting vs split on fault (seed tables 1 and 2).
//! * [`zap`]: present-only iteration vs full scan (the iterator seed).
//! * [`write_protect`]: O(1) write-protect-all vs a walk, and harvest speed.

pub mod dirty_log;
pub mod write_protect;
pub mod zap;

use std::time::{Duration, Instant};

/// Runs `f` `n` times (at least once) and returns the median duration.
pub(crate) fn median<F: FnMut() -> Duration>(n: usize, mut f: F) -> Duration {
    let mut v: Vec<Duration> = (0..n.max(1)).map(|_| f()).collect();
    v.sort_unstable();
    v[v.len() / 2]
}

/// Times one call.
pub(crate) fn time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

/// Nanoseconds as a float.
pub(crate) fn ns(d: Duration) -> f64 {
    d.as_nanos() as f64
}

/// The note every experiment prints about the machine it ran on.
pub(crate) fn machine_note(threads: usize) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads > cores {
        format!(
            "{cores} host cores; up to {threads} vCPU threads share them (more threads than cores: \
             a remote TLB flush waits for descheduled vCPUs)"
        )
    } else {
        format!("{cores} host cores")
    }
}
