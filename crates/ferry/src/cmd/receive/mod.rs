//! `ferry receive`: the destination. Listens, receives one migration, then
//! keeps running the guest ([`crate::serve`]). A same-host upgrade's
//! destination is [`local`].

mod args;
mod local;
mod report;

pub use args::ReceiveArgs;

use crate::control::{self, VmCommand};
use crate::error::CmdError;
use crate::serve::serve_vm_on;
use crate::vms;
use ferry_engine::custody::CopyState;
use ferry_engine::vmm::StreamHeader;
use ferry_engine::{MigrationError, Outcome, TransportError};
use ferry_harness::child::LISTENING_ON;
use ferry_vm::types::human_bytes;
use ferry_vm::{error_chain as chain, Vm, VmError};
use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc::Receiver;
use std::time::Duration;

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
    let sockets = a.monitor_sockets();
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
                a.remove_sockets();
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

    let opts = a.receive_options();
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
            a.remove_sockets();
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
            report::break_guest(&*vm);
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
        if a.monitor_sockets().is_empty() {
            let why = summary.held.clone().unwrap_or_default();
            return Err(CmdError::Failed(format!(
                "{why}; without --control (or --qmp) this process cannot hold the paused copy \
                 for an operator's cont, so it is discarded (the source resumed its own copy \
                 unless it got this side's verdict: see its summary)"
            )));
        }
        return serve_vm_on(&mut *vm, &a.serving(), shared, commands);
    }
    report::report(&a, &mut *vm, &summary, problem, shared, commands)
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
