//! The guest's own checks, from inside a Linux guest: it runs as the
//! initramfs's `/init` (or is started by it, or runs as a plain program
//! for its tests) and
//!
//! - writes a pattern into `checker.mib` MiB per vCPU, each page holding
//!   its number and a generation, from one thread per online CPU, and
//!   verifies every page before rewriting it with the next generation
//!   (each region is faulted in before the first line, so the pattern
//!   rewrites memory the guest already has, as a hot set does); at
//!   most `checker.rate_mib` MiB/s in all (0, the default: as fast as it
//!   can), so that a benchmark can dirty memory at a set rate;
//! - samples `CLOCK_MONOTONIC` in each of those threads, after every page
//!   it writes and while it waits on its rate, and keeps the largest gap
//!   between two samples: the pause the guest itself saw (a thread that
//!   is only slowed, by a dirty quota, say, shows as slow, not paused);
//!   each line also lists the window's longest gaps with when each ended,
//!   so that a host that knows when it paused the guest can tell the gap
//!   of its pause from a throttle's just before;
//! - appends numbered, checksummed records to the disk `checker.disk`
//!   (default `/dev/vda`, where it exists), each read back;
//! - reads the kernel log and passes on every warning: those logged while
//!   it runs (`checker-warning: ...`), and those the kernel logged as it
//!   booted (`checker-boot-warning: ...`), which come from the CPU and
//!   machine the guest was given, not from anything done to it since;
//! - prints one numbered, checksummed line a second on its console
//!   ([`ferry_guest_checker::line`]), and a last line `checker done ...`
//!   before it powers the guest off.
//!
//! With `checker.sched=1` each numbered line is followed by one that says
//! what the guest's scheduler did to each worker in that second (`sched`).
//!
//! It stops `checker.secs` seconds after it started (0: never), or
//! `checker.after_move` seconds after a line `moved` arrives on its
//! console: how a VMM that moved the guest lets it run on, then end.
//! With `checker.crash_after_move=1` it panics the kernel instead, as soon
//! as it is told it moved: a guest that dies after a move, for the test
//! that a VMM reports it as a failed migration.
//!
//! Settings come from the kernel command line (`checker.mib=64`), or from
//! the environment (`CHECKER_MIB`) when it is not there. The workspace
//! builds it as a static binary, so the initramfs needs nothing else.

mod console;
mod disk;
mod kmsg;
mod pattern;
mod pid1;
mod sched;

use console::say;
use ferry_guest_checker::line::{
    Gap, Line, BOOT_WARNING_PREFIX, DONE_PREFIX, NOTED_GAPS, WARNING_PREFIX,
};
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What every worker thread publishes.
#[derive(Default)]
struct Counters {
    pages: AtomicU64,
    mismatches: AtomicU64,
    generations: AtomicU64,
    max_gap_ns: AtomicU64,
    /// The largest gap since the main loop last took it.
    window_gap_ns: AtomicU64,
    /// The longest gaps since the main loop last took them: when each
    /// ended, and its length in ns.
    window_gaps: Mutex<Vec<(Instant, u64)>>,
    /// Set once the worker's region is in memory: its pattern starts.
    ready: AtomicBool,
    /// The worker thread's id, for `checker.sched`.
    tid: AtomicU64,
}

fn cmdline_setting(name: &str) -> Option<String> {
    let cmdline = std::fs::read_to_string("/proc/cmdline").ok()?;
    cmdline.split_whitespace().find_map(|w| {
        w.strip_prefix(&format!("checker.{name}="))
            .map(String::from)
    })
}

fn setting(name: &str) -> Option<String> {
    cmdline_setting(name).or_else(|| std::env::var(format!("CHECKER_{}", name.to_uppercase())).ok())
}

fn number(name: &str, default: u64) -> u64 {
    setting(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let init = std::process::id() == 1;
    if init {
        pid1::mount_basics();
    }
    console::stop_echo();
    let mib = number("mib", 64);
    let secs = number("secs", 0);
    let after_move = number("after_move", 10);
    let crash_after_move = number("crash_after_move", 0) != 0;
    let sched_lines = number("sched", 0) != 0;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rate = (number("rate_mib", 0) << 20) / threads as u64;
    let counters: Arc<Vec<Counters>> =
        Arc::new((0..threads).map(|_| Counters::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let disk_path = setting("disk").unwrap_or_else(|| "/dev/vda".into());
    let disk = match std::path::Path::new(&disk_path).exists() {
        true => disk::open(&disk_path),
        false => None,
    };
    say(&format!(
        "checker start: {threads} threads x {mib} MiB at {}, disk {}, kernel {}",
        match rate {
            0 => "full speed".to_string(),
            r => format!("{} MiB/s each", r >> 20),
        },
        disk.as_ref().map_or("none".to_string(), |(_, b)| format!(
            "{disk_path} ({b} blocks)"
        )),
        pid1::kernel_release()
    ));
    let mut workers: Vec<_> = (0..threads)
        .map(|t| {
            let counters = Arc::clone(&counters);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || pattern::run(t as u64, mib << 20, rate, &counters[t], &stop))
        })
        .collect();
    let disk_counters = Arc::new(disk::DiskCounters::default());
    if let Some((file, blocks)) = disk {
        let (c, stop) = (Arc::clone(&disk_counters), Arc::clone(&stop));
        let pace = Duration::from_millis(number("disk_pace_ms", 20));
        workers.push(std::thread::spawn(move || {
            disk::run(file, blocks, pace, &c, &stop)
        }));
    }
    let warnings = Arc::new(Mutex::new(Vec::new()));
    {
        let (w, stop) = (Arc::clone(&warnings), Arc::clone(&stop));
        let start_us = kmsg::now_us();
        workers.push(std::thread::spawn(move || kmsg::run(&w, start_us, &stop)));
    }
    let moved = Arc::new(Mutex::new(None::<Instant>));
    {
        // Not joined: it waits on the console for as long as there is one.
        let moved = Arc::clone(&moved);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                if line.trim() == "moved" {
                    *moved.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                }
            }
        });
    }

    // The lines start once every region is in memory, so that what a
    // migration moves is a hot set being rewritten, not a guest faulting
    // fresh memory in (a guest kernel with transparent huge pages zeroes 2
    // MiB at a fault: one write of the pattern dirtying 512 pages).
    while !counters.iter().all(|c| c.ready.load(Ordering::Acquire)) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let tasks = || -> Vec<sched::TaskTimes> {
        counters
            .iter()
            .map(|c| sched::task(c.tid.load(Ordering::Relaxed)).unwrap_or_default())
            .collect()
    };
    let (mut tasks_before, mut steal_before) = (tasks(), sched::steal());
    let mut ipis_before = sched::ipis();
    let start = Instant::now();
    let mut seq = 0u64;
    let (mut seen, mut warned) = (0usize, 0u64);
    let mut said_moved = false;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        seq += 1;
        {
            let found = warnings.lock().unwrap_or_else(|e| e.into_inner());
            for w in &found[seen..] {
                match w.at_boot {
                    true => say(&format!("{BOOT_WARNING_PREFIX}{}", w.text)),
                    false => {
                        say(&format!("{WARNING_PREFIX}{}", w.text));
                        warned += 1;
                    }
                }
            }
            seen = found.len();
        }
        let mut line = summary(seq, &counters, &disk_counters, warned, true);
        // The gaps first: the clock then reads after every gap listed ends.
        line.gaps = window_gaps(&counters, start);
        line.clock_ms = start.elapsed().as_secs_f64() * 1e3;
        say(&line.format());
        if sched_lines {
            let (now, steal, ipis) = (tasks(), sched::steal(), sched::ipis());
            say(&sched::line(
                seq,
                &tasks_before,
                &now,
                (&steal_before, &steal),
                (ipis_before, ipis),
            ));
            (tasks_before, steal_before, ipis_before) = (now, steal, ipis);
        }
        let moved_at = *moved.lock().unwrap_or_else(|e| e.into_inner());
        if moved_at.is_some() && crash_after_move {
            say("checker moved: crashing the kernel, as checker.crash_after_move asks");
            pid1::crash_kernel();
        }
        if moved_at.is_some() && !said_moved {
            say(&format!("checker moved: running {after_move} s more"));
            said_moved = true;
        }
        let moved_done = moved_at.is_some_and(|at| at.elapsed() >= Duration::from_secs(after_move));
        if (secs != 0 && start.elapsed() >= Duration::from_secs(secs)) || moved_done {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = w.join();
    }
    let mut last = summary(seq, &counters, &disk_counters, warned, false);
    last.clock_ms = start.elapsed().as_secs_f64() * 1e3;
    say(&format!("{DONE_PREFIX}{}", last.format()));
    if init {
        pid1::power_off();
    }
}

/// The longest gaps every worker noted since the last line (taken), on
/// the scale of the line's clock (`start`), in the order they ended.
fn window_gaps(counters: &[Counters], start: Instant) -> Vec<Gap> {
    let mut all: Vec<(Instant, u64)> = counters
        .iter()
        .flat_map(|c| std::mem::take(&mut *c.window_gaps.lock().unwrap_or_else(|e| e.into_inner())))
        .collect();
    all.sort_by_key(|&(_, ns)| std::cmp::Reverse(ns));
    all.truncate(NOTED_GAPS);
    all.sort_by_key(|&(end, _)| end);
    all.into_iter()
        .map(|(end, ns)| Gap {
            end_ms: end.saturating_duration_since(start).as_secs_f64() * 1e3,
            ms: ns as f64 / 1e6,
        })
        .collect()
}

/// The line numbered `seq` from the counters; `take_window` resets the
/// gap since the last line.
fn summary(
    seq: u64,
    counters: &[Counters],
    disk: &disk::DiskCounters,
    warnings: u64,
    take_window: bool,
) -> Line {
    let sum = |f: fn(&Counters) -> &AtomicU64| -> u64 {
        counters.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
    };
    let max = |f: fn(&Counters) -> &AtomicU64| -> u64 {
        counters
            .iter()
            .map(|c| match take_window {
                true => f(c).swap(0, Ordering::Relaxed),
                false => f(c).load(Ordering::Relaxed),
            })
            .max()
            .unwrap_or(0)
    };
    let max_gap = counters
        .iter()
        .map(|c| c.max_gap_ns.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    Line {
        seq,
        generations: sum(|c| &c.generations),
        pages: sum(|c| &c.pages),
        mismatches: sum(|c| &c.mismatches),
        max_gap_ms: max_gap as f64 / 1e6,
        gap_ms: max(|c| &c.window_gap_ns) as f64 / 1e6,
        disk_writes: disk.writes.load(Ordering::Relaxed),
        disk_bad_reads: disk.bad_reads.load(Ordering::Relaxed)
            + disk.errors.load(Ordering::Relaxed),
        warnings,
        clock_ms: 0.0,
        gaps: Vec::new(),
    }
}
