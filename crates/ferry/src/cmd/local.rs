//! `ferry migrate --local` and `ferry receive --local`: same-host live
//! upgrade through the engine's `local` module. The source's memory must
//! be on memfd (`--backing memfd`); the destination maps the same files.

use super::migrate::MigrateArgs;
use super::receive::ReceiveArgs;
use super::CmdError;
use crate::vms;
use ferry_engine::local::{
    await_local, listen_local, migrate_local, receive_local, LocalOptions, LocalSummary,
};
use ferry_engine::wire::StreamHeader;
use ferry_memstress::MemstressProbe;
use ferry_vm::{error_chain as chain, Backing, GuestRam, Vm, VmError};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

fn opts() -> LocalOptions {
    {
        let mut o = LocalOptions::default();
        o.probe = Some(Arc::new(MemstressProbe));
        o
    }
}

fn report(s: &LocalSummary, json: bool) {
    eprintln!(
        "ferry: same-host migration {:?}: {} of memory mapped, not copied; downtime {:.2} ms, total {:.1} ms, digest {}",
        s.status,
        ferry_vm::types::human_bytes(s.memory_bytes),
        s.downtime_ms,
        s.total_ms,
        if s.digest_match { "match" } else { "MISMATCH" }
    );
    if json {
        println!("{}", serde_json::to_string(s).expect("summary serializes"));
    }
}

/// `ferry migrate --local SOCKET`.
pub fn migrate(a: &MigrateArgs, socket: &Path) -> Result<ExitCode, CmdError> {
    let workload = a.workload.workload().map_err(CmdError::Usage)?;
    let config = a.backend.config(workload);
    if config.backing != Backing::Memfd {
        // Refused before the VM boots, in the engine's words.
        return Err(CmdError::Usage(
            ferry_engine::local::LocalError::NotFileBacked.to_string(),
        ));
    }
    let mut vm = vms::create(a.backend.kind(), &config, &a.backend, vms::Role::Source)?;
    vm.start()?;
    std::thread::sleep(Duration::from_secs_f64(
        a.migration.warmup.clamp(0.0, 3600.0),
    ));
    match migrate_local(&mut *vm, socket, &opts()) {
        Ok(s) => {
            report(&s, a.migration.json);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let running = vm.is_running();
            eprintln!(
                "ferry: the same-host migration failed: {}; the VM {}",
                chain(&e),
                if running {
                    "runs on here"
                } else {
                    "is paused here (see above)"
                }
            );
            if running {
                println!("{}", super::migrate::source_still_runs(&*vm).0);
            }
            Ok(ExitCode::from(1))
        }
    }
}

/// `ferry receive --local SOCKET`.
pub fn receive(a: &ReceiveArgs, socket: &Path) -> Result<ExitCode, CmdError> {
    let listener = listen_local(socket).map_err(|e| CmdError::Failed(chain(&e)))?;
    // Up before the VM arrives (inmigrate), as on the network path.
    let (shared, commands) = super::receive::arrival_monitor(a)?;
    // The demo (and scripts) read this line.
    println!("listening on {}", socket.display());
    std::io::stdout().flush().ok();
    let opts = opts();
    let incoming = match await_local(&listener, &opts) {
        Ok(incoming) => incoming,
        Err(e) => {
            super::receive::remove_sockets(a);
            return Err(CmdError::Failed(chain(&e)));
        }
    };
    shared.monitor.begin_incoming();
    let backend = a.backend.clone();
    let mut create = |h: &StreamHeader, ram: GuestRam| -> Result<Box<dyn Vm>, VmError> {
        let (kind, cfg) = vms::from_stream(&h.vmm, &h.vmm_config, ram.backing())?;
        vms::create_on_ram(kind, &cfg, &backend, ram)
    };
    let received = receive_local(incoming, &mut create, &opts);
    let _ = std::fs::remove_file(socket);
    let (mut vm, s) = match received {
        Ok(r) => r,
        Err(e) => {
            shared.arrival_failed(chain(&e));
            super::receive::remove_sockets(a);
            return Err(CmdError::Failed(chain(&e)));
        }
    };
    shared.arrived(&*vm, false, None);
    shared.monitor.finish_incoming(
        s.status,
        s.memory_bytes,
        (s.total_ms, s.downtime_ms),
        s.error.clone(),
        serde_json::to_value(&s).unwrap_or_default(),
    );
    let at_resume = s.guest.unwrap_or_default();
    let after =
        crate::guest_check::after_switchover(&*vm, at_resume, Duration::from_secs_f64(a.run_after));
    report(&s, a.json);
    eprintln!(
        "ferry receive: {} guest passes after the switchover, {} mismatches",
        after.since_resume.progress, after.since_resume.errors
    );
    if let Some(p) = &after.problem {
        eprintln!("ferry receive: the guest after switchover: {p}");
    }
    let ok = s.digest_match && after.since_resume.errors == 0 && after.problem.is_none();
    if ok && !a.exit_after_report {
        eprintln!("ferry receive: guest running here; Ctrl-C to stop");
        let serve = super::receive::serving(a);
        return super::run::serve_vm_on(&mut *vm, &serve, shared, commands);
    }
    super::receive::remove_sockets(a);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
