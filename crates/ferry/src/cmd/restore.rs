//! `ferry restore FILE`: builds the VM a snapshot holds, brings its memory
//! in as `--mode` says, runs it, and serves it as `ferry run` does (its
//! progress lines, its control and QMP sockets), so that it can be
//! snapshotted again or migrated onward.

use crate::args::BackendArgs;
use crate::demo::snapshot::{failed, restore_and_start, Started};
use crate::error::CmdError;
use crate::serve::{serve_vm_on, Serve};
use clap::Args;
use ferry_engine::custody::CopyState;
use ferry_engine::snapshot::{self, RestoreMode, RestoreSummary};
use ferry_report::Table;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `ferry restore`.
#[derive(Args, Debug)]
#[command(after_help = "\
Everything in the file but the guest's pages (its header, vCPU state, device
sections, page hashes and working set) is checked before the VM is built; a
damaged or truncated file is refused naming the part and its offset. Each
page is checked against its hash as it comes in: in the lazy modes a damaged
page stops the guest, naming the page and its offset, and this exits non-zero.

Modes:
  eager             every page is read before the first instruction
  lazy              the guest starts at once; a page it touches first is read
                    on demand, and a fill brings in the rest in address order
  lazy-working-set  lazy, with the fill taking first the pages the guest wrote
                    in its last seconds before the snapshot (the default)

Examples:
  ferry restore /var/tmp/vm.snap
  ferry restore /var/tmp/vm.snap --mode eager --control /tmp/vm.sock
  ferry restore /var/tmp/vm.snap --exit-after-restore --json")]
pub struct RestoreArgs {
    /// The snapshot (written by `ferry snapshot`, QMP's `migrate` to a
    /// `file:` URI, or `ferry demo --snapshot --snapshot-file`).
    pub file: PathBuf,
    /// How the pages come in: eager, lazy or lazy-working-set.
    #[arg(long, default_value = "lazy-working-set", value_parser = crate::args::restore_mode())]
    pub mode: RestoreMode,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Leave the restored guest paused; `ferry ctl SOCKET cont` runs it.
    #[arg(long)]
    pub paused: bool,
    /// Exit once every page is in and checked (after the guest ran for
    /// `--run-after` seconds), instead of running the guest on.
    #[arg(long = "exit-after-restore", conflicts_with_all = ["control", "qmp", "paused"])]
    pub exit_after_restore: bool,
    /// With `--exit-after-restore`: seconds the guest runs after its pages
    /// are in, before its own checks are read.
    #[arg(
        long = "run-after",
        default_value_t = 1.0,
        requires = "exit_after_restore"
    )]
    pub run_after: f64,
    /// Serve a control socket here once the guest's pages are in (as
    /// `ferry run --control`: status, snapshot, migrate onward, QMP).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Serve a QMP socket here once the guest's pages are in (as
    /// `ferry run --qmp`).
    #[arg(long, value_name = "PATH")]
    pub qmp: Option<PathBuf>,
    /// Stop after the guest ran this many seconds (default: until
    /// interrupted, stopped, or moved away).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Print the restore's summary as one JSON line once every page is in.
    #[arg(long)]
    pub json: bool,
    /// Say what the file holds (its VM, release, digest, working set) and
    /// check every part but the pages, without restoring it.
    #[arg(long, conflicts_with_all = ["paused", "exit_after_restore", "control", "qmp", "duration"])]
    pub inspect: bool,
}

/// Runs `ferry restore`.
pub fn run(a: RestoreArgs) -> Result<ExitCode, CmdError> {
    if !a.run_after.is_finite() || a.run_after < 0.0 {
        return Err(CmdError::Usage("--run-after must be 0 or more".into()));
    }
    if a.inspect {
        return inspect(&a);
    }
    let Started {
        mut vm,
        restoring,
        at_restore,
        first_instruction_ms,
    } = restore_and_start(&a.file, &a.backend, a.mode, !a.paused)?;
    eprintln!(
        "ferry restore: {} restored {} ({} vCPUs), first instruction after {:.0} ms; \
         bringing in the rest",
        a.file.display(),
        a.mode.name(),
        vm.vcpus(),
        first_instruction_ms
    );
    // The guest runs while the rest of its memory comes in; a damaged
    // page stops it, and the error names the page.
    let restore = restoring
        .finish(&mut *vm)
        .map_err(failed("the restore failed"))?;
    let mut report = Report {
        restore,
        first_instruction_ms,
        at_restore,
        after: None,
    };
    if a.exit_after_restore {
        let after = crate::guest_check::after_switchover(
            &*vm,
            at_restore,
            Duration::try_from_secs_f64(a.run_after).unwrap_or_default(),
        );
        report.after = Some(after);
    }
    println!("{}", report.table(&a).render());
    if a.json {
        println!("{}", report.json(&a));
    }
    if a.exit_after_restore {
        return Ok(if report.ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let state = match a.paused {
        true => CopyState::Paused,
        false => CopyState::Running,
    };
    let (ctl, commands) = crate::control::Shared::new(state, vm.ram().size())
        .map_err(|e| CmdError::Failed(format!("cannot start the monitor's event thread: {e}")))?;
    // What the guest asked for first leads this VM's next snapshot.
    *ctl.first_touches.lock().unwrap_or_else(|p| p.into_inner()) =
        std::mem::take(&mut report.restore.first_touches);
    ctl.serve_sockets(a.control.as_deref(), a.qmp.as_deref())
        .map_err(|e| CmdError::Failed(ferry_vm::error_chain(&e)))?;
    let serve = Serve {
        interval: Duration::from_secs(1),
        duration: a.duration,
        stay_after_migration: a.qmp.is_some(),
        control: a.control.clone(),
        qmp: a.qmp.clone(),
    };
    serve_vm_on(&mut *vm, &serve, ctl, commands)
}

/// `--inspect`: what the file holds, every part but the pages checked.
fn inspect(a: &RestoreArgs) -> Result<ExitCode, CmdError> {
    let info = snapshot::inspect(&a.file).map_err(failed("the file cannot be restored"))?;
    let mut t = Table::new("snapshot file", &["", ""]);
    let rows = [
        ("file", a.file.display().to_string()),
        ("written by", format!("ferry {}", info.ferry)),
        (
            "VM",
            format!(
                "{}, {} vCPUs, {} MiB",
                info.vmm,
                info.vcpus,
                info.memory_bytes >> 20
            ),
        ),
        ("device sections", info.sections.join(", ")),
        ("pages with data", info.data_pages.to_string()),
        ("working set", format!("{} pages", info.working_set_pages)),
        ("digest", format!("{:#018x}", info.digest)),
        (
            "the guest after the snapshot",
            match info.stopped {
                true => "stopped",
                false => "ran on",
            }
            .into(),
        ),
        ("parts but the pages", "checked (CRC32)".into()),
    ];
    for (k, v) in rows {
        t.row(vec![k.to_string(), v]);
    }
    println!("{}", t.render());
    if a.json {
        println!("{}", serde_json::to_value(&info).unwrap_or_default());
    }
    Ok(ExitCode::SUCCESS)
}

/// What the restore did, and what the guest's own checks say.
struct Report {
    restore: RestoreSummary,
    /// From the call to the guest running, the start included.
    first_instruction_ms: f64,
    /// The guest's checks as restored, before it ran.
    at_restore: ferry_vm::GuestCheck,
    /// With `--exit-after-restore`: what it did after its pages were in.
    after: Option<crate::guest_check::AfterSwitchover>,
}

impl Report {
    fn ok(&self) -> bool {
        self.restore.digest_match
            && self.at_restore.errors == 0
            && self
                .after
                .as_ref()
                .is_none_or(|a| a.since_resume.errors == 0 && a.problem.is_none())
    }

    fn table(&self, a: &RestoreArgs) -> Table {
        let r = &self.restore;
        let mut t = Table::new("restore", &["", ""]);
        let mut rows = vec![
            ("file", a.file.display().to_string()),
            ("mode", r.mode.to_string()),
            (
                "first instruction",
                match a.paused {
                    true => "none yet: the guest is paused (cont runs it)".into(),
                    false => format!("{:.0} ms", self.first_instruction_ms),
                },
            ),
            (
                "working set in",
                format!("{:.0} ms ({} pages)", r.working_set_ms, r.working_set_pages),
            ),
            ("all memory in", format!("{:.0} ms", r.resident_ms)),
            (
                "faults that held the guest",
                format!(
                    "{} ({} pages read for them, by {})",
                    r.blocking_faults, r.fault_pages, r.fault_path
                ),
            ),
            (
                "digest",
                match r.digest_match {
                    true => "match",
                    false => "not compared",
                }
                .into(),
            ),
            (
                "guest mismatches as saved",
                self.at_restore.errors.to_string(),
            ),
        ];
        if let Some(after) = &self.after {
            rows.push((
                "guest mismatches / passes after",
                format!(
                    "{} / {}",
                    after.since_resume.errors, after.since_resume.progress
                ),
            ));
        }
        for (k, v) in rows {
            t.row(vec![k.to_string(), v]);
        }
        if let Some(p) = self.after.as_ref().and_then(|a| a.problem.as_ref()) {
            t.note(format!("the restored guest: {p}"));
        }
        t
    }

    fn json(&self, a: &RestoreArgs) -> serde_json::Value {
        let mut restore = serde_json::to_value(&self.restore).unwrap_or_default();
        restore["first_instruction_ms"] = self.first_instruction_ms.into();
        restore["started"] = (!a.paused).into();
        let after = self.after.as_ref();
        json!({
            "status": if self.ok() { "restored" } else { "failed" },
            "file": a.file,
            "restore": restore,
            "digest_match": self.restore.digest_match,
            "mismatches_before": self.at_restore.errors,
            "mismatches_after": after.map(|a| a.since_resume.errors),
            "dest_passes_after": after.map(|a| a.since_resume.progress),
            "guest_error": after.and_then(|a| a.problem.clone()),
        })
    }
}
