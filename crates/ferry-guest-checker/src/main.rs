//! The guest's own checks, from inside a Linux guest: it runs as the
//! initramfs's `/init` (or as a plain program, for its tests) and
//!
//! - writes a pattern into `checker.mib` MiB per vCPU, each page holding
//!   its number and a generation, from one thread per online CPU, and
//!   verifies every page before rewriting it with the next generation;
//! - samples `CLOCK_MONOTONIC` in each of those threads and keeps the
//!   largest gap between two samples: the pause the guest itself saw;
//! - prints one numbered line a second on its console
//!   (`checker SEQ gen=.. pages=.. mismatches=.. max_gap_ms=..`), and a
//!   last line `checker done ...` before it powers the guest off after
//!   `checker.secs` seconds (0: never).
//!
//! It reads its settings from the kernel command line (`checker.mib=64
//! checker.secs=60`), or from the environment (`CHECKER_MIB`,
//! `CHECKER_SECS`) when it is not PID 1. The workspace builds it as a
//! static binary, so the initramfs needs nothing else.

mod pattern;
mod pid1;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What every worker thread publishes.
#[derive(Default)]
struct Counters {
    pages: AtomicU64,
    mismatches: AtomicU64,
    generations: AtomicU64,
    max_gap_ns: AtomicU64,
}

fn setting(name: &str, default: u64) -> u64 {
    let from_cmdline = std::fs::read_to_string("/proc/cmdline").ok().and_then(|c| {
        c.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("checker.{name}="))?.parse().ok())
    });
    let env = std::env::var(format!("CHECKER_{}", name.to_uppercase()))
        .ok()
        .and_then(|v| v.parse().ok());
    from_cmdline.or(env).unwrap_or(default)
}

fn main() {
    let init = std::process::id() == 1;
    if init {
        pid1::mount_basics();
    }
    let mib = setting("mib", 64);
    let secs = setting("secs", 0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let counters: Arc<Vec<Counters>> =
        Arc::new((0..threads).map(|_| Counters::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    println!(
        "checker start: {threads} threads x {mib} MiB, kernel {}",
        pid1::kernel_release()
    );
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let counters = Arc::clone(&counters);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || pattern::run(t as u64, mib << 20, &counters[t], &stop))
        })
        .collect();
    let start = Instant::now();
    let mut seq = 0u64;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        seq += 1;
        let line = summary(&counters);
        println!("checker {seq} {line}");
        if secs != 0 && start.elapsed() >= Duration::from_secs(secs) {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = w.join();
    }
    println!("checker done {}", summary(&counters));
    if init {
        pid1::power_off();
    }
}

fn summary(counters: &[Counters]) -> String {
    let sum = |f: fn(&Counters) -> &AtomicU64| -> u64 {
        counters.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
    };
    let max_gap = counters
        .iter()
        .map(|c| c.max_gap_ns.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    format!(
        "gen={} pages={} mismatches={} max_gap_ms={:.1}",
        sum(|c| &c.generations),
        sum(|c| &c.pages),
        sum(|c| &c.mismatches),
        max_gap as f64 / 1e6
    )
}
