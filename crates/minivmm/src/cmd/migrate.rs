//! `minivmm migrate`: boot the VM, let it run, migrate it live.

use super::line_log::LineLog;
use super::{consoles, flush, merge, parse_backing, vm_report, VmArgs};
use ferry_engine::choices::Compression;
use ferry_engine::choices::ConvergeMode;
use ferry_engine::local::{migrate_local, LocalOptions};
use ferry_engine::snapshot::{self, SnapshotOptions, Steering};
use ferry_engine::transport::{Dial, TcpDialer, TlsConfig};
use ferry_engine::vmm::{Backing, Vm};
use ferry_engine::{
    migrate as engine_migrate, MigrationSettings, Mode, PrecopyOptions, Progress, RoundStats,
    TunableChange, Tunables,
};
use minivmm::probe::MiniProbe;
use minivmm::MiniVm;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    #[command(flatten)]
    vm: VmArgs,
    /// The destination's address (`minivmm receive --listen`).
    #[arg(long, required_unless_present_any = ["local", "snapshot"])]
    to: Option<String>,
    /// Same-host live upgrade: hand the guest memory to the `minivmm
    /// receive --local` listening on this UNIX socket instead of copying it
    /// (needs `--backing memfd`).
    #[arg(long, conflicts_with = "to")]
    local: Option<PathBuf>,
    /// Save the running VM to this file instead of migrating it: live
    /// rounds while the guest runs, then a pause for the rest, after which
    /// the guest stays stopped (the file is its only copy; `minivmm
    /// receive --from-snapshot FILE` runs it on).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["to", "local", "tls"])]
    snapshot: Option<PathBuf>,
    /// precopy, postcopy, or hybrid (precopy rounds, then postcopy).
    #[arg(long, default_value = "precopy")]
    mode: Mode,
    /// Data connections.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Mutual TLS with the ca.pem, cert.pem and key.pem in this directory.
    #[arg(long)]
    tls: Option<PathBuf>,
    /// What slows the guest if precopy does not converge: none, auto,
    /// dirty-limit or quota (quota and dirty-limit need the source's
    /// `--dirty-log ring`, the default). Default: the best this VM serves,
    /// the quota where its rings meter each vCPU.
    #[arg(long)]
    converge: Option<ConvergeMode>,
    /// Page compression: none, lz4, zstd or auto.
    #[arg(long, default_value = "none")]
    compression: Compression,
    /// Cap the link at this many MiB/s (0: no cap).
    #[arg(long, default_value_t = 0)]
    bandwidth_mib_s: u64,
    /// The downtime target, in milliseconds.
    #[arg(long, default_value_t = 300)]
    downtime_ms: u64,
    /// Harvest the dirty log at every policy interval while a round is
    /// sent, so that a page dirtied ahead of the send cursor goes out once
    /// (as `ferry migrate --harvest-within-rounds`).
    #[arg(long)]
    harvest_within_rounds: bool,
    /// Lift --bandwidth-mib-s while the guest is paused for the
    /// switchover, as QEMU lifts its max-bandwidth at completion (the cap
    /// then spares the link only while the guest runs).
    #[arg(long)]
    uncapped_pause: bool,
    /// How long the guest runs before the migration starts.
    #[arg(long, default_value_t = 1000)]
    run_before_ms: u64,
    /// --guest linux: how long the guest may take to boot to its checker.
    #[arg(long, default_value_t = 600)]
    boot_limit_s: u64,
    /// If the migration fails, how long the guest then runs on here
    /// (its console and disk streams must go on without a gap).
    #[arg(long, default_value_t = 1000)]
    run_after_failure_ms: u64,
    /// Guest memory: anon or memfd.
    #[arg(long, default_value = "anon", value_parser = parse_backing)]
    backing: Backing,
    /// Write vCPU 0's console here (vCPU i's at this path with `.i`
    /// appended) instead of stdout.
    #[arg(long)]
    console: Option<PathBuf>,
    /// Sample each vCPU's run statistics (time in KVM_RUN, throttle
    /// sleeps, KVM's own counters) every 100 ms while the guest is moved,
    /// as JSON lines in this file.
    #[arg(long)]
    vcpu_trace: Option<PathBuf>,
    /// End with the summary as one JSON line on stdout.
    #[arg(long)]
    json: bool,
}

/// Rounds as they finish, on stderr, written by a thread of its own: the
/// final round finishes in the downtime ([`LineLog`] says why). Dropping
/// it writes what is left.
struct RoundLog(LineLog);

impl RoundLog {
    fn new() -> RoundLog {
        RoundLog(LineLog::stderr())
    }
}

impl Progress for RoundLog {
    fn round_finished(&self, r: &RoundStats) {
        self.0.line(format!(
            "minivmm: round {} ({:?}): {} pages in {:.0} ms",
            r.round, r.kind, r.pages, r.ms
        ));
    }
}

pub fn migrate(a: MigrateArgs) -> Result<(), String> {
    if a.local.is_some() && a.backing != Backing::Memfd {
        // Refuse before the VM boots, as the engine would once it had.
        return Err(ferry_engine::error::LocalError::NotFileBacked.to_string());
    }
    let to = a.to.clone().unwrap_or_default();
    let dialer: Box<dyn Dial> = match &a.tls {
        Some(dir) => Box::new(
            TlsConfig::load(dir)
                .and_then(|t| t.dialer(&to))
                .map_err(|e| e.to_string())?,
        ),
        None => Box::new(TcpDialer(to)),
    };
    let settings = MigrationSettings {
        tunables: TunableChange {
            downtime_ms: Some(a.downtime_ms),
            bandwidth_bytes_per_sec: Some(a.bandwidth_mib_s.saturating_mul(1 << 20)),
            ..TunableChange::default()
        },
        mode: Some(a.mode),
        connections: Some(a.connections),
        converge: a.converge,
        compression: a.compression,
        harvest_within_rounds: a.harvest_within_rounds,
        // The destination's guest must not touch the shared disk before
        // the digest proves its memory: a source that resumes after a
        // failed check would find blocks written by a guest that no
        // longer exists. Postcopy never resumes the source.
        verify_before_resume: a.mode == Mode::Precopy,
        ..MigrationSettings::default()
    };
    let opts = settings
        .options(Tunables::shared(), Some(Arc::new(MiniProbe)))
        .map_err(|e| e.to_string())?;
    // Not an option of the migration's but a knob of its tunables, which
    // only minivmm's flags set.
    opts.tunables.set_uncapped_pause(a.uncapped_pause);

    let config = a.vm.config()?;
    if config.fill && a.backing != Backing::Memfd {
        return Err(
            "--vhost needs --backing memfd: the backend maps guest memory by its memfd".into(),
        );
    }
    let outs = consoles(a.console.as_deref(), config.vcpus)?;
    let linux = config.linux.is_some();
    let mut vm = MiniVm::boot(config, a.backing, outs.clone()).map_err(|e| e.to_string())?;
    vm.start().map_err(|e| e.to_string())?;
    if linux {
        // A Linux guest boots first: the move starts once its checker runs.
        let limit = Duration::from_secs(a.boot_limit_s);
        let booted = super::linux_run::wait_for_checker(&vm, a.console.as_deref(), 3, limit)
            .inspect_err(|_| flush(&outs))?;
        eprintln!(
            "minivmm: the Linux guest's checker runs, {:.1} s after boot",
            booted.as_secs_f64()
        );
    }
    std::thread::sleep(Duration::from_millis(a.run_before_ms));
    vm.check_health().map_err(|e| e.to_string())?;

    let trace = match &a.vcpu_trace {
        Some(path) => Some(super::vcpu_trace::VcpuTrace::start(path, vm.run_probes())?),
        None => None,
    };
    let outcome = match (&a.local, &a.snapshot) {
        (Some(path), _) => local(&mut vm, path),
        (None, Some(file)) => to_file(
            &mut vm,
            file,
            Duration::from_millis(a.downtime_ms),
            a.converge,
        ),
        (None, None) => over_the_network(&mut vm, &*dialer, &opts),
    };
    drop(trace);
    let moved = outcome.status == "completed";
    if moved && a.local.is_some() {
        // The new process is the fill backend's client now.
        vm.release_fill_backend();
    }
    if !moved && vm.is_running() {
        // The engine gave the guest back: show it goes on.
        std::thread::sleep(Duration::from_millis(a.run_after_failure_ms));
    } else if !moved {
        // The engine left this copy paused (a postcopy that failed after
        // the switchover, a lost Commit, a same-host move that vanished
        // after Go): the guest may run elsewhere, so it must not run here.
        eprintln!(
            "minivmm: this copy stays paused: the guest may run at the destination; it is \
             discarded when this process ends"
        );
    }
    // The in-flight count of the migration's own pause, before this one.
    let in_flight = vm.requests_in_flight_at_pause();
    let paused_unix_ms = vm.paused_unix_ms();
    vm.pause().map_err(|e| e.to_string())?;
    flush(&outs);
    let report = vm_report(&vm)?;
    match &outcome.error {
        Some(e) if vm.is_running() => {
            eprintln!("minivmm: the migration failed: {e}; the guest ran on here")
        }
        Some(e) => eprintln!("minivmm: the migration failed: {e}"),
        None => eprintln!(
            "minivmm: {} in {:.0} ms, downtime {:.1} ms, digest {}",
            outcome.status,
            outcome.total_ms.unwrap_or(0.0),
            outcome.downtime_ms.unwrap_or(0.0),
            if outcome.digest_match {
                "match"
            } else {
                "MISMATCH"
            }
        ),
    }
    if a.json {
        let mode = match (&a.local, &a.snapshot) {
            (Some(_), _) => "local".to_string(),
            (None, Some(_)) => "snapshot".to_string(),
            (None, None) => a.mode.to_string(),
        };
        let j = serde_json::json!({
            "role": "source",
            "status": outcome.status,
            "digest_match": outcome.digest_match,
            "downtime_ms": outcome.downtime_ms,
            "total_ms": outcome.total_ms,
            "mode": mode,
            "connections": a.connections,
            "tls": a.tls.is_some(),
            "error": outcome.error,
            "summary": outcome.summary,
        });
        let mut j = merge(j, report);
        j["requests_in_flight_at_pause"] = in_flight.into();
        // The migration's pause (its switchover), not the one above.
        j["paused_unix_ms"] = paused_unix_ms.into();
        println!("{j}");
    }
    if moved {
        Ok(())
    } else {
        Err("the migration did not complete; the guest ran on here".into())
    }
}

/// How a migration ended, whichever way it went.
struct Outcome {
    status: String,
    digest_match: bool,
    downtime_ms: Option<f64>,
    total_ms: Option<f64>,
    error: Option<String>,
    summary: serde_json::Value,
}

fn over_the_network(vm: &mut MiniVm, dialer: &dyn Dial, opts: &PrecopyOptions) -> Outcome {
    match engine_migrate(vm, dialer, opts, &RoundLog::new()) {
        Ok(s) => Outcome {
            status: super::status_name(s.status),
            digest_match: s.digest_match,
            downtime_ms: Some(s.downtime_ms),
            total_ms: Some(s.total_ms),
            error: s.error.clone(),
            summary: serde_json::to_value(&s).unwrap_or_default(),
        },
        Err(e) => failed(&e),
    }
}

/// A live snapshot to `file`, the guest left stopped: its state is the
/// file's. The save proves itself at its pause (the paused memory, hashed
/// on its own, is what the file holds), so a completed one matches. The
/// live rounds run `converge` (default: the best the VM serves).
fn to_file(
    vm: &mut MiniVm,
    file: &std::path::Path,
    max_downtime: Duration,
    converge: Option<ConvergeMode>,
) -> Outcome {
    let mut opts = SnapshotOptions::default();
    opts.max_downtime = max_downtime;
    opts.converge = converge;
    opts.stop = true;
    let log = RoundLog::new();
    let steering = Steering {
        progress: &log,
        tunables: Tunables::shared(),
    };
    match snapshot::save_steered(vm, file, &opts, &steering) {
        Ok(s) => Outcome {
            status: "completed".into(),
            digest_match: true,
            downtime_ms: Some(s.pause_ms),
            total_ms: Some(s.total_ms),
            error: None,
            summary: serde_json::to_value(&s).unwrap_or_default(),
        },
        Err(e) => failed(&e),
    }
}

fn local(vm: &mut MiniVm, path: &std::path::Path) -> Outcome {
    let opts = {
        let mut o = LocalOptions::default();
        o.probe = Some(Arc::new(MiniProbe));
        o
    };
    match migrate_local(vm, path, &opts) {
        Ok(s) => Outcome {
            status: super::status_name(s.status),
            digest_match: s.digest_match,
            downtime_ms: Some(s.downtime_ms),
            total_ms: Some(s.total_ms),
            error: None,
            summary: serde_json::to_value(&s).unwrap_or_default(),
        },
        Err(e) => failed(&e),
    }
}

fn failed(e: &dyn std::error::Error) -> Outcome {
    Outcome {
        status: "failed".into(),
        digest_match: false,
        downtime_ms: None,
        total_ms: None,
        error: Some(ferry_engine::vmm::error_chain(e)),
        summary: serde_json::Value::Null,
    }
}
