//! `ferry migrate --control SOCKET`: the control socket's client for a
//! migration of the VM a `ferry run --control` runs, with this command's
//! flags as the request's settings, and for the resume of its failed
//! postcopy (`--resume`).

use super::MigrateArgs;
use crate::error::CmdError;
use ferry_vm::error_chain as chain;
use std::process::ExitCode;

/// Asks a `ferry run --control` whose postcopy failed to resume it.
pub fn resume(path: &std::path::Path, a: &MigrateArgs) -> Result<ExitCode, CmdError> {
    let req = serde_json::json!({"cmd": "resume", "to": a.to});
    let reply = crate::control::request(path, &req).map_err(|e| CmdError::Failed(chain(&e)))?;
    Ok(print_control_reply(&reply, a.migration.json))
}

/// Asks a running `ferry run --control` to migrate its VM.
pub fn migrate(path: &std::path::Path, a: &MigrateArgs) -> Result<ExitCode, CmdError> {
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
        "harvest_within_rounds": a.migration.harvest_within_rounds,
        "connections": a.migration.connections,
        "stall_timeout_s": a.migration.stall_timeout_s,
        "compress": a.migration.compress,
        "tls_dir": a.migration.tls_dir,
        "delta_cache_mib": if a.migration.delta { a.migration.delta_cache >> 20 } else { 0 },
        "converge": a.migration.converge,
        "max_downtime_ms": a.migration.max_downtime_ms,
        "give_up_after_s": a.migration.give_up_after_s,
        "mode": a.migration.mode,
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
