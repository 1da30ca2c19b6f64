//! The demo's destination: a `ferry receive` this process starts on the
//! same machine (or in the destination's network namespace), the address
//! it says it listens on, and what it counted of the guest after the
//! switchover, added to the source's summary.

use crate::error::CmdError;
use crate::netns::{NetnsPair, DEST_ADDR};
use crate::summary::DestinationChecks;
use ferry_harness::child::{read_listen_address, ListenError};
use ferry_harness::output::last_json;
use ferry_vm::error_chain as chain;
use std::io::{BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Kills the destination process if the demo ends early.
pub struct Destination(pub Child);

impl Drop for Destination {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts this executable as the demo's `ferry receive`, listening on
/// loopback (or in `netns`'s destination namespace), with `args` (the
/// destination's own flags) and `tls_dir`; its stdout is piped.
pub fn spawn(
    args: &[String],
    tls_dir: Option<&Path>,
    netns: Option<&NetnsPair>,
) -> Result<Destination, CmdError> {
    let exe = std::env::current_exe()
        .map_err(|e| CmdError::Failed(format!("cannot find the ferry executable: {e}")))?;
    let mut cmd = Command::new(exe);
    crate::child::die_with_parent(&mut cmd);
    let listen = match netns {
        Some(pair) => {
            pair.run_in_dest(&mut cmd)
                .map_err(|e| CmdError::Failed(chain(&e)))?;
            format!("{DEST_ADDR}:0")
        }
        None => "127.0.0.1:0".to_string(),
    };
    cmd.args([
        "receive",
        "--listen",
        &listen,
        "--exit-after-report",
        "--json",
    ])
    .args(args)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    if let Some(dir) = tls_dir {
        cmd.arg("--tls-dir").arg(dir);
    }
    let child = cmd
        .spawn()
        .map_err(|e| CmdError::Failed(format!("cannot start the destination process: {e}")))?;
    Ok(Destination(child))
}

/// Reads `listening on ADDR` from the destination's stdout; returns the
/// address and the rest of its stdout.
pub fn read_listen_address_of(
    dest: &mut Destination,
) -> Result<(String, BufReader<std::process::ChildStdout>), CmdError> {
    let stdout = dest
        .0
        .stdout
        .take()
        .ok_or_else(|| CmdError::Failed("destination stdout is not piped".into()))?;
    let mut out = BufReader::new(stdout);
    match read_listen_address(&mut out) {
        Ok(addr) => Ok((addr, out)),
        Err(ListenError::Read(e)) => Err(CmdError::Failed(format!(
            "reading the destination's address: {e}"
        ))),
        Err(ListenError::Said(line)) => Err(CmdError::Failed(format!(
            "the destination did not start (it said {line:?})"
        ))),
    }
}

/// What the destination's guest counted after the switchover (the last line
/// `ferry receive --json` printed): the engine returns at the commit, and
/// only the destination ran the guest after it. Adds its mismatches to the
/// summary's `guest_mismatches`, and returns them with what the destination
/// said became of the guest, if it failed.
pub fn add_destination_checks(
    summary: &mut ferry_engine::MigrationSummary,
    mut out: impl Read,
) -> (DestinationChecks, Option<String>) {
    let mut text = String::new();
    let _ = out.read_to_string(&mut text);
    let Some(j) = last_json(&text) else {
        return (DestinationChecks::default(), None);
    };
    let after = DestinationChecks {
        passes: j["passes_after"].as_u64(),
        mismatches: j["mismatches_after"].as_u64(),
    };
    if let (Some(before), Some(then)) = (summary.guest.mismatches_before, after.mismatches) {
        summary.guest.guest_mismatches = Some(before.saturating_add(then));
    }
    (after, j["guest_error"].as_str().map(str::to_string))
}
