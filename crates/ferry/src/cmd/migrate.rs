//! `ferry migrate`: boot a source VM, let the guest warm up, and migrate it to
//! a `ferry receive` listening elsewhere. Also the engine call `demo` shares.

use super::CmdError;
use crate::args::{BackendArgs, WorkloadArgs};
use crate::progress_bar::MigrationBar;
use crate::vcpu_share::{Sample, ShareWatch};
use crate::{summary, vms};
use clap::Args;
use ferry_engine::converge::ConvergeMode;
use ferry_engine::postcopy::DEFAULT_RECOVER_TIMEOUT;
use ferry_engine::precopy::Compression;
use ferry_engine::precopy::{
    DEFAULT_STALL_TIMEOUT, MAX_CONNECTIONS, RECOVER_TIMEOUT_SECS, STALL_TIMEOUT_SECS,
};
use ferry_engine::tunables::{
    DEFAULT_DOWNTIME, DEFAULT_MAX_ROUNDS, DOWNTIME_MS, MAX_ROUNDS, QUOTA_INTERVAL_MS,
};
use ferry_engine::{Both, Mode, NoProgress, PostcopyResume, Progress, TunableChange};
use ferry_engine::{Dial, MigrationSummary, Outcome, PrecopyOptions, TlsConfig, Tunables};
use ferry_memstress::{read_progress, set_write_percent, MemstressProbe, VcpuProgress};
use ferry_vm::error_chain as chain;
use ferry_vm::Vm;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Knobs of a precopy migration.
#[derive(Args, Debug, Clone)]
pub struct MigrationArgs {
    /// Downtime target in ms: precopy switches over once its predicted
    /// final round (queued bytes, dirty set, harvest and resume) fits well
    /// under it: at once under a quarter of it, after at most 3 more
    /// shrinking rounds under it, never over it.
    #[arg(long = "downtime-ms", default_value_t = DEFAULT_DOWNTIME.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(DOWNTIME_MS))]
    pub downtime_ms: u64,
    /// Most dirty rounds before stop-and-copy regardless.
    #[arg(long = "max-rounds", default_value_t = DEFAULT_MAX_ROUNDS,
          value_parser = crate::args::ranged_u32(MAX_ROUNDS))]
    pub max_rounds: u32,
    /// Bandwidth cap in MiB/s (0 = unlimited).
    #[arg(long = "bandwidth", default_value_t = 0)]
    pub bandwidth_mib_s: u64,
    /// Verify the memory digest before the destination resumes (longer downtime).
    #[arg(long = "verify-before-resume")]
    pub verify_before_resume: bool,
    /// Data connections for guest pages, each with its own sender and
    /// receiver thread: 1 to 64, or `auto` (one per core, at most 8). A
    /// main channel is always opened besides them.
    #[arg(long, default_value = "1", value_parser = parse_connections)]
    pub connections: usize,
    /// Seconds the link may stand still before both ends give up (the source
    /// VM keeps running, the destination starts no guest).
    #[arg(long = "stall-timeout", default_value_t = DEFAULT_STALL_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(STALL_TIMEOUT_SECS))]
    pub stall_timeout_s: u64,
    /// Compress page batches: none, lz4, zstd, or auto (compress only while
    /// the link, not the CPU, is the bottleneck; the summary says what it
    /// chose). Pair with --fill text or random for honest figures.
    #[arg(long, default_value = "none", value_parser = clap::value_parser!(Compression))]
    pub compress: Compression,
    /// What slows the guest when it dirties memory faster than the link
    /// sends it. auto: QEMU's auto-converge (once dirtying exceeds half the
    /// transfer twice, every vCPU, readers too, runs 10 ms and sleeps
    /// p/(1-p) x 10 ms, p from 20% up to 99%). quota: the seed's per-vCPU
    /// dirty quota (each vCPU may dirty a share of the link per 100 ms; only
    /// a vCPU that uses it up sleeps; soft, and kvm with --dirty-tracking ring).
    /// dirty-limit: QEMU 8.1's (each vCPU's dirty rate is limited to a share
    /// of the link; each writer's own throttle follows its rate). none.
    /// Default: quota where the backend meters each vCPU's writes, else auto.
    #[arg(long, value_parser = clap::value_parser!(ConvergeMode))]
    pub converge: Option<ConvergeMode>,
    /// The policy interval in ms: how often the convergence policy reads
    /// each vCPU's dirtying and the link while a round is sent, and the
    /// quota's refill interval (each vCPU may dirty its share of the link
    /// per interval; one that used it up sleeps until the next). Shorter:
    /// quicker reaction, smoother, more wake-ups. Changeable live with the
    /// control socket's `set`.
    #[arg(long = "quota-interval-ms", default_value_t = ferry_vm::QUOTA_INTERVAL.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(QUOTA_INTERVAL_MS))]
    pub quota_interval_ms: u64,
    /// When precopy stops converging (the bytes left stop shrinking for 3
    /// rounds), the engine first engages --converge, then raises the
    /// downtime target by half at a time up to this many ms. Default: never
    /// above --downtime-ms.
    #[arg(long = "max-downtime-ms", value_parser = clap::value_parser!(u64).range(DOWNTIME_MS))]
    pub max_downtime_ms: Option<u64>,
    /// Give up if the migration has not switched over after this many
    /// seconds: it is cancelled and the source VM keeps running (as a
    /// progress timeout in an orchestrator would). Default: never.
    #[arg(long = "give-up-after", value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub give_up_after_s: Option<u64>,
    /// How memory moves. precopy: rounds while the guest runs, then a
    /// short stop-and-copy. postcopy: switch over at once; the destination
    /// runs the guest and fetches each page it touches before it arrives
    /// (the rest are pushed behind). hybrid: precopy for
    /// --postcopy-after-rounds rounds, then postcopy (unless precopy
    /// converged first). Postcopy needs userfaultfd on the destination and
    /// cannot be combined with --delta, --verify-before-resume or hugetlb.
    #[arg(long, default_value = "precopy", value_parser = clap::value_parser!(Mode))]
    pub mode: Mode,
    /// hybrid: precopy rounds before postcopy (the full pass counts as one).
    /// Default: 1, or with --on-stall postcopy only when precopy stalls (or
    /// reaches --max-rounds).
    #[arg(long = "postcopy-after-rounds", value_parser = crate::args::ranged_u32(MAX_ROUNDS))]
    pub postcopy_after_rounds: Option<u32>,
    /// What a stall does (the bytes left stopped shrinking for 3 rounds).
    /// escalate: engage --converge, then raise the downtime target up to
    /// --max-downtime-ms. postcopy (with --mode hybrid): switch to postcopy
    /// at once, since precopy will not finish.
    #[arg(long = "on-stall", default_value = "escalate", value_parser = ["escalate", "postcopy"])]
    pub on_stall: String,
    /// Postcopy: when the connections break after the switchover, keep
    /// reconnecting for this many seconds; the destination's guest runs on
    /// meanwhile and the paused source keeps every page. 0: give up at once
    /// (the source stays paused with its pages either way). Pass the same
    /// to `ferry receive`.
    #[arg(long = "recover-timeout", value_name = "SECS", default_value_t = DEFAULT_RECOVER_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(RECOVER_TIMEOUT_SECS))]
    pub recover_timeout_s: u64,
    /// Re-send pages dirtied again as the bytes that changed since their
    /// last copy (like QEMU's XBZRLE), from a cache of last-sent pages.
    #[arg(long)]
    pub delta: bool,
    /// Harvest the dirty log at every policy interval while a round is
    /// sent, so that a page the guest dirties ahead of the send cursor goes
    /// out once, in that round, and not again in the next. Measured on a
    /// nested kvm host: 15-34% fewer bytes and shorter migrations for busy
    /// writers, but a writer faults more often (each harvest write-protects
    /// its pages again), so under the quota it runs a smaller share of the
    /// (shorter) migration. Off by default.
    #[arg(long = "harvest-within-rounds")]
    pub harvest_within_rounds: bool,
    /// Size of --delta's cache of last-sent pages (at most the guest's
    /// memory is used). A page evicted from it is sent whole.
    #[arg(long = "delta-cache", default_value = "256M", value_parser = crate::args::parse_size, requires = "delta")]
    pub delta_cache: u64,
    /// Mutual TLS on every connection, with `ca.pem`, `cert.pem` and `key.pem`
    /// from this directory (`ferry certs DIR` writes a throwaway set). The
    /// destination's certificate must name the host in --to.
    #[arg(long = "tls-dir", value_name = "DIR")]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Seconds the guest runs before migration starts (at least until every
    /// vCPU has finished one pass).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Before migrating, sample each vCPU's dirty rate for --predict-secs
    /// with dirty tracking on, and predict whether precopy converges and how
    /// long, how much downtime and how much guest slowdown each policy gives
    /// (`ferry demo` always does). The summary keeps it as `predicted`.
    #[arg(long)]
    pub predict: bool,
    /// Seconds --predict samples the guest.
    #[arg(long = "predict-secs", default_value_t = 1.0)]
    pub predict_secs: f64,
    /// Idle guest: after the warm-up pass has written every page, stop writing
    /// (the guest keeps reading and checking its stamps).
    #[arg(long)]
    pub idle: bool,
    /// Print the summary as one JSON object on the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// The link's rate when the caller knows it (the demo's shaped --netns
    /// link), for the prediction.
    #[arg(skip)]
    pub link_bytes_per_sec: Option<u64>,
}

impl MigrationArgs {
    /// The mode asked for, with its switch to postcopy: the engine refuses
    /// a switch asked of a mode that never switches.
    pub fn mode(&self) -> Result<Mode, CmdError> {
        self.mode
            .switching(self.postcopy_after_rounds, self.on_stall == "postcopy")
            .map_err(|e| CmdError::Usage(e.to_string()))
    }
}

/// `--connections`: a count, or `auto` for one per core (at most 8).
pub fn parse_connections(s: &str) -> Result<usize, String> {
    let max = MAX_CONNECTIONS;
    if s == "auto" {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        return Ok(cores.clamp(1, 8));
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected 1 to {max}, or auto")),
    }
}

impl MigrationArgs {
    /// The engine's options these flags ask for (with tunables of their
    /// own), checked by the engine, and the TLS material, loaded so that a
    /// bad --tls-dir is refused before any VM boots.
    pub fn options(&self) -> Result<(PrecopyOptions, Option<TlsConfig>), CmdError> {
        let mode = self.mode()?;
        let tunables = Tunables::shared();
        tunables
            .apply(&TunableChange {
                downtime_ms: Some(self.downtime_ms),
                max_rounds: Some(self.max_rounds),
                bandwidth_bytes_per_sec: Some(self.bandwidth_mib_s.saturating_mul(1 << 20)),
                quota_interval_ms: Some(self.quota_interval_ms),
            })
            .map_err(|e| CmdError::Usage(e.to_string()))?;
        let opts = {
            let mut o = PrecopyOptions::default();
            o.tunables = tunables;
            o.verify_before_resume = self.verify_before_resume;
            o.connections = self.connections;
            o.stall_timeout = Duration::from_secs(self.stall_timeout_s);
            o.compression = self.compress;
            o.delta_cache_bytes = if self.delta { self.delta_cache } else { 0 };
            o.harvest_within_rounds = self.harvest_within_rounds;
            o.converge = self.converge;
            o.max_downtime = self.max_downtime_ms.map(Duration::from_millis);
            o.mode = mode;
            o.recover_timeout = Duration::from_secs(self.recover_timeout_s);
            o.probe = Some(Arc::new(MemstressProbe));
            o.give_up_after = self.give_up_after_s.map(Duration::from_secs);
            o
        };
        opts.validate()
            .map_err(|e| CmdError::Usage(e.to_string()))?;
        Ok((opts, load_tls(self.tls_dir.as_deref())?))
    }
}

/// Loads `--tls-dir`, if given.
pub fn load_tls(dir: Option<&std::path::Path>) -> Result<Option<TlsConfig>, CmdError> {
    dir.map(|d| {
        TlsConfig::load(d).map_err(|e| CmdError::Usage(format!("--tls-dir: {}", chain(&e))))
    })
    .transpose()
}

/// Arguments of `ferry migrate`.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// Where the destination listens (`ferry receive --listen ...`):
    /// HOST:PORT (TCP; `tcp:` may precede it), `unix:PATH` (a UNIX
    /// socket), or `fd:N,M,...` (connected sockets this process inherited:
    /// the main channel, then one per --connections, then one more where
    /// the mode may switch to postcopy).
    #[arg(
        long,
        required_unless_present = "local",
        default_value = "",
        hide_default_value = true
    )]
    pub to: String,
    /// Same-host live upgrade: hand the guest memory's files to the `ferry
    /// receive --local` on this UNIX socket instead of copying the memory
    /// (needs `--backing memfd`).
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["to", "control"])]
    pub local: Option<std::path::PathBuf>,
    /// Migrate the VM of a `ferry run --control PATH` instead of booting one.
    #[arg(long)]
    pub control: Option<std::path::PathBuf>,
    /// With --control: resume the VM's postcopy whose automatic recovery
    /// ran out of time (its source is paused with every page), to --to.
    /// The destination must still be waiting (its --recover-timeout).
    #[arg(long, requires = "control")]
    pub resume: bool,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub migration: MigrationArgs,
}

pub fn run(a: MigrateArgs) -> Result<ExitCode, CmdError> {
    if let Some(socket) = &a.local {
        return super::local::migrate(&a, socket);
    }
    check_address(&a.to)?;
    if let Some(path) = &a.control {
        if a.migration.predict {
            return Err(CmdError::Usage(
                "--predict samples a VM this command boots; with --control it is not available yet"
                    .into(),
            ));
        }
        if a.resume {
            return resume_via_control(path, &a);
        }
        return via_control(path, &a);
    }
    let (opts, tls) = a.migration.options()?;
    let workload = a.workload.workload().map_err(CmdError::Usage)?;
    let config = a.backend.config(workload);
    let mut vm = vms::create(a.backend.kind(), &config, &a.backend, vms::Role::Source)?;
    let summary = boot_and_migrate(&mut *vm, &a.to, &a.migration, opts, tls)?;
    Ok(finish(&mut *vm, &summary, a.migration.json))
}

/// Asks a `ferry run --control` whose postcopy failed to resume it.
fn resume_via_control(path: &std::path::Path, a: &MigrateArgs) -> Result<ExitCode, CmdError> {
    let req = serde_json::json!({"cmd": "resume", "to": a.to});
    let reply = crate::control::request(path, &req).map_err(|e| CmdError::Failed(chain(&e)))?;
    Ok(print_control_reply(&reply, a.migration.json))
}

/// Asks a running `ferry run --control` to migrate its VM.
fn via_control(path: &std::path::Path, a: &MigrateArgs) -> Result<ExitCode, CmdError> {
    // The same refusals as a migration this command runs itself.
    a.migration.options()?;
    let set = serde_json::json!({
        "cmd": "set",
        "downtime_ms": a.migration.downtime_ms,
        "bandwidth_mib_s": a.migration.bandwidth_mib_s,
        "max_rounds": a.migration.max_rounds,
    });
    crate::control::request(path, &set).map_err(|e| CmdError::Failed(chain(&e)))?;
    // Ctrl-C here cancels the VM's migration; its summary still comes back.
    let socket = path.to_path_buf();
    crate::signals::on_stop(move || {
        let cancel = serde_json::json!({"cmd": "cancel"});
        if let Err(e) = crate::control::request(&socket, &cancel) {
            eprintln!(
                "ferry: cannot cancel through {}: {}",
                socket.display(),
                chain(&e)
            );
        }
    });
    let req = serde_json::json!({
        "cmd": "migrate",
        "to": a.to,
        "verify_before_resume": a.migration.verify_before_resume,
        "connections": a.migration.connections,
        "stall_timeout_s": a.migration.stall_timeout_s,
        "compress": a.migration.compress.to_string(),
        "tls_dir": a.migration.tls_dir,
        "delta_cache_mib": if a.migration.delta { a.migration.delta_cache >> 20 } else { 0 },
        "converge": a.migration.converge.map(|c| c.to_string()),
        "max_downtime_ms": a.migration.max_downtime_ms,
        "give_up_after_s": a.migration.give_up_after_s,
        "mode": a.migration.mode.name(),
        "postcopy_after_rounds": a.migration.postcopy_after_rounds,
        "on_stall": a.migration.on_stall,
        "recover_timeout_s": a.migration.recover_timeout_s,
    });
    let reply = crate::control::request(path, &req).map_err(|e| CmdError::Failed(chain(&e)))?;
    Ok(print_control_reply(&reply, a.migration.json))
}

/// Prints the control socket's answer to a migration (one JSON line, or
/// pretty) and returns the exit code it means.
fn print_control_reply(reply: &serde_json::Value, json: bool) -> ExitCode {
    if json {
        println!("{reply}");
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(reply).unwrap_or_default()
        );
    }
    if reply["status"] == "completed" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Refuses a destination that cannot be reached before any VM is booted:
/// a TCP name that does not resolve, a malformed `unix:` or `fd:`.
fn check_address(to: &str) -> Result<(), CmdError> {
    use crate::endpoint::Endpoint;
    use std::net::ToSocketAddrs;
    let to = match to.parse::<Endpoint>().map_err(CmdError::Usage)? {
        Endpoint::Tcp(addr) => addr,
        Endpoint::Unix(_) | Endpoint::Fds(_) => return Ok(()),
    };
    let to = to.as_str();
    match to.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(CmdError::Usage(format!(
            "--to {to}: the name has no address"
        ))),
        Err(e) => Err(CmdError::Usage(format!(
            "--to {to}: not a destination address (expected HOST:PORT): {e}"
        ))),
    }
}

/// Refuses a convergence policy the VM's backend cannot serve, before the
/// guest boots (the engine's own check, asked early).
pub fn check_policy(vm: &mut dyn Vm, converge: Option<ConvergeMode>) -> Result<(), CmdError> {
    let kvm = vm.vmm_id() == ferry_kvm_memstress::VMM_ID;
    match (ferry_engine::converge::choose(converge, vm), converge) {
        (Err(ferry_engine::MigrationError::Refused(why)), Some(mode)) => {
            // ferry's kvm VM meters each vCPU only through its dirty ring.
            let hint = match mode {
                ConvergeMode::Quota | ConvergeMode::DirtyLimit if kvm => {
                    "; the kvm VM meters each vCPU with its dirty ring: use --dirty-tracking ring"
                }
                _ => "",
            };
            Err(CmdError::Usage(format!("--converge {mode}: {why}{hint}")))
        }
        (Err(e), _) => Err(CmdError::Usage(chain(&e))),
        (Ok(_), _) => Ok(()),
    }
}

/// Starts the guest, warms it up, and migrates it to `to`.
pub fn boot_and_migrate(
    vm: &mut dyn Vm,
    to: &str,
    m: &MigrationArgs,
    opts: PrecopyOptions,
    tls: Option<TlsConfig>,
) -> Result<MigrationSummary, CmdError> {
    if !(0.0..=3600.0).contains(&m.warmup) {
        return Err(CmdError::Usage("--warmup must be 0 to 3600 seconds".into()));
    }
    check_policy(vm, opts.converge)?;
    // A signal before the migration starts stops the warm-up (the flag is
    // read there); once it runs, the signal cancels it (migrate_running).
    // Either way the process ends within the stall timeout.
    crate::signals::exit_within(Duration::from_secs(m.stall_timeout_s));
    crate::signals::on_stop(|| {});
    vm.start()?;
    let mut since = Some(warm_up(vm, Duration::from_secs_f64(m.warmup))?);
    if m.idle {
        // The rate before must be the idle guest's.
        since = None;
        let vcpus = vm.vcpus();
        set_write_percent(vm.ram(), vcpus, 0).map_err(|e| CmdError::Failed(e.to_string()))?;
    }
    let predicted = if m.predict {
        if !(0.1..=60.0).contains(&m.predict_secs) {
            return Err(CmdError::Usage("--predict-secs must be 0.1 to 60".into()));
        }
        eprintln!("ferry: sampling the guest's dirty rate to predict the migration ...");
        let p = crate::predict::sample_and_predict(
            vm,
            &opts.tunables,
            m.link_bytes_per_sec,
            Duration::from_secs_f64(m.predict_secs),
            opts.harvest_within_rounds,
        )?;
        if !m.json {
            println!("{}", crate::predict::render(&p));
        }
        // The guest ran slower while tracked: the rate before must not be that.
        since = None;
        Some(p)
    } else {
        None
    };
    let (mut summary, _) = migrate_running(vm, to, opts, tls.as_ref(), since, None, &NoProgress);
    summary.predicted = predicted;
    Ok(summary)
}

/// Migrates a running VM to `to`. Never fails: a failure is a summary with
/// status "failed" (and the VM still running).
/// With `resume`, resumes that failed postcopy instead (see
/// [`ferry_engine::resume_postcopy`]). Also returns the token to resume with
/// when a postcopy failed. `observer` hears the engine's progress besides
/// the progress bar (the control socket's monitor).
pub fn migrate_running(
    vm: &mut dyn Vm,
    to: &str,
    opts: PrecopyOptions,
    tls: Option<&TlsConfig>,
    since: Option<Sample>,
    resume: Option<PostcopyResume>,
    observer: &dyn Progress,
) -> (MigrationSummary, Option<PostcopyResume>) {
    // The delta cache never needs more than the guest's memory.
    let mut opts = opts;
    opts.delta_cache_bytes = opts.delta_cache_bytes.min(vm.ram().size());
    let started = Instant::now();
    let dialer: Box<dyn Dial> = match to
        .parse::<crate::endpoint::Endpoint>()
        .and_then(|e| e.dialer(tls))
    {
        Ok(d) => d,
        Err(error) => {
            eprintln!("ferry: error: migration failed, the source VM keeps running: {error}");
            return (
                failed_summary(vm, &opts, true, started.elapsed(), error),
                resume,
            );
        }
    };
    let watch = ShareWatch::start(vm, since);
    // SIGINT or SIGTERM cancels the migration: the engine rolls back, the
    // destination is told, the source VM runs on, the summary is printed.
    let cancel = Arc::clone(&opts.tunables);
    crate::signals::on_stop(move || cancel.cancel());
    if crate::signals::received().is_some() {
        opts.tunables.cancel();
    }
    let bar = MigrationBar::new(std::io::stderr().is_terminal());
    let progress = Both(&bar, observer);
    let (mut summary, result) = match &resume {
        Some(token) => ferry_engine::resume_postcopy(vm, &*dialer, &opts, token, &progress),
        None => ferry_engine::migrate_accounted(vm, &*dialer, &opts, &progress),
    };
    bar.finish();
    let token = match &result {
        Err(ferry_engine::MigrationError::Postcopy { resume, .. }) => Some(*resume),
        _ => None,
    };
    if let Err(e) = result {
        let mut error = chain(&e);
        if matches!(e, ferry_engine::MigrationError::GaveUp { .. }) {
            error = format!("{error} (--give-up-after)");
        } else if let Some(sig) = crate::signals::received() {
            error = format!("stopped by {sig}: {error}");
        }
        if matches!(e, ferry_engine::MigrationError::Postcopy { .. }) {
            eprintln!("ferry: error: {error}");
        } else {
            eprintln!("ferry: error: migration failed, the source VM keeps running: {error}");
        }
        summary.error = Some(error);
    }
    if let Some(w) = watch {
        // A completed migration paused the guest downtime_ms before its end.
        let ran = (summary.total_ms - summary.downtime_ms).max(0.0);
        summary.vcpu_shares = w.finish(vm, Duration::from_secs_f64(ran / 1e3));
    }
    (summary, token)
}

/// The summary of a migration that ended in an error before it produced one.
fn failed_summary(
    vm: &mut dyn Vm,
    opts: &PrecopyOptions,
    tls: bool,
    took: Duration,
    error: String,
) -> MigrationSummary {
    MigrationSummary {
        total_ms: took.as_secs_f64() * 1e3,
        error: Some(error),
        ..ferry_engine::precopy::fresh_summary(vm, opts, opts.connections, tls)
    }
}

/// Runs the guest until every vCPU finished a pass and `at_least` has passed.
/// Returns the guest's counters as they were when every vCPU had finished
/// its first pass (the start of its steady rate).
fn warm_up(vm: &dyn Vm, at_least: Duration) -> Result<Sample, CmdError> {
    let vcpus = vm.vcpus();
    let start = Instant::now();
    eprintln!("ferry: warming up the guest ...");
    let mut steady: Option<Sample> = None;
    loop {
        vm.check_health()?;
        if let Some(sig) = crate::signals::received() {
            return Err(CmdError::Failed(format!(
                "stopped by {sig} while the guest warmed up; nothing was migrated"
            )));
        }
        let p = read_progress(vm.ram(), vcpus).map_err(|e| CmdError::Failed(e.to_string()))?;
        if steady.is_none() && p.iter().all(|v| v.passes >= 1) {
            steady = Some((p.clone(), Instant::now()));
        }
        if let Some(s) = steady.as_ref().filter(|_| start.elapsed() >= at_least) {
            return Ok(s.clone());
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err(CmdError::Failed(format!(
                "the guest did not finish a pass in 10 minutes: {p:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The line that shows a failed migration's source guest still runs: the
/// page accesses its vCPUs made over half a second (a pass over a large
/// region can take longer than that on a slow host; an access cannot),
/// with the passes and the stamp mismatches so far. Also the mismatches.
pub(crate) fn source_still_runs(vm: &dyn Vm) -> (String, u64) {
    let vcpus = vm.vcpus();
    let before = read_progress(vm.ram(), vcpus).unwrap_or_default();
    std::thread::sleep(Duration::from_millis(500));
    let after = read_progress(vm.ram(), vcpus).unwrap_or_default();
    let delta = |f: fn(&VcpuProgress) -> u64| -> u64 {
        after
            .iter()
            .zip(&before)
            .map(|(a, b)| f(a).saturating_sub(f(b)))
            .sum()
    };
    let mismatches: u64 = after.iter().map(|p| p.mismatches).sum();
    let line = format!(
        "the source VM is still running: {} guest page accesses in the last 0.5 s ({} passes), {mismatches} guest mismatches",
        delta(|p| p.accesses),
        delta(|p| p.passes),
    );
    (line, mismatches)
}

/// Prints the summary and picks the exit code. On failure, shows that the
/// source VM still runs.
pub fn finish(vm: &mut dyn Vm, s: &MigrationSummary, json: bool) -> ExitCode {
    let mut s = s.clone();
    let ok = s.status == Outcome::Completed
        && s.digest_match
        && s.guest_mismatches.unwrap_or(0) == 0
        && s.error.is_none();
    if s.status == Outcome::Failed && vm.is_running() {
        // Show that the guest survived: it still makes progress, and its own
        // stamp checks still pass.
        let (line, mismatches) = source_still_runs(vm);
        s.mismatches_before = Some(mismatches);
        s.guest_mismatches = Some(mismatches);
        println!("{line}");
    }
    println!("{}", summary::render(&s));
    if json {
        println!("{}", summary::json(&s));
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
