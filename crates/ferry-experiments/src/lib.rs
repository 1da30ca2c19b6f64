//! ferry's experiments, for both backends. Each returns a
//! `ferry_report::Report` whose first table is shaped like its seed's, with
//! every ratio measured in the same run; `ferry bench ...` prints it and
//! writes JSON and an SVG.
//!
//! ```text
//!   soft::dirty_log      eager splitting vs split on fault (seed tables 1 and 2)
//!   soft::zap            present-only iteration vs full scan (the iterator seed)
//!   soft::write_protect  O(1) write-protect-all vs a walk, and harvest speed
//!   kvm::dirty_log       the kernel's dirty_log_perf_test shape, per KVM tracking mode
//!   demand_paging        postcopy's fault path: userfaultfd variants (kvm), shared
//!                        queue vs vCPU-direct exits (soft); the annotated-faults seed
//! ```
//!
//! Kept apart from the backends so that a backend is only a backend: the
//! soft MMU does not depend on the report crate, and the converge and
//! demand-paging benches join here. `ferry bench link` stays in the CLI,
//! because what it measures is `ferry demo` processes end to end.

#![warn(missing_docs)]

pub mod demand_paging;
pub mod kvm;
pub mod soft;

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
