//! `ferry demo --snapshot`: the guest booted here is saved to a file while
//! it runs, the source ends, and the guest is restored from the file into
//! a new VM and runs on, its own stamp checks counted on both sides. The
//! restore is lazy with the working set first unless `--restore` says
//! otherwise.

use crate::args::BackendArgs;
use crate::error::CmdError;
use crate::vms::{self, Role};
use ferry_engine::snapshot::{
    self, RestoreMode, RestoreOptions, RestoreSummary, Restoring, SnapshotOptions, SnapshotSummary,
};
use ferry_engine::vmm::StreamHeader;
use ferry_memstress::{MemstressProbe, VmConfig};
use ferry_report::Table;
use ferry_vm::{error_chain as chain, GuestProbe, Vm, VmError};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// One snapshot demo, its flags translated.
pub struct SnapshotDemo<'a> {
    /// The guest, admitted on this host.
    pub config: VmConfig,
    /// Its backend.
    pub backend: &'a BackendArgs,
    /// The file (kept when given; else a temporary one, removed).
    pub file: Option<PathBuf>,
    /// How the restore brings the pages in.
    pub restore: RestoreMode,
    /// The longest pause the snapshot aims for.
    pub max_downtime: Duration,
    /// Seconds the restored guest runs before its checks are read.
    pub run_after: f64,
    /// Print the result as one JSON line last.
    pub json: bool,
}

/// Runs the demo `d`.
pub fn run(d: SnapshotDemo) -> Result<ExitCode, CmdError> {
    let (path, temporary) = match &d.file {
        Some(p) => (p.clone(), false),
        None => (
            std::env::temp_dir().join(format!("ferry-demo-{}.snap", std::process::id())),
            true,
        ),
    };
    let result = save_and_restore(&d, &path);
    if temporary {
        let _ = std::fs::remove_file(&path);
    }
    let report = result?;
    println!("{}", report.table().render());
    if d.json {
        println!("{}", report.json(&path));
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What the demo saw.
struct Report {
    snapshot: SnapshotSummary,
    restore: RestoreSummary,
    /// The restore's time to the first instruction, the start included.
    first_instruction_ms: f64,
    /// The source guest's checks when the snapshot stopped it.
    at_snapshot: ferry_vm::GuestCheck,
    /// The restored guest's, before it ran.
    at_restore: ferry_vm::GuestCheck,
    /// What it did after the restore.
    after: crate::guest_check::AfterSwitchover,
}

impl Report {
    fn ok(&self) -> bool {
        self.restore.digest_match
            && self.at_restore == self.at_snapshot
            && self.at_snapshot.errors == 0
            && self.after.since_resume.errors == 0
            && self.after.problem.is_none()
    }

    fn table(&self) -> Table {
        let s = &self.snapshot;
        let mut t = Table::new("snapshot and restore", &["", ""]);
        let rows = [
            ("snapshot: total", format!("{:.0} ms", s.total_ms)),
            (
                "snapshot: the guest's pause",
                s.proof.pause_words(s.pause_ms, s.digest_ms),
            ),
            ("snapshot: rounds", s.rounds.len().to_string()),
            (
                "snapshot: file",
                format!(
                    "{} MiB on disk, {} MiB with holes",
                    s.bytes >> 20,
                    s.file_bytes >> 20
                ),
            ),
            ("restore", self.restore.mode.to_string()),
            (
                "restore: first instruction",
                format!("{:.0} ms", self.first_instruction_ms),
            ),
            (
                "restore: working set in",
                format!(
                    "{:.0} ms ({} pages)",
                    self.restore.working_set_ms, self.restore.working_set_pages
                ),
            ),
            (
                "restore: all memory in",
                format!("{:.0} ms", self.restore.resident_ms),
            ),
            (
                "restore: faults that held the guest",
                format!(
                    "{} ({} pages read for them, by {})",
                    self.restore.blocking_faults, self.restore.fault_pages, self.restore.fault_path
                ),
            ),
            (
                "restore: digest",
                if self.restore.digest_match {
                    "match"
                } else {
                    "not compared"
                }
                .into(),
            ),
            (
                "guest mismatches before / after",
                format!(
                    "{} / {}",
                    self.at_snapshot.errors, self.after.since_resume.errors
                ),
            ),
            (
                "guest passes after the restore",
                self.after.since_resume.progress.to_string(),
            ),
        ];
        for (k, v) in rows {
            t.row(vec![k.to_string(), v]);
        }
        if self.at_restore != self.at_snapshot {
            t.note(format!(
                "the restored guest's counters {:?} are not the saved guest's {:?}",
                self.at_restore, self.at_snapshot
            ));
        }
        if let Some(p) = &self.after.problem {
            t.note(format!("the restored guest: {p}"));
        }
        t
    }

    fn json(&self, path: &std::path::Path) -> serde_json::Value {
        let mut restore = serde_json::to_value(&self.restore).unwrap_or_default();
        // The demo restored it paused, read its checks, then started it.
        restore["first_instruction_ms"] = self.first_instruction_ms.into();
        restore["started"] = true.into();
        serde_json::json!({
            "status": if self.ok() { "completed" } else { "failed" },
            "file": path,
            "snapshot": self.snapshot,
            "restore": restore,
            "digest_match": self.restore.digest_match,
            "guest_mismatches": self.at_snapshot.errors + self.after.since_resume.errors,
            "mismatches_before": self.at_snapshot.errors,
            "mismatches_after": self.after.since_resume.errors,
            "dest_passes_after": self.after.since_resume.progress,
            "guest_error": self.after.problem,
            "error": serde_json::Value::Null,
        })
    }
}

/// A snapshot error as the command's, saying what failed.
pub(crate) fn failed(
    what: &'static str,
) -> impl Fn(ferry_engine::error::SnapshotError) -> CmdError {
    move |e| CmdError::Failed(format!("{what}: {}", chain(&e)))
}

/// A guest restored from a snapshot and started.
pub(crate) struct Started {
    /// The restored VM, running (unless asked not to start it).
    pub vm: Box<dyn Vm>,
    /// The restore, still bringing pages in if lazy.
    pub restoring: Restoring,
    /// The guest's checks as restored, before it ran.
    pub at_restore: ferry_vm::GuestCheck,
    /// From the restore's call to the guest running, the start included
    /// (to the end of the restore's work, when left paused).
    pub first_instruction_ms: f64,
}

/// Restores `path` in `mode` into a VM this backend builds from the
/// file's header, reads the guest's checks while it is paused (lazily,
/// that faults their few pages in), then starts it unless `start` is
/// false. A backend named on the command line (not auto) must be the
/// file's.
pub(crate) fn restore_and_start(
    path: &std::path::Path,
    backend: &BackendArgs,
    mode: RestoreMode,
    start: bool,
) -> Result<Started, CmdError> {
    let backend = backend.clone();
    let mut create = move |h: &StreamHeader| -> Result<Box<dyn Vm>, VmError> {
        let (kind, config) = vms::from_stream(&h.vmm, &h.vmm_config, backend.backing())?;
        if backend.backend != "auto" && kind != backend.kind() {
            return Err(VmError::Guest(format!(
                "the snapshot holds a {kind} VM, and --backend asks for {}",
                backend.kind()
            )));
        }
        vms::create_destination(kind, &config, &backend, &[])
    };
    let mut paused = RestoreOptions::default();
    paused.paused = true;
    paused.mode = mode;
    let (mut vm, restoring) =
        snapshot::restore(path, &mut create, &paused).map_err(failed("the restore failed"))?;
    let at_restore = MemstressProbe
        .read(&*vm)
        .map_err(|e| CmdError::Failed(chain(&e)))?;
    let t = Instant::now();
    if start {
        vm.start()?;
    }
    let first_instruction_ms =
        restoring.summary().first_instruction_ms + t.elapsed().as_secs_f64() * 1e3;
    Ok(Started {
        vm,
        restoring,
        at_restore,
        first_instruction_ms,
    })
}

fn save_and_restore(d: &SnapshotDemo, path: &std::path::Path) -> Result<Report, CmdError> {
    let kind = d.backend.kind();
    let mut vm = vms::create(kind, &d.config, d.backend, Role::Source)?;
    vm.start()?;
    // Every vCPU has finished a pass: memory holds the guest's data.
    crate::driver::warm_up(&*vm, Duration::ZERO)?;
    eprintln!(
        "ferry demo: saving the running guest ({} vCPUs x {} MiB, {kind} backend) to {}",
        d.config.workload.vcpus,
        d.config.workload.bytes_per_vcpu >> 20,
        path.display()
    );
    let mut opts = SnapshotOptions::default();
    opts.max_downtime = d.max_downtime;
    opts.stop = true;
    let snapshot = snapshot::save(&mut *vm, path, &opts).map_err(failed("the snapshot failed"))?;
    let at_snapshot = MemstressProbe
        .read(&*vm)
        .map_err(|e| CmdError::Failed(chain(&e)))?;
    // The source ends here: from now on the file is the only copy.
    drop(vm);

    eprintln!("ferry demo: the source ended; restoring from the file");
    let Started {
        vm: mut restored,
        restoring,
        at_restore,
        first_instruction_ms,
    } = restore_and_start(path, d.backend, d.restore, true)?;
    // The guest runs while the rest of its memory comes in.
    let restore = restoring
        .finish(&mut *restored)
        .map_err(failed("the restore failed"))?;
    let after = crate::guest_check::after_switchover(
        &*restored,
        at_restore,
        Duration::try_from_secs_f64(d.run_after).unwrap_or_default(),
    );
    Ok(Report {
        snapshot,
        restore,
        first_instruction_ms,
        at_snapshot,
        at_restore,
        after,
    })
}
