//! `ferry ctl SOCKET COMMAND [NAME=VALUE ...]`: the command-line client of
//! a `ferry run --control` socket, in QMP's terms.

use crate::control::ControlError;
use crate::error::CmdError;
use clap::Args;
use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

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

/// An event as a person reads it.
fn describe(event: &Value) -> String {
    let data = &event["data"];
    let name = event["event"].as_str().unwrap_or("?");
    match name {
        "MIGRATION" => format!("status: {}", data["status"].as_str().unwrap_or("?")),
        "MIGRATION_PASS" => format!("pass {}", data["pass"]),
        "FERRY_MIGRATION_SUMMARY" => {
            let digest = match (
                data["digest_checked"].as_bool(),
                data["digest_match"].as_bool(),
            ) {
                (Some(true), Some(true)) => "digest match",
                (Some(true), _) => "digest MISMATCH",
                _ => "digest not reached",
            };
            let mut line = format!(
                "summary: {}, {digest}, {} guest mismatches, downtime {:.0} ms, total {:.1} s, \
                 {} rounds, {} sent",
                data["status"].as_str().unwrap_or("?"),
                data["guest_mismatches"],
                data["downtime_ms"].as_f64().unwrap_or(0.0),
                data["total_ms"].as_f64().unwrap_or(0.0) / 1e3,
                data["rounds"],
                ferry_vm::types::human_bytes(data["bytes_sent"].as_u64().unwrap_or(0)),
            );
            if let Some(e) = data["error"].as_str() {
                line.push_str(&format!("; error: {e}"));
            }
            line
        }
        other => format!("{other} {data}"),
    }
}

/// A status after which a migration's events stop.
fn is_final(status: &str) -> bool {
    matches!(
        status,
        "completed" | "failed" | "cancelled" | "postcopy-paused"
    )
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

/// One QMP session on the socket.
struct Session {
    out: UnixStream,
    lines: std::io::Lines<BufReader<UnixStream>>,
    next_id: u64,
    deadline: Option<Instant>,
    json: bool,
    started: Instant,
}

impl Session {
    fn open(a: &CtlArgs) -> Result<Session, CmdError> {
        let conn = UnixStream::connect(&a.socket).map_err(|source| {
            CmdError::Failed(ferry_vm::error_chain(&ControlError::Connect {
                path: a.socket.clone(),
                source,
            }))
        })?;
        let deadline = match a.timeout {
            Some(t) if !(t.is_finite() && t > 0.0) => {
                return Err(CmdError::Usage("--timeout must be positive".into()))
            }
            t => t.map(|t| Instant::now() + Duration::from_secs_f64(t)),
        };
        let reader = conn.try_clone().map_err(io)?;
        Ok(Session {
            out: conn,
            lines: BufReader::new(reader).lines(),
            next_id: 0,
            deadline,
            json: a.json,
            started: Instant::now(),
        })
    }

    /// The next line as JSON; `None` at the end or at the deadline.
    fn read(&mut self) -> Result<Option<Value>, CmdError> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.out.set_read_timeout(Some(left)).map_err(io)?;
        }
        match self.lines.next() {
            None => Ok(None),
            Some(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Some(Err(e)) => Err(io(e)),
            Some(Ok(line)) => serde_json::from_str(&line).map(Some).map_err(|e| {
                CmdError::Failed(format!("the control socket answered with non-JSON: {e}"))
            }),
        }
    }

    fn print_event(&self, event: &Value) {
        if self.json {
            println!("{event}");
        } else {
            let at = self.started.elapsed().as_secs_f64();
            println!("[{at:7.2}s] {}", describe(event));
        }
    }

    /// Sends a command and returns its reply; events read meanwhile are
    /// printed if `print_events`.
    fn execute(
        &mut self,
        command: &str,
        arguments: Map<String, Value>,
        print_events: bool,
    ) -> Result<Value, CmdError> {
        self.next_id += 1;
        let id = format!("ctl-{}", self.next_id);
        let mut request = json!({"execute": command, "id": id});
        if !arguments.is_empty() {
            request["arguments"] = Value::Object(arguments);
        }
        writeln!(self.out, "{request}").map_err(io)?;
        loop {
            let Some(line) = self.read()? else {
                return Err(CmdError::Failed(format!(
                    "no reply to {command}: the socket closed or --timeout passed"
                )));
            };
            if line.get("event").is_some() {
                if print_events {
                    self.print_event(&line);
                }
                continue;
            }
            if line["id"] != json!(id) {
                continue;
            }
            if let Some(err) = line.get("error") {
                let desc = err["desc"].as_str().unwrap_or("unknown error");
                return Err(CmdError::Failed(format!("{command}: {desc}")));
            }
            return Ok(line.get("return").cloned().unwrap_or(Value::Null));
        }
    }

    /// Prints events until a MIGRATION event with a final status; returns
    /// that status.
    fn follow(&mut self) -> Result<String, CmdError> {
        while let Some(line) = self.read()? {
            if line.get("event").is_none() {
                continue;
            }
            self.print_event(&line);
            let status = &line["data"]["status"];
            if line["event"] == "MIGRATION" && status.as_str().is_some_and(is_final) {
                return Ok(status.as_str().unwrap_or_default().to_string());
            }
        }
        Err(CmdError::Failed(
            "the events ended before the migration did (the socket closed or --timeout passed)"
                .into(),
        ))
    }
}

fn io(e: std::io::Error) -> CmdError {
    CmdError::Failed(format!("control socket I/O: {e}"))
}

pub fn run(a: CtlArgs) -> Result<ExitCode, CmdError> {
    let follow = a.follow || a.command == "events";
    if a.follow && a.command != "migrate" {
        return Err(CmdError::Usage("--follow goes with migrate".into()));
    }
    if a.command == "events" && !a.args.is_empty() {
        return Err(CmdError::Usage("events takes no arguments".into()));
    }
    let args = arguments(&a.command, &a.args)?;
    let mut session = Session::open(&a)?;
    // A --qmp socket answers nothing else first (its greeting, which has
    // no id, is skipped); on --control it subscribes to events, which
    // are printed only when followed.
    if a.command != "qmp_capabilities" {
        session.execute("qmp_capabilities", Map::new(), follow)?;
    }
    if follow {
        eprintln!(
            "ferry ctl: following events on {} until the migration ends",
            a.socket.display()
        );
    }
    if a.command != "events" {
        let reply = session.execute(&a.command, args, follow)?;
        if !follow {
            let text = if a.json {
                reply.to_string()
            } else {
                serde_json::to_string_pretty(&reply).unwrap_or_default()
            };
            println!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
    }
    let status = session.follow()?;
    Ok(if status == "completed" {
        ExitCode::SUCCESS
    } else {
        eprintln!("ferry ctl: the migration ended {status}");
        ExitCode::FAILURE
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
