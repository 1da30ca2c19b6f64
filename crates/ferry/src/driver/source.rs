//! The source's side of a migration this process runs: boot and warm the
//! guest up, predict if asked, then migrate the running VM with a progress
//! bar, signals cancelling it and every failure a summary.

use super::args::MigrationArgs;
use crate::error::CmdError;
use crate::progress_bar::MigrationBar;
use crate::vcpu_share::{Sample, ShareWatch};
use ferry_engine::choices::ConvergeMode;
use ferry_engine::{Both, Dial, MigrationSummary, NoProgress, PostcopyResume, Progress};
use ferry_engine::{PrecopyOptions, TlsConfig};
use ferry_memstress::{read_progress, set_write_percent};
use ferry_vm::error_chain as chain;
use ferry_vm::Vm;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
        let p = crate::forecast::sample_and_predict(
            vm,
            &opts.tunables,
            m.link_bytes_per_sec,
            Duration::from_secs_f64(m.predict_secs),
            opts.harvest_within_rounds,
        )?;
        if !m.json {
            println!("{}", crate::forecast::render(&p));
        }
        // The guest ran slower while tracked: the rate before must not be that.
        since = None;
        Some(p)
    } else {
        None
    };
    let (mut summary, _) = migrate_running(vm, to, opts, tls.as_ref(), since, None, &NoProgress);
    summary.convergence.predicted = predicted;
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
        summary.convergence.vcpu_shares = w.finish(vm, Duration::from_secs_f64(ran / 1e3));
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
        ..MigrationSummary::failed_before_start(vm, opts, tls, error)
    }
}

/// Runs the guest until every vCPU finished a pass and `at_least` has passed.
/// Returns the guest's counters as they were when every vCPU had finished
/// its first pass (the start of its steady rate).
pub fn warm_up(vm: &dyn Vm, at_least: Duration) -> Result<Sample, CmdError> {
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
