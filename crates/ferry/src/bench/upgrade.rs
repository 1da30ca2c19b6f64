//! `ferry bench local`: same-host live upgrade (memory handed over as
//! memfd files) at growing memory sizes, and the same VM over TCP precopy
//! on loopback in the same run, for contrast.
//!
//! ```text
//!   per size: a kvm (or soft) memstress VM on memfd, 1 vCPU, writing at
//!   --rate-mib-s (a mostly idle guest: the pages it never touched stay
//!   holes in the memfd), warmed up, then moved in this process:
//!     local  migrate_local → receive_local over a UNIX socket
//!     tcp    migrate → receive over loopback (sizes up to --tcp-max)
//!   downtime: the source's pause to the destination's word that it runs
//!   each move is checked: digest, and the guest's own stamps after it
//!   each size moves --repeat times (a fresh VM each); the table gives the
//!   median, and where the median move's pause went
//! ```
//!
//! Named for what it measures: in this crate `local` is the engine's
//! same-host protocol and the `--local` flags that use it.

use crate::backend::BackendKind;
use crate::error::CmdError;
use clap::Args;
use ferry_engine::local::{
    await_local, listen_local, migrate_local, receive_local, LocalOptions, PausePhases,
};
use ferry_engine::{
    await_migration, listen, migrate, receive, MigrationSettings, NoProgress, Tunables,
};
use ferry_engine::{Outcome, ReceiveOptions, TcpDialer};
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::{KvmVm, Role};
use ferry_memstress::{MemstressProbe, VmConfig, Workload};
use ferry_report::{Plot, Report, Series, Table};
use ferry_soft::{Mechanisms, SoftVm};
use ferry_vm::{Backing, GuestRam, Vm};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `ferry bench local`.
#[derive(Args, Debug)]
pub struct LocalArgs {
    /// Backend of the guest.
    #[arg(long, default_value = "auto", value_parser = crate::args::BACKENDS)]
    pub backend: String,
    /// Guest memory sizes in GiB. A size the host's available memory
    /// cannot hold with 2 GiB to spare is skipped, with a note.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub sizes_gib: Vec<u64>,
    /// The largest size also moved over TCP for contrast (its destination
    /// needs memory of its own).
    #[arg(long, default_value_t = 4)]
    pub tcp_max_gib: u64,
    /// The guest's write rate in MiB/s.
    #[arg(long, default_value_t = 64)]
    pub rate_mib_s: u64,
    /// Moves per size, each with a fresh VM: the table gives the median
    /// (one move's downtime on this host varies widely: docs/results.md,
    /// "Same-host upgrade").
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,
    /// Seconds the guest runs before each move.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Print one JSON object as the last line of stdout: `sizes` (per
    /// size, the local moves' median, min and max downtime), `cells`
    /// (every local move) and `downtime_ratio` (the largest median over
    /// the smallest).
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html, the page that
    /// holds them all.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// One move.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// "local" or "tcp".
    pub how: String,
    /// Guest memory in GiB.
    pub mem_gib: u64,
    /// The guest's pause, ms.
    pub downtime_ms: f64,
    /// The whole move, ms.
    pub total_ms: f64,
    /// Hashing memory while the guest ran (local), ms.
    pub hash_ms: f64,
    /// Digest matched and the guest ran on without a stale page.
    pub verified: bool,
    /// Where the pause went (local moves).
    pub pause: Option<PausePhases>,
}

/// All moves of a run.
#[derive(Debug, Serialize)]
pub struct LocalResults {
    /// Backend of the guest.
    pub backend: String,
    /// Per size, the local moves' median.
    pub sizes: Vec<SizeStats>,
    /// Every move, in the order made.
    pub cells: Vec<Cell>,
    /// Sizes left out, and why.
    pub skipped: Vec<String>,
}

fn config(gib: u64, rate: u64) -> VmConfig {
    VmConfig {
        workload: Workload {
            vcpus: 1,
            bytes_per_vcpu: gib << 30,
            rate_limit_mib_s: Some(rate),
            ..Workload::default()
        },
        backing: Backing::Memfd,
    }
}

fn boot(kind: BackendKind, c: &VmConfig) -> Result<Box<dyn Vm>, CmdError> {
    Ok(match kind {
        BackendKind::Kvm => Box::new(
            KvmVm::new(c.clone(), DirtyTracking::Bitmap, Role::Source)
                .map_err(ferry_vm::VmError::from)?,
        ),
        BackendKind::Soft => Box::new(SoftVm::new_source(c.clone(), Mechanisms::default())?),
    })
}

fn on_ram(
    kind: BackendKind,
    c: &VmConfig,
    ram: GuestRam,
) -> Result<Box<dyn Vm>, ferry_vm::VmError> {
    Ok(match kind {
        BackendKind::Kvm => Box::new(KvmVm::on_ram(c.clone(), DirtyTracking::Bitmap, ram)?),
        BackendKind::Soft => Box::new(SoftVm::on_ram(c.clone(), Mechanisms::default(), ram)?),
    })
}

fn incoming(kind: BackendKind, c: &VmConfig) -> Result<Box<dyn Vm>, ferry_vm::VmError> {
    let c = VmConfig {
        backing: Backing::Anonymous,
        ..c.clone()
    };
    Ok(match kind {
        BackendKind::Kvm => Box::new(KvmVm::new(c, DirtyTracking::Bitmap, Role::Destination)?),
        BackendKind::Soft => Box::new(SoftVm::new_destination(c, Mechanisms::default())?),
    })
}

/// The guest ran on at the destination without counting a stale page.
fn runs_clean(vm: &dyn Vm) -> bool {
    use ferry_vm::GuestProbe;
    let Ok(before) = MemstressProbe.read(vm) else {
        return false;
    };
    std::thread::sleep(Duration::from_millis(300));
    MemstressProbe
        .read(vm)
        .is_ok_and(|after| after.errors == 0 && after.progress >= before.progress)
        && vm.check_health().is_ok()
}

fn move_local(a: &LocalArgs, kind: BackendKind, c: &VmConfig) -> Result<Cell, CmdError> {
    let fail = |e: ferry_engine::MigrationError| CmdError::Failed(e.chain());
    let socket =
        std::env::temp_dir().join(format!("ferry-bench-local-{}.sock", std::process::id()));
    let listener = listen_local(&socket).map_err(fail)?;
    let opts = {
        let mut o = LocalOptions::default();
        o.probe = Some(Arc::new(MemstressProbe));
        o
    };
    let dest_config = c.clone();
    let dest_opts = opts.clone();
    let dest = std::thread::spawn(move || {
        let inc = await_local(&listener, &dest_opts)?;
        let mut factory =
            |_: &ferry_engine::vmm::StreamHeader, ram| on_ram(kind, &dest_config, ram);
        let (vm, s) = receive_local(inc, &mut factory, &dest_opts)?;
        let clean = runs_clean(&*vm);
        Ok::<_, ferry_engine::MigrationError>((s, clean))
    });
    let mut vm = boot(kind, c)?;
    vm.start()?;
    std::thread::sleep(Duration::from_secs_f64(a.warmup));
    let moved = migrate_local(&mut *vm, &socket, &opts);
    let dest = dest
        .join()
        .map_err(|_| CmdError::Failed("the destination panicked".into()))?;
    let _ = std::fs::remove_file(&socket);
    let s = moved.map_err(fail)?;
    let (_, clean) = dest.map_err(fail)?;
    Ok(Cell {
        how: "local".into(),
        mem_gib: c.workload.bytes_per_vcpu >> 30,
        downtime_ms: s.downtime_ms,
        total_ms: s.total_ms,
        hash_ms: s.hash_ms,
        verified: s.digest_match && clean,
        pause: s.pause,
    })
}

fn move_tcp(a: &LocalArgs, kind: BackendKind, c: &VmConfig) -> Result<Cell, CmdError> {
    let fail = |e: ferry_engine::MigrationError| CmdError::Failed(e.chain());
    let listener = listen("127.0.0.1:0").map_err(|e| CmdError::Failed(e.to_string()))?;
    let to = TcpDialer(
        listener
            .local_addr()
            .map_err(|e| CmdError::Failed(e.to_string()))?
            .to_string(),
    );
    let dest_config = c.clone();
    let dest = std::thread::spawn(move || {
        let inc = await_migration(&listener, None)?;
        let mut factory = |_: &ferry_engine::vmm::StreamHeader| incoming(kind, &dest_config);
        let (vm, s) = receive(inc, &listener, &mut factory, &ReceiveOptions::default())?;
        let clean = runs_clean(&*vm);
        Ok::<_, ferry_engine::MigrationError>((s, clean))
    });
    // Anonymous memory, as a VM moved over the network has: reading a
    // page it never touched maps the zero page, where a memfd hole would
    // be allocated (which takes seconds per GiB here).
    let anon = VmConfig {
        backing: Backing::Anonymous,
        ..c.clone()
    };
    let mut vm = boot(kind, &anon)?;
    vm.start()?;
    std::thread::sleep(Duration::from_secs_f64(a.warmup));
    let opts = MigrationSettings::default()
        .options(Tunables::shared(), Some(Arc::new(MemstressProbe)))
        .map_err(|e| CmdError::Usage(e.to_string()))?;
    let moved = migrate(&mut *vm, &to, &opts, &NoProgress);
    let dest = dest
        .join()
        .map_err(|_| CmdError::Failed("the destination panicked".into()))?;
    let s = moved.map_err(fail)?;
    let (_, clean) = dest.map_err(fail)?;
    Ok(Cell {
        how: "tcp".into(),
        mem_gib: c.workload.bytes_per_vcpu >> 30,
        downtime_ms: s.downtime_ms,
        total_ms: s.total_ms,
        hash_ms: 0.0,
        verified: s.status == Outcome::Completed && s.digest_match && clean,
        pause: None,
    })
}

/// Memory the host can give, in bytes (MemAvailable; unlimited where
/// `/proc/meminfo` cannot be read).
pub(crate) fn available() -> u64 {
    ferry_vm::admission::HostMemory::read().map_or(u64::MAX, |m| m.available)
}

/// Runs the moves.
pub fn run(a: &LocalArgs) -> Result<Report<LocalResults>, CmdError> {
    if a.sizes_gib.is_empty() || a.sizes_gib.contains(&0) {
        return Err(CmdError::Usage("--sizes-gib: positive sizes in GiB".into()));
    }
    let kind: BackendKind = a.backend.parse().map_err(CmdError::Usage)?;
    let mut cells = Vec::new();
    let mut skipped = Vec::new();
    for &gib in &a.sizes_gib {
        let c = config(gib, a.rate_mib_s);
        // The guest touches little, but a host that cannot hold the memory
        // once over with room to spare should not be asked to.
        if (gib << 30) + (2 << 30) > available() {
            skipped.push(format!(
                "{gib} GiB: the host has {} GiB available",
                available() >> 30
            ));
            continue;
        }
        for i in 1..=a.repeat {
            eprintln!("ferry: {gib} GiB, local, move {i} of {} ...", a.repeat);
            cells.push(move_local(a, kind, &c)?);
        }
        if gib <= a.tcp_max_gib {
            eprintln!("ferry: {gib} GiB, tcp precopy ...");
            cells.push(move_tcp(a, kind, &c)?);
        }
    }
    Ok(report(a, cells, skipped))
}

/// The local moves of one size.
#[derive(Clone, Debug, Serialize)]
pub struct SizeStats {
    /// Guest memory in GiB.
    pub mem_gib: u64,
    /// Moves made.
    pub moves: usize,
    /// Their downtime: median, min and max, ms.
    pub median_ms: f64,
    /// The shortest.
    pub min_ms: f64,
    /// The longest.
    pub max_ms: f64,
    /// Every move verified.
    pub verified: bool,
    /// Where the median move's pause went.
    pub pause: Option<PausePhases>,
}

/// The local moves grouped by size, in the order made.
pub fn by_size(cells: &[Cell]) -> Vec<SizeStats> {
    let mut sizes: Vec<u64> = Vec::new();
    for c in cells.iter().filter(|c| c.how == "local") {
        if !sizes.contains(&c.mem_gib) {
            sizes.push(c.mem_gib);
        }
    }
    sizes
        .into_iter()
        .map(|gib| {
            let mut moves: Vec<&Cell> = cells
                .iter()
                .filter(|c| c.how == "local" && c.mem_gib == gib)
                .collect();
            moves.sort_by(|a, b| a.downtime_ms.total_cmp(&b.downtime_ms));
            let median = moves[moves.len() / 2];
            SizeStats {
                mem_gib: gib,
                moves: moves.len(),
                median_ms: median.downtime_ms,
                min_ms: moves[0].downtime_ms,
                max_ms: moves[moves.len() - 1].downtime_ms,
                verified: moves.iter().all(|c| c.verified),
                pause: median.pause.clone(),
            }
        })
        .collect()
}

/// The largest median downtime over the smallest (the goal: at most 2).
pub fn downtime_ratio(sizes: &[SizeStats]) -> Option<f64> {
    let medians = sizes.iter().map(|s| s.median_ms);
    let max = medians.clone().reduce(f64::max)?;
    let min = medians.reduce(f64::min)?;
    Some(max / min.max(1e-3))
}

fn report(a: &LocalArgs, cells: Vec<Cell>, skipped: Vec<String>) -> Report<LocalResults> {
    let sizes = by_size(&cells);
    let mut table = Table::new(
        format!(
            "same-host upgrade (memfd handed over) vs TCP precopy on loopback, {} guest writing {} MiB/s, same run",
            a.backend, a.rate_mib_s
        ),
        &[
            "how", "GiB", "moves", "downtime ms (median)", "min", "max", "verified",
        ],
    );
    for s in &sizes {
        table.row(vec![
            "local".into(),
            s.mem_gib.to_string(),
            s.moves.to_string(),
            format!("{:.2}", s.median_ms),
            format!("{:.2}", s.min_ms),
            format!("{:.2}", s.max_ms),
            if s.verified { "yes" } else { "NO" }.into(),
        ]);
    }
    for c in cells.iter().filter(|c| c.how == "tcp") {
        table.row(vec![
            "tcp".into(),
            c.mem_gib.to_string(),
            "1".into(),
            format!("{:.2}", c.downtime_ms),
            "-".into(),
            "-".into(),
            if c.verified { "yes" } else { "NO" }.into(),
        ]);
    }
    if let Some(r) = downtime_ratio(&sizes) {
        table.note(format!(
            "local downtime, the largest median over the smallest: {r:.2}x (the goal: flat, at most 2x)"
        ));
    }
    table.note("local: the destination maps the source's memfd files (SCM_RIGHTS); only vCPU and device state travel. Both ends hash memory while the guest runs and rehash only pages dirtied since at the pause.");
    table.note("tcp: the same VM on anonymous memory (a memfd's untouched pages would be allocated as precopy reads them), moved by precopy over loopback to a destination in this process.");
    table.note("verified: the digests at the pause match, and the guest's own stamp checks find no stale page for 0.3 s after it.");
    for s in &skipped {
        table.note(format!("skipped {s}"));
    }
    let mut phases = Table::new(
        "where the median local move's pause went, ms (source's clock)",
        &[
            "GiB",
            "stop",
            "save",
            "harvest",
            "rehash",
            "destination",
            "resume",
        ],
    );
    for s in &sizes {
        if let Some(p) = &s.pause {
            phases.row(vec![
                s.mem_gib.to_string(),
                format!("{:.2}", p.stop_ms),
                format!("{:.2}", p.save_ms),
                format!("{:.2}", p.harvest_ms),
                format!("{:.2}", p.rehash_ms),
                format!("{:.2}", p.destination_ms),
                format!("{:.2}", p.resume_ms),
            ]);
        }
    }
    phases.note("stop: pausing the vCPUs and reading the guest's checks; save: devices and vCPUs; harvest: the dirty logs' last read; rehash: pages dirtied since the last rehash; destination: its rehash, load and digest check; resume: Go to the destination's word that the guest runs.");
    let mut series = vec![Series {
        label: "local downtime (median)".into(),
        points: sizes
            .iter()
            .map(|s| (s.mem_gib as f64, s.median_ms))
            .collect(),
    }];
    series.push(Series {
        label: "tcp downtime".into(),
        points: cells
            .iter()
            .filter(|c| c.how == "tcp")
            .map(|c| (c.mem_gib as f64, c.downtime_ms))
            .collect(),
    });
    Report {
        name: "local".into(),
        tables: vec![table, phases],
        results: LocalResults {
            backend: a.backend.clone(),
            sizes,
            cells,
            skipped,
        },
        charts: vec![Plot {
            title: "downtime against guest memory".into(),
            x_label: "guest memory (GiB)".into(),
            y_label: "downtime (ms)".into(),
            log_y: true,
            references: Vec::new(),
            series,
        }
        .into()],
    }
}

/// The `--json` line: per size the local moves' median, every local move,
/// and the largest median over the smallest.
pub fn summary_json(r: &LocalResults) -> serde_json::Value {
    serde_json::json!({
        "sizes": r.sizes,
        "cells": r.cells.iter().filter(|c| c.how == "local").collect::<Vec<_>>(),
        "downtime_ratio": downtime_ratio(&r.sizes),
        "tcp": r.cells.iter().filter(|c| c.how == "tcp").collect::<Vec<_>>(),
        "skipped": r.skipped,
    })
}

/// `ferry bench local`: runs it, prints its tables and writes its files
/// ([`super::output`]), and with `--json` ends with its summary line;
/// fails unless every move verified.
pub fn run_and_print(a: &LocalArgs) -> Result<ExitCode, CmdError> {
    let report = run(a)?;
    let code = super::output::emit(&report, &a.out)?;
    if a.json {
        println!("{}", summary_json(&report.results));
    }
    let all_verified = report.results.cells.iter().all(|c| c.verified);
    Ok(if all_verified {
        code
    } else {
        ExitCode::FAILURE
    })
}
