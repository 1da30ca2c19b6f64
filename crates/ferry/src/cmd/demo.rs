//! `ferry demo`: the main job in one command. Boots a busy 2-vCPU, 1 GiB guest,
//! starts a destination `ferry receive` process on this machine, migrates over
//! loopback with a progress bar, and prints the summary. This parses the
//! flags, admits the guest and says what the destination is started with;
//! [`crate::demo`] runs it.

use crate::args::{BackendArgs, PagingArgs, WorkloadArgs};
use crate::demo::{self, Demo};
use crate::driver::MigrationArgs;
use crate::error::CmdError;
use crate::netns::LinkShape;
use clap::Args;
use ferry_engine::snapshot::RestoreMode;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `ferry demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub migration: MigrationArgs,
    /// Seconds the destination runs the guest after switchover before reporting.
    #[arg(long = "run-after", default_value_t = 1.0)]
    pub run_after: f64,
    /// For tests: the destination breaks the guest's code once it resumes
    /// (`ferry receive --break-guest-after-resume`).
    #[arg(long = "break-dest-guest", hide = true)]
    pub break_dest_guest: bool,
    /// Let the guest write as fast as it can: the default. An uncapped
    /// write-heavy guest dirties memory faster than loopback can send it, and
    /// the demo shows the convergence policy (--converge) bringing it home.
    /// Give --rate-limit to cap the guest instead.
    #[arg(long, conflicts_with = "rate_limit_mib_s")]
    pub unthrottled: bool,
    /// The destination's placement and postcopy paging, as `ferry receive`
    /// takes them.
    #[command(flatten)]
    pub paging: PagingArgs,
    /// Run every connection over mutual TLS, with a throwaway CA and
    /// certificate written for this run (or the ones in --tls-dir).
    #[arg(long)]
    pub tls: bool,
    /// Two hosts on one machine: run the source and the destination in
    /// network namespaces of their own, joined by a veth pair (needs root
    /// and iproute2). Both are deleted when the demo ends.
    #[arg(long)]
    pub netns: bool,
    /// Shape the --netns link to this many MiB/s (tc tbf, both ways). Unlike
    /// --bandwidth, which caps the engine, this is the link: the engine
    /// measures it. Default: as fast as veth goes.
    #[arg(long = "link-rate", value_name = "MIB_S", requires = "netns", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub link_rate: Option<u64>,
    /// Also write this migration as a self-contained HTML page to FILE: the
    /// verdicts (digest, the guest's checks, the pause against its
    /// prediction), a timeline with one unit per panel, each round, each
    /// throttle change and the prediction. Its JSON goes beside it (FILE
    /// with .json). The page needs no network: open it from the file.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Instead of a migration: save the running guest to a file while it
    /// runs (pausing it for at most --downtime-ms where it can), end the
    /// source, restore the guest from the file into a new VM, and count
    /// its own checks on both sides (docs/snapshots.md).
    #[arg(long, conflicts_with_all = ["netns", "tls", "report"])]
    pub snapshot: bool,
    /// The --snapshot file, kept afterwards (default: a temporary file,
    /// removed when the demo ends).
    #[arg(long = "snapshot-file", value_name = "FILE", requires = "snapshot")]
    pub snapshot_file: Option<PathBuf>,
    /// How --snapshot restores: `lazy-working-set` starts the guest at
    /// once and brings in the pages it wrote last before the rest (pages
    /// it touches first come on demand); `lazy` brings the rest in address
    /// order; `eager` reads every page before the guest starts.
    #[arg(
        long = "restore",
        value_name = "MODE",
        default_value = "lazy-working-set",
        value_parser = crate::args::restore_mode(),
        requires = "snapshot"
    )]
    pub restore: RestoreMode,
    /// One-way delay of the --netns link in ms (tc netem, both ways).
    #[arg(long = "link-delay-ms", value_name = "MS", requires = "netns", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub link_delay_ms: Option<u64>,
}

/// Runs `ferry demo`.
pub fn run(a: DemoArgs) -> Result<ExitCode, CmdError> {
    let workload = a.workload.workload().map_err(CmdError::Usage)?;
    let config = a.backend.config(workload);
    // Refuse a guest this host cannot hold before starting anything.
    config.admit().map_err(ferry_vm::VmError::from)?;
    if a.snapshot {
        return crate::demo::snapshot::run(crate::demo::snapshot::SnapshotDemo {
            config,
            backend: &a.backend,
            file: a.snapshot_file.clone(),
            restore: a.restore,
            max_downtime: Duration::from_millis(a.migration.downtime_ms),
            run_after: a.run_after,
            json: a.migration.json,
        });
    }
    let receive_args = receive_args(&a);
    demo::run(Demo {
        config,
        backend: &a.backend,
        migration: a.migration,
        run_after: a.run_after,
        tls: a.tls,
        netns: a.netns.then(|| LinkShape {
            rate_bytes_per_sec: a.link_rate.map(|r| r << 20),
            delay: a.link_delay_ms.map(Duration::from_millis),
        }),
        link_rate: a.link_rate,
        report: a.report.as_deref(),
        receive_args,
    })
}

/// The destination's flags, as `ferry receive` takes them: the demo's
/// backend, timeouts and paging, and the checks asked for.
fn receive_args(a: &DemoArgs) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--backend".into(),
        a.backend.kind().to_string(),
        "--backing".into(),
        a.backend.backing.clone(),
        "--run-after".into(),
        a.run_after.to_string(),
        "--stall-timeout".into(),
        a.migration.stall_timeout_s.to_string(),
    ];
    args.extend(a.paging.receive_args());
    args.extend([
        "--recover-timeout".into(),
        a.migration.recover_timeout_s.to_string(),
    ]);
    if a.migration.verify_before_resume {
        args.push("--verify-before-resume".into());
    }
    if a.break_dest_guest {
        args.push("--break-guest-after-resume".into());
    }
    args
}
