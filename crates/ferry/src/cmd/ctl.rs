//! `ferry ctl SOCKET COMMAND [NAME=VALUE ...]`: the command-line client of
//! a `ferry run --control` socket, in QMP's terms. This parses the command
//! line into a request (each NAME=VALUE typed); the session on the socket
//! is [`crate::control::client`]'s.

use crate::control::client::{self, Request};
use crate::error::CmdError;
use clap::Args;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `ferry ctl`.
#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  ferry ctl /tmp/vm.sock query-migrate
  ferry ctl /tmp/vm.sock migrate-set-parameters downtime-limit=100 max-bandwidth=134217728
  ferry ctl /tmp/vm.sock migrate-set-capabilities auto-converge=on
  ferry ctl /tmp/vm.sock migrate uri=tcp:127.0.0.1:7070 connections=2 --follow
  ferry ctl /tmp/vm.sock events
  ferry ctl /tmp/vm.sock migrate_cancel

Commands: query-migrate, query-migrate-parameters, query-migrate-capabilities,
migrate-set-parameters (downtime-limit ms, max-bandwidth bytes/s, x-converge
none|auto|quota|dirty-limit, x-quota-interval ms, x-max-rounds),
migrate-set-capabilities (auto-converge, dirty-limit: on|off), migrate (uri,
resume, and ferry's migrate settings such as connections, mode, compress),
migrate_cancel, migrate-start-postcopy (with capability postcopy-ram),
query-status (inmigrate while a destination's VM arrives), stop (pauses the
guest), cont (resumes it, or a copy held after a lost Commit); and `events`,
which prints events until the migration ends.")]
pub struct CtlArgs {
    /// The control socket of a `ferry run --control SOCKET`, or its QMP
    /// socket (`--qmp SOCKET`).
    pub socket: PathBuf,
    /// A QMP command, or `events`.
    pub command: String,
    /// Arguments as NAME=VALUE. Whole numbers and true/false (on/off) are
    /// typed; anything else is a string.
    pub args: Vec<String>,
    /// With migrate: print the migration's events until it ends, and exit
    /// non-zero unless it completed.
    #[arg(long)]
    pub follow: bool,
    /// With events or --follow: give up after this many seconds (default:
    /// wait until the migration ends).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Print replies and events as compact JSON lines (for scripts).
    #[arg(long)]
    pub json: bool,
}

/// `NAME=VALUE` with VALUE typed.
fn argument(arg: &str) -> Result<(String, Value), CmdError> {
    let Some((name, value)) = arg.split_once('=') else {
        return Err(CmdError::Usage(format!(
            "argument '{arg}' is not NAME=VALUE"
        )));
    };
    if name.is_empty() {
        return Err(CmdError::Usage(format!("argument '{arg}' has no name")));
    }
    let typed = match value {
        "true" | "on" | "yes" => json!(true),
        "false" | "off" | "no" => json!(false),
        v => v.parse::<u64>().map_or_else(|_| json!(v), |n| json!(n)),
    };
    Ok((name.to_string(), typed))
}

/// The request's `arguments`; capabilities become QMP's list.
fn arguments(command: &str, args: &[String]) -> Result<Map<String, Value>, CmdError> {
    let pairs = args
        .iter()
        .map(|a| argument(a))
        .collect::<Result<Vec<_>, _>>()?;
    if command != "migrate-set-capabilities" {
        return Ok(pairs.into_iter().collect());
    }
    let mut list = Vec::new();
    for (name, state) in pairs {
        let Some(state) = state.as_bool() else {
            return Err(CmdError::Usage(format!(
                "capability {name} takes on or off"
            )));
        };
        list.push(json!({"capability": name, "state": state}));
    }
    Ok(Map::from_iter([("capabilities".to_string(), json!(list))]))
}

/// Runs `ferry ctl`.
pub fn run(a: CtlArgs) -> Result<ExitCode, CmdError> {
    let follow = a.follow || a.command == "events";
    if a.follow && a.command != "migrate" {
        return Err(CmdError::Usage("--follow goes with migrate".into()));
    }
    if a.command == "events" && !a.args.is_empty() {
        return Err(CmdError::Usage("events takes no arguments".into()));
    }
    let args = arguments(&a.command, &a.args)?;
    client::run(Request {
        socket: &a.socket,
        command: &a.command,
        arguments: args,
        follow,
        timeout: a.timeout,
        json: a.json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_typed_and_capabilities_become_a_list() {
        let a = arguments(
            "migrate",
            &["uri=tcp:1.2.3.4:5".into(), "connections=2".into()],
        )
        .unwrap();
        assert_eq!(a["uri"], "tcp:1.2.3.4:5");
        assert_eq!(a["connections"], 2);
        let c = arguments("migrate-set-capabilities", &["auto-converge=on".into()]).unwrap();
        assert_eq!(
            c["capabilities"],
            json!([{"capability": "auto-converge", "state": true}])
        );
        assert!(arguments("migrate", &["uri".into()]).is_err());
        assert!(arguments("migrate-set-capabilities", &["dirty-limit=7".into()]).is_err());
    }
}
