//! `ferry receive --local SOCKET`: the destination of a same-host live
//! upgrade. It maps the source's memory files instead of receiving a copy,
//! then serves the guest as a network destination does.

use super::ReceiveArgs;
use crate::driver::local;
use crate::error::CmdError;
use crate::serve::serve_vm_on;
use crate::vms;
use ferry_engine::local::{await_local, listen_local, receive_local};
use ferry_engine::vmm::StreamHeader;
use ferry_harness::child::LISTENING_ON;
use ferry_vm::{error_chain as chain, GuestRam, Vm, VmError};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// `ferry receive --local SOCKET`.
pub fn receive(a: &ReceiveArgs, socket: &Path) -> Result<ExitCode, CmdError> {
    let listener = listen_local(socket).map_err(|e| CmdError::Failed(chain(&e)))?;
    // Up before the VM arrives (inmigrate), as on the network path.
    let (shared, commands) = super::arrival_monitor(a)?;
    // The demo (and scripts) read this line.
    println!("{LISTENING_ON}{}", socket.display());
    std::io::stdout().flush().ok();
    let opts = local::options();
    let incoming = match await_local(&listener, &opts) {
        Ok(incoming) => incoming,
        Err(e) => {
            a.remove_sockets();
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
            a.remove_sockets();
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
    local::report(&s, a.json);
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
        let serve = a.serving();
        return serve_vm_on(&mut *vm, &serve, shared, commands);
    }
    a.remove_sockets();
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
