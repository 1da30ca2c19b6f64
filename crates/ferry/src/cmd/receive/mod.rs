//! `ferry receive`: the destination. Listens, receives one migration, then
//! keeps running the guest ([`crate::serve`]). A same-host upgrade's
//! destination is [`local`].

mod local;

use crate::args::{parse_size, BackendArgs, PagingArgs};
use crate::control::{self, VmCommand};
use crate::error::CmdError;
use crate::serve::{serve_vm_on, Serve};
use crate::vms;
use clap::Args;
use ferry_engine::custody::CopyState;
use ferry_engine::postcopy::DEFAULT_RECOVER_TIMEOUT;
use ferry_engine::precopy::{DEFAULT_STALL_TIMEOUT, RECOVER_TIMEOUT_SECS, STALL_TIMEOUT_SECS};
use ferry_engine::wire::StreamHeader;
use ferry_engine::{
    ExpectedVm, MigrationError, Outcome, ReceiveOptions, ReceiveSummary, TransportError,
};
use ferry_harness::child::LISTENING_ON;
use ferry_memstress::MemstressProbe;
use ferry_vm::types::human_bytes;
use ferry_vm::{error_chain as chain, Blocker, Vm, VmError};
use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `ferry receive`.
#[derive(Args, Debug)]
pub struct ReceiveArgs {
    /// Where to wait for the migration: HOST:PORT (TCP, e.g. 0.0.0.0:7070,
    /// or 127.0.0.1:0 for any free port), `unix:PATH` (a UNIX socket), or
    /// `fd:N,M,...` (connected sockets this process inherited, in the order
    /// the source opens them).
    #[arg(
        long,
        required_unless_present = "local",
        default_value = "",
        hide_default_value = true
    )]
    pub listen: String,
    /// Same-host live upgrade: take the VM from a `ferry migrate --local`
    /// on this UNIX socket, mapping its memory files instead of receiving
    /// a copy.
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["listen", "tls_dir"])]
    pub local: Option<std::path::PathBuf>,
    /// Guest memory this destination has room for (all vCPUs' regions, e.g. 1G).
    /// A stream carrying another size is refused.
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// The most device state (the VMM's sections at the switchover) this
    /// destination takes, e.g. 512M. A source whose sections declare more
    /// is refused before any memory moves, naming the largest.
    #[arg(long, value_parser = parse_size, default_value = "4G")]
    pub max_device_state: u64,
    /// vCPUs this destination will run; a stream with another count is refused.
    #[arg(long)]
    pub vcpus: Option<u32>,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Seconds to run the guest after switchover before reporting its own
    /// checks (and on until every vCPU has completed a pass here, at most 120 s).
    #[arg(long = "run-after", default_value_t = 1.0)]
    pub run_after: f64,
    /// Verify the memory digest before resuming the guest (longer downtime).
    #[arg(long = "verify-before-resume")]
    pub verify_before_resume: bool,
    /// Seconds the link may stand still before the migration fails (no
    /// guest is started here then).
    #[arg(long = "stall-timeout", default_value_t = DEFAULT_STALL_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(STALL_TIMEOUT_SECS))]
    pub stall_timeout_s: u64,
    #[command(flatten)]
    pub paging: PagingArgs,
    /// Postcopy: when the connections break after the switchover, run the
    /// guest on and wait this many seconds for the source to reconnect
    /// (`ferry migrate` retries for its own --recover-timeout). 0: give up
    /// at once and pause the guest.
    #[arg(long = "recover-timeout", value_name = "SECS", default_value_t = DEFAULT_RECOVER_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(RECOVER_TIMEOUT_SECS))]
    pub recover_timeout_s: u64,
    /// Mutual TLS: accept only sources with a certificate from `ca.pem` in
    /// this directory, and serve `cert.pem` / `key.pem` (`ferry certs DIR`
    /// writes a throwaway set). Plaintext sources are refused.
    #[arg(long = "tls-dir", value_name = "DIR")]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Refuse postcopy: a source that may switch to it (`--mode postcopy`
    /// or `hybrid`) is told so before any memory moves, and a precopy
    /// migration runs as usual.
    #[arg(long = "no-postcopy")]
    pub no_postcopy: bool,
    /// Offer a migrating guest a CPU without these features (comma
    /// separated, as /proc/cpuinfo names them: `avx2,avx512f`), as a fleet's
    /// baseline CPU model does: a guest that was given one of them is
    /// refused before any memory moves, naming it. kvm backend only.
    #[arg(long = "cpu-without", value_delimiter = ',', value_name = "FEATURES")]
    pub cpu_without: Vec<String>,
    /// Give up if no migration has arrived after this many seconds (by
    /// default, wait for one as long as it takes).
    #[arg(long = "wait", value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub wait_s: Option<u64>,
    /// Exit after reporting instead of running the guest on.
    #[arg(long = "exit-after-report")]
    pub exit_after_report: bool,
    /// For tests: overwrite the guest's code with `ud2` once it resumes
    /// here, so that its vCPUs fault (on kvm a triple fault: the memstress
    /// guest has no IDT) and the failure path is exercised.
    #[arg(long = "break-guest-after-resume", hide = true)]
    pub break_guest: bool,
    /// Once the guest runs here, serve a control socket at this path, as
    /// `ferry run --control` does: status, live settings, QMP's commands
    /// (`ferry ctl`), and a migration onward to another `ferry receive`.
    #[arg(long, value_name = "PATH", conflicts_with = "exit_after_report")]
    pub control: Option<std::path::PathBuf>,
    /// Once the guest runs here, serve a QMP socket at this path, as
    /// `ferry run --qmp` does (a greeting, then QMP only).
    #[arg(long, value_name = "PATH", conflicts_with = "exit_after_report")]
    pub qmp: Option<std::path::PathBuf>,
    /// Print the destination's summary as one JSON line.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ReceiveArgs) -> Result<ExitCode, CmdError> {
    // A misspelt feature is refused now, not when a migration arrives.
    ferry_kvm::cpu_check::HostCpu::from_parts(&[], Vec::new())
        .without(&a.cpu_without)
        .map_err(|e| CmdError::Usage(format!("--cpu-without: {e}")))?;
    if !(0.0..=3600.0).contains(&a.run_after) {
        return Err(CmdError::Usage(
            "--run-after must be 0 to 3600 seconds".into(),
        ));
    }
    if let Some(socket) = &a.local {
        return local::receive(&a, socket);
    }
    let endpoint: crate::endpoint::Endpoint = a.listen.parse().map_err(CmdError::Usage)?;
    if a.tls_dir.is_some() && !matches!(endpoint, crate::endpoint::Endpoint::Tcp(_)) {
        return Err(CmdError::Usage(format!(
            "--tls-dir runs over TCP, not {endpoint}"
        )));
    }
    let tls = crate::tls::load_tls(a.tls_dir.as_deref())?;
    let (listener, local) = endpoint.listener(tls.as_ref()).map_err(CmdError::Failed)?;
    // Nothing to roll back on this side: a stop ends it, and the source
    // sees the connection go (its guest runs on there).
    let sockets = monitor_sockets(&a);
    crate::signals::exit_within(Duration::from_secs(a.stall_timeout_s));
    crate::signals::on_stop(move || {
        let sig = crate::signals::received().unwrap_or("a signal");
        eprintln!("ferry receive: stopped by {sig}; the source keeps its VM");
        for path in &sockets {
            let _ = std::fs::remove_file(path);
        }
        std::process::exit(130);
    });
    let (shared, commands) = arrival_monitor(&a)?;
    // The demo (and scripts) read this line to learn the port.
    println!("{LISTENING_ON}{local}");
    std::io::stdout().flush().ok();
    let deadline = a
        .wait_s
        .map(|s| std::time::Instant::now() + Duration::from_secs(s));
    // A connection that is not a migration (a port scanner, another
    // program, a wrong version) is refused with the reason, sent to it as
    // well, and the destination keeps listening; only the listening socket
    // failing ends it.
    let incoming = loop {
        match ferry_engine::await_migration(&*listener, deadline) {
            Ok(incoming) => break incoming,
            Err(
                e @ MigrationError::Transport(
                    TransportError::Listen { .. } | TransportError::AcceptTimeout { .. },
                ),
            ) => {
                remove_sockets(&a);
                return Err(CmdError::Failed(chain(&e)));
            }
            Err(e) => eprintln!(
                "ferry receive: refused a connection: {}; still listening on {local}",
                chain(&e)
            ),
        }
    };
    eprintln!(
        "ferry receive: migration from {} over {} data connection(s)",
        incoming.peer(),
        incoming.connections()
    );
    shared.monitor.begin_incoming();

    let opts = {
        let mut o = ReceiveOptions::default();
        o.expect = Some(ExpectedVm {
            memory_bytes: None,
            vcpus: a.vcpus,
            // On auto, whichever of ferry's backends the stream names.
            vmm: (a.backend.backend != "auto").then(|| a.backend.kind().vmm_id().to_string()),
        });
        o.verify_before_resume = a.verify_before_resume;
        o.stall_timeout = Duration::from_secs(a.stall_timeout_s);
        o.placement = a.paging.placement;
        o.prefetch = a.paging.prefetch;
        o.recover_timeout = Duration::from_secs(a.recover_timeout_s);
        o.vcpu_fault_exits = a.paging.fault_path == "auto";
        o.fault_handlers = usize::from(a.paging.fault_handlers);
        o.fault_busy_poll = a.paging.busy_poll;
        o.probe = Some(Arc::new(MemstressProbe));
        o.max_device_bytes = a.max_device_state;
        o.blockers = if a.no_postcopy {
            vec![Blocker::postcopy(
                "this destination was started with --no-postcopy",
            )]
        } else {
            Vec::new()
        };
        o
    };
    let memory = a.memory;
    let cpu_without = a.cpu_without.clone();
    let backend = a.backend.clone();
    let mut create = move |header: &StreamHeader| -> Result<Box<dyn Vm>, VmError> {
        let (kind, cfg) = vms::from_stream(&header.vmm, &header.vmm_config, backend.backing())?;
        let carried = cfg.workload.bytes_per_vcpu * u64::from(cfg.workload.vcpus);
        if let Some(have) = memory.filter(|&m| m != carried) {
            return Err(VmError::Operation {
                backend: kind.to_string(),
                what: format!(
                    "destination has {} of guest memory, stream carries {}",
                    human_bytes(have),
                    human_bytes(carried)
                ),
                source: None,
            });
        }
        vms::create_destination(kind, &cfg, &backend, &cpu_without)
    };
    let received = ferry_engine::receive(incoming, &*listener, &mut create, &opts);
    let (mut vm, mut summary) = match received {
        Ok(r) => r,
        Err(e) => {
            shared.arrival_failed(chain(&e));
            remove_sockets(&a);
            return Err(CmdError::Failed(chain(&e)));
        }
    };
    // Before the `completed` event: a client that reads it and asks finds
    // the VM here.
    shared.arrived(&*vm, summary.paused, summary.held.clone());
    shared.monitor.finish_incoming(
        summary.status,
        vm.ram().size(),
        (summary.total_ms, summary.resume_ms),
        summary.held.clone(),
        serde_json::to_value(&summary).unwrap_or_default(),
    );
    let mut problem = None;
    if summary.paused {
        eprintln!("ferry receive: the guest arrived paused, as it was on the source");
    } else if let (Outcome::Completed, Some(at_resume)) = (summary.status, summary.guest_at_resume)
    {
        let run_after = Duration::from_secs_f64(a.run_after);
        if a.break_guest {
            break_guest(&*vm);
        }
        let after = crate::guest_check::after_switchover(&*vm, at_resume, run_after);
        summary.passes_after = Some(after.since_resume.progress);
        summary.mismatches_after = Some(after.since_resume.errors);
        problem = after.problem;
    }
    if a.json {
        // The summary, and what became of the guest here after the
        // switchover (a vCPU that stopped): the demo's verdict needs both.
        let mut j = serde_json::to_value(&summary).expect("summary serializes");
        j["guest_error"] = problem.clone().into();
        println!("{j}");
    }
    if summary.status == Outcome::Held {
        if monitor_sockets(&a).is_empty() {
            let why = summary.held.clone().unwrap_or_default();
            return Err(CmdError::Failed(format!(
                "{why}; without --control (or --qmp) this process cannot hold the paused copy \
                 for an operator's cont, so it is discarded (the source resumed its own copy \
                 unless it got this side's verdict: see its summary)"
            )));
        }
        return serve_vm_on(&mut *vm, &serving(&a), shared, commands);
    }
    report(&a, &mut *vm, &summary, problem, shared, commands)
}

/// The monitor sockets this destination serves (`--control`, `--qmp`).
fn monitor_sockets(a: &ReceiveArgs) -> Vec<std::path::PathBuf> {
    [&a.control, &a.qmp]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
}

/// Removes them, on an exit that does not serve the guest.
fn remove_sockets(a: &ReceiveArgs) {
    for path in monitor_sockets(a) {
        let _ = std::fs::remove_file(path);
    }
}

/// `--break-guest-after-resume`: every byte of the memstress guest's code
/// becomes `ud2` (0f 0b); a vCPU faults at its next instruction fetch.
fn break_guest(vm: &dyn Vm) {
    let code = ferry_memstress::CODE_GPA.0;
    for at in (code..code + ferry_memstress::CODE_MAX as u64).step_by(8) {
        let _ = vm.ram().store_u64(ferry_vm::Gpa(at), 0x0b0f_0b0f_0b0f_0b0f);
    }
    eprintln!("ferry receive: broke the guest's code on purpose (--break-guest-after-resume)");
}

/// The destination's monitor, up before the migration arrives, as QEMU's
/// destination monitor is (run state `inmigrate`), and following it.
fn arrival_monitor(a: &ReceiveArgs) -> Result<(control::Shared, Receiver<VmCommand>), CmdError> {
    let (shared, commands) = control::Shared::new(CopyState::Arriving, 0)
        .map_err(|e| CmdError::Failed(format!("cannot start the monitor's event thread: {e}")))?;
    shared
        .serve_sockets(a.control.as_deref(), a.qmp.as_deref())
        .map_err(|e| CmdError::Failed(chain(&e)))?;
    Ok((shared, commands))
}

/// How the arrived guest is served: its monitor stays up after a
/// migration onward only with `--qmp`, as QEMU's does.
fn serving(a: &ReceiveArgs) -> Serve {
    Serve {
        interval: Duration::from_secs(1),
        duration: None,
        control: a.control.clone(),
        qmp: a.qmp.clone(),
        stay_after_migration: a.qmp.is_some(),
    }
}

/// Reports how the arrival went, then serves the guest, or exits with the
/// verdict.
fn report(
    a: &ReceiveArgs,
    vm: &mut dyn Vm,
    summary: &ReceiveSummary,
    problem: Option<String>,
    shared: control::Shared,
    commands: Receiver<VmCommand>,
) -> Result<ExitCode, CmdError> {
    let before = summary.guest_at_resume.unwrap_or_default().errors;
    let after = summary.mismatches_after.unwrap_or(0);
    eprintln!(
        "ferry receive: {:?}: resumed in {:.1} ms, digest {}, {} passes after switchover, mismatches {before} before / {after} after",
        summary.status,
        summary.resume_ms,
        if summary.digest_match { "match" } else { "MISMATCH" },
        summary.passes_after.unwrap_or(0),
    );
    if let Some(p) = &problem {
        eprintln!("ferry receive: the guest after switchover: {p}");
    }
    let ok = summary.digest_match && after == 0 && problem.is_none();
    if !a.exit_after_report && ok {
        if summary.paused {
            eprintln!(
                "ferry receive: guest paused here, as it was at the source; cont resumes it; \
                 Ctrl-C to stop"
            );
        } else {
            eprintln!("ferry receive: guest running here; Ctrl-C to stop");
        }
        return serve_vm_on(vm, &serving(a), shared, commands);
    }
    remove_sockets(a);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
