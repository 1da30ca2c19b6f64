//! `ferry run`: boot a VM with the memstress guest and report its progress
//! (serving its control socket, [`crate::serve`]).

use crate::args::{BackendArgs, WorkloadArgs};
use crate::error::CmdError;
use crate::serve::{serve_vm, Serve};
use crate::vms;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `ferry run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Stop after this many seconds (default: run until interrupted).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Serve a control socket here (JSON lines: status, set, migrate, cancel,
    /// stop; and QMP's requests, without a greeting).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Serve a QMP socket here, in the shape of QEMU's monitor: a greeting,
    /// capabilities negotiation, then QMP's commands and events (`ferry ctl`
    /// speaks it too).
    #[arg(long, value_name = "PATH")]
    pub qmp: Option<PathBuf>,
    /// Exit once a migration has moved the VM away, even with `--qmp`.
    /// Without this, a `--qmp` monitor stays up after a completed migration,
    /// as QEMU's does (run state `postmigrate`, answering `query-migrate`
    /// and `query-status`) until `quit` or a signal; with `--control` alone
    /// the process exits as it always has.
    #[arg(long)]
    pub exit_after_migration: bool,
}

pub fn run(a: RunArgs) -> Result<ExitCode, CmdError> {
    let workload = a.workload.workload().map_err(CmdError::Usage)?;
    if a.interval.is_nan() || a.interval <= 0.0 {
        return Err(CmdError::Usage("--interval must be positive".into()));
    }
    let config = a.backend.config(workload);
    let mut vm = vms::create(a.backend.kind(), &config, &a.backend, vms::Role::Source)?;
    vm.start()?;
    eprintln!(
        "ferry: running {} vCPUs x {} MiB on the {} backend; Ctrl-C to stop",
        config.workload.vcpus,
        config.workload.bytes_per_vcpu >> 20,
        a.backend.kind()
    );
    serve_vm(
        &mut *vm,
        &Serve {
            interval: Duration::from_secs_f64(a.interval),
            duration: a.duration,
            stay_after_migration: a.qmp.is_some() && !a.exit_after_migration,
            control: a.control,
            qmp: a.qmp,
        },
    )
}
