//! `ferry bench snapshot`: a live snapshot of a guest, then its restore
//! in each mode from the same file, with the guest's first second after
//! each restore against the same guest's second before the snapshot.
//!
//! ```text
//!   per cell (guest size x idle/writing), one boot:
//!     a memstress guest, 2 vCPUs, data written once at boot (text fill),
//!     a hot set of --hot-percent of its memory visited in random order at
//!     --rate-limit MiB/s per vCPU (writing: every visit writes; idle:
//!     writes off after the warm-up, so it only reads)
//!     snapshot: saved live to a file; the guest runs on from the pause
//!     baseline: its accesses in its first second after the pause; the
//!     source ends
//!     restore, eager / lazy / lazy-working-set, each from that file:
//!       first instruction, working set resident, all resident, faults that
//!       held a vCPU, and its accesses in its first second / the baseline's
//!       (both from the same point of the guest's rate schedule)
//!       each restored guest runs on until every vCPU finished a pass:
//!       digest and the guest's own stamp checks
//! ```
//!
//! Why a hot set in random order: a guest's recent writes predict its next
//! touches only where it keeps coming back to the same pages, which is
//! what a real guest's working set is. A sequential loop over all memory
//! would make the oldest writes the next ones.

mod report;

use crate::args::BackendArgs;
use crate::demo::snapshot::{failed, restore_and_start, Started};
use crate::error::CmdError;
use crate::vms::{self, Role};
use clap::Args;
use ferry_engine::choices::ConvergeMode;
use ferry_engine::snapshot::{self, RestoreMode, SnapshotOptions, SnapshotSummary, Steering};
use ferry_engine::{NoProgress, Tunables};
use ferry_memstress::{read_progress, set_write_percent, AccessOrder, Fill, MemstressProbe};
use ferry_memstress::{VmConfig, Workload};
use ferry_vm::{error_chain as chain, GuestProbe, Vm};
use report::{Cell, RestoreCell, Restores};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Arguments of `ferry bench snapshot`.
#[derive(Args, Debug)]
pub struct SnapshotArgs {
    /// Which backend runs the guests, and how.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Guest memory sizes in MiB (each a multiple of 4 MiB: two vCPUs'
    /// regions of whole 2 MiB pages). A size the host cannot hold with
    /// 2 GiB to spare is skipped, with a note.
    #[arg(long = "sizes-mib", value_delimiter = ',', default_value = "1024,4096")]
    pub sizes_mib: Vec<u64>,
    /// The guests at each size: idle (reads its hot set, writes nothing),
    /// writing (writes its hot set).
    #[arg(long, value_delimiter = ',', default_value = "idle,writing",
          value_parser = ["idle", "writing"])]
    pub cells: Vec<String>,
    /// Percentage of its memory the guest keeps visiting (its hot set).
    #[arg(long = "hot-percent", default_value_t = 10,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub hot_percent: u8,
    /// Each vCPU's visits to its hot set, in MiB/s of pages.
    #[arg(long = "rate-limit", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub rate_limit_mib_s: u64,
    /// Cap the snapshot's writes at this many MiB/s, as a slow disk would
    /// (the bandwidth cap that paces them; 0: none). A writing guest that
    /// outruns it is what the convergence policies are for.
    #[arg(long = "file-cap-mib-s", default_value_t = 0)]
    pub file_cap_mib_s: u64,
    /// The convergence policies to snapshot each guest under (none, auto,
    /// quota, dirty-limit). The first one's file is restored; each other
    /// one snapshots the same guest again right after, in the same run, for
    /// its pause and rounds alone. Default: the best the VM serves.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(ConvergeMode))]
    pub converge: Vec<ConvergeMode>,
    /// Snapshot each guest once more right after, with its proof made
    /// inside the pause (as before the memory was frozen for it), for that
    /// snapshot's pause alone: the baseline of the frozen proof, same run.
    #[arg(long)]
    pub proof_in_pause_too: bool,
    /// Snapshot each guest once more right after with the VM's access log
    /// off, so that its working set is what the dirty logs saw written, and
    /// restore that file lazily with its working set first too: the
    /// baseline of the access log, same run (only a VM that keeps one, the
    /// soft backend, differs).
    #[arg(long)]
    pub access_log_off_too: bool,
    /// Directory for the snapshot files (one at a time, removed after its
    /// cell).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Drop the file from the page cache before each restore, so that the
    /// restore reads it from the disk, as after a host's reboot (default:
    /// the restores read what the snapshot just wrote, from memory).
    #[arg(long)]
    pub cold: bool,
    /// Print one JSON object as the last line of stdout: `{"cells": [...]}`,
    /// each cell with `guest_mib`, `writing`, `snapshot` and
    /// `restore.{eager, lazy, lazy_working_set}`.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// The guests of one size: two vCPUs, text in every page, a hot set.
fn config(a: &SnapshotArgs, mib: u64) -> Result<VmConfig, CmdError> {
    let workload = Workload {
        vcpus: 2,
        bytes_per_vcpu: (mib / 2) << 20,
        write_percent: 100,
        order: AccessOrder::Random,
        rate_limit_mib_s: Some(a.rate_limit_mib_s),
        fill: Fill::Text,
        hot_percent: a.hot_percent,
        ..Workload::default()
    };
    workload
        .validate()
        .map_err(|e| CmdError::Usage(format!("--sizes-mib {mib}: {e}")))?;
    Ok(VmConfig {
        workload,
        backing: a.backend.backing(),
    })
}

/// The guest's page accesses so far, all vCPUs.
fn accesses(vm: &dyn Vm) -> Result<u64, CmdError> {
    let p = read_progress(vm.ram(), vm.vcpus()).map_err(|e| CmdError::Failed(e.to_string()))?;
    Ok(p.iter().map(|v| v.accesses).sum())
}

/// The guest's accesses over `d` of running, its health watched.
fn accesses_over(vm: &dyn Vm, d: Duration) -> Result<u64, CmdError> {
    let before = accesses(vm)?;
    let end = Instant::now() + d;
    while Instant::now() < end {
        vm.check_health()?;
        std::thread::sleep(Duration::from_millis(20).min(end - Instant::now()));
    }
    Ok(accesses(vm)? - before)
}

/// One cell: boot, baseline, snapshot, and the three restores.
fn run_cell(a: &SnapshotArgs, mib: u64, writing: bool, file: &Path) -> Result<Cell, CmdError> {
    let kind = a.backend.kind();
    let config = config(a, mib)?;
    let what = if writing { "writing" } else { "idle" };
    eprintln!("ferry: {mib} MiB {what} guest: booting and warming up ...");
    let mut vm = vms::create(kind, &config, &a.backend, Role::Source)?;
    vm.start()?;
    crate::driver::warm_up(&*vm, Duration::ZERO)?;
    if !writing {
        set_write_percent(vm.ram(), vm.vcpus(), 0).map_err(|e| CmdError::Failed(e.to_string()))?;
    }
    // Its dirty rate settles before the snapshot.
    accesses_over(&*vm, Duration::from_millis(500))?;

    eprintln!("ferry: {mib} MiB {what} guest:");
    let policies: Vec<Option<ConvergeMode>> = match a.converge.as_slice() {
        [] => vec![None],
        list => list.iter().copied().map(Some).collect(),
    };
    let saved = save(a, &mut *vm, file, policies[0], true, true)?;
    // The same guest not restored: it runs on from the pause here. Its
    // schedule has the same debt from the snapshot's rounds as the
    // restored guests' (and the pause's more: its clock ran on).
    let baseline = accesses_over(&*vm, Duration::from_secs(1))?;
    let source = MemstressProbe
        .read(&*vm)
        .map_err(|e| CmdError::Failed(chain(&e)))?;
    if source.errors != 0 {
        return Err(CmdError::Failed(format!(
            "the guest found {} stale pages before its restores",
            source.errors
        )));
    }
    // The other policies, on the same guest running on, for their
    // snapshots alone.
    let mut also = Vec::new();
    let in_pause = a.proof_in_pause_too.then_some((policies[0], false));
    let others = policies[1..].iter().map(|&p| (p, true));
    for (policy, after_pause) in others.chain(in_pause) {
        let alt = file.with_extension("also.snap");
        let s = save(a, &mut *vm, &alt, policy, after_pause, true);
        let _ = std::fs::remove_file(&alt);
        also.push(s?);
    }
    let writes_only = file.with_extension("writes-only.snap");
    let writes_only_saved = match a.access_log_off_too {
        true => Some(save(a, &mut *vm, &writes_only, policies[0], true, false)),
        false => None,
    };
    drop(vm);
    let writes_only_saved = writes_only_saved.transpose().inspect_err(|_| {
        let _ = std::fs::remove_file(&writes_only);
    })?;

    let restore = |file: &Path, mode: RestoreMode| {
        eprintln!(
            "ferry: {mib} MiB {what} guest: restoring {} {} ...",
            file.display(),
            mode.name()
        );
        if a.cold {
            drop_from_page_cache(file)?;
        }
        restore_once(a, file, mode, baseline)
    };
    let restores = (|| {
        Ok::<_, CmdError>(Restores {
            eager: restore(file, RestoreMode::Eager)?,
            lazy: restore(file, RestoreMode::Lazy)?,
            lazy_working_set: restore(file, RestoreMode::LazyWorkingSet)?,
            lazy_working_set_writes_only: match &writes_only_saved {
                Some(_) => Some(restore(&writes_only, RestoreMode::LazyWorkingSet)?),
                None => None,
            },
        })
    })();
    let _ = std::fs::remove_file(&writes_only);
    let cell = Cell::new(mib, writing, a.cold, baseline, &saved, restores?).with_also(&also);
    Ok(match &writes_only_saved {
        Some(s) => cell.with_writes_only(s),
        None => cell,
    })
}

/// One live snapshot of `vm` to `file` under `policy`, its writes capped
/// at `--file-cap-mib-s`, its proof after the pause where it can be, and
/// its working set with the VM's access log where `access_log`.
fn save(
    a: &SnapshotArgs,
    vm: &mut dyn Vm,
    file: &Path,
    policy: Option<ConvergeMode>,
    proof_after_pause: bool,
    access_log: bool,
) -> Result<SnapshotSummary, CmdError> {
    let tunables = Tunables::shared();
    tunables.set_bandwidth_bytes_per_sec(a.file_cap_mib_s << 20);
    let steering = Steering {
        progress: &NoProgress,
        tunables,
    };
    let mut opts = SnapshotOptions::default();
    opts.converge = policy;
    opts.proof_after_pause = proof_after_pause;
    opts.access_log = access_log;
    eprintln!(
        "ferry: saving it live to {} (policy {}) ...",
        file.display(),
        policy.map_or("default".into(), |p| p.to_string())
    );
    snapshot::save_steered(vm, file, &opts, &steering).map_err(failed("the snapshot failed"))
}

/// Asks the kernel to drop `file`'s pages from the page cache (they are
/// clean: the snapshot synced them), so the next read comes from disk.
fn drop_from_page_cache(file: &Path) -> Result<(), CmdError> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(file)
        .map_err(|e| CmdError::Failed(format!("cannot open {}: {e}", file.display())))?;
    // SAFETY: posix_fadvise on a file descriptor this function owns, over
    // the whole file; it only advises the kernel and touches no memory.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    match rc {
        0 => Ok(()),
        e => Err(CmdError::Failed(format!(
            "cannot drop {} from the page cache: {}",
            file.display(),
            std::io::Error::from_raw_os_error(e)
        ))),
    }
}

/// Restores the file in `mode`, runs the guest a second and then on until
/// every vCPU finished a pass, and checks it.
fn restore_once(
    a: &SnapshotArgs,
    file: &Path,
    mode: RestoreMode,
    baseline: u64,
) -> Result<RestoreCell, CmdError> {
    let Started {
        mut vm,
        restoring,
        at_restore,
        first_instruction_ms,
    } = restore_and_start(file, &a.backend, mode, true)?;
    let first_second = accesses_over(&*vm, Duration::from_secs(1))?;
    let summary = restoring
        .finish(&mut *vm)
        .map_err(failed("the restore failed"))?;
    let after = crate::guest_check::after_switchover(&*vm, at_restore, Duration::ZERO);
    Ok(RestoreCell {
        first_instruction_ms,
        working_set_ms: summary.working_set_ms,
        resident_ms: summary.resident_ms,
        blocking_faults: summary.blocking_faults,
        fault_pages: summary.fault_pages,
        accesses_first_s: first_second,
        progress_first_s: first_second as f64 / baseline.max(1) as f64,
        digest_match: summary.digest_match,
        mismatches: at_restore.errors + after.since_resume.errors,
        passes_after: after.since_resume.progress,
        problem: after.problem,
    })
}

/// Runs every cell.
pub fn run(a: &SnapshotArgs) -> Result<ferry_report::Report<report::Results>, CmdError> {
    if a.sizes_mib.is_empty() || a.sizes_mib.iter().any(|m| *m == 0 || m % 4 != 0) {
        return Err(CmdError::Usage(
            "--sizes-mib: positive sizes in MiB, each a multiple of 4".into(),
        ));
    }
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| CmdError::Failed(format!("cannot create --dir {}: {e}", dir.display())))?;
    let file = dir.join(format!("ferry-bench-{}.snap", std::process::id()));
    let mut cells = Vec::new();
    let mut skipped = Vec::new();
    for &mib in &a.sizes_mib {
        // The source and then each restored guest, one at a time; the
        // file's pages in the page cache can be given back.
        let available = crate::bench::upgrade::available();
        if (mib << 20) + (2 << 30) > available {
            skipped.push(format!(
                "{mib} MiB: the host has {} MiB available",
                available >> 20
            ));
            continue;
        }
        for cell in &a.cells {
            let result = run_cell(a, mib, cell == "writing", &file);
            let _ = std::fs::remove_file(&file);
            cells.push(result?);
        }
    }
    Ok(report::report(a, cells, skipped))
}

/// `ferry bench snapshot`: runs it, prints its tables and writes its files
/// ([`super::output`]), and with `--json` ends with `{"cells": [...]}`;
/// fails unless every restore verified.
pub fn run_and_print(a: &SnapshotArgs) -> Result<ExitCode, CmdError> {
    let report = run(a)?;
    let code = super::output::emit(&report, &a.out)?;
    if a.json {
        println!("{}", serde_json::json!({ "cells": report.results.cells }));
    }
    let verified = report
        .results
        .cells
        .iter()
        .all(|c| c.restores().all(RestoreCell::verified));
    Ok(if verified { code } else { ExitCode::FAILURE })
}
