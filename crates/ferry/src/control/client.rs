//! `ferry ctl`'s side of the control socket: one QMP session on a
//! `ferry run --control` (or `--qmp`) socket that sends one command, prints
//! its reply, and with `follow` prints the migration's events until it ends.
//! It lives beside the server ([`super`]) so that both ends of the socket,
//! and what a client may expect of it, are read in one place; `ferry ctl`
//! only turns its command line into a [`Request`].

use super::ControlError;
use crate::error::CmdError;
use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What `ferry ctl` asks of a socket, its arguments already typed.
pub struct Request<'a> {
    /// The control or QMP socket.
    pub socket: &'a Path,
    /// A QMP command, or `events`.
    pub command: &'a str,
    /// The command's `arguments`.
    pub arguments: Map<String, Value>,
    /// Print the migration's events until it ends (`--follow`, or `events`).
    pub follow: bool,
    /// Give up after this many seconds.
    pub timeout: Option<f64>,
    /// Replies and events as compact JSON lines.
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
    fn open(r: &Request) -> Result<Session, CmdError> {
        let conn = UnixStream::connect(r.socket).map_err(|source| {
            CmdError::Failed(ferry_vm::error_chain(&ControlError::Connect {
                path: r.socket.to_path_buf(),
                source,
            }))
        })?;
        let deadline = match r.timeout {
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
            json: r.json,
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

/// Runs `r` on its socket: the reply printed, or the events followed until
/// the migration ends (success only if it completed).
pub fn run(r: Request) -> Result<ExitCode, CmdError> {
    let follow = r.follow;
    let mut session = Session::open(&r)?;
    // A --qmp socket answers nothing else first (its greeting, which has
    // no id, is skipped); on --control it subscribes to events, which
    // are printed only when followed.
    if r.command != "qmp_capabilities" {
        session.execute("qmp_capabilities", Map::new(), follow)?;
    }
    if follow {
        eprintln!(
            "ferry ctl: following events on {} until the migration ends",
            r.socket.display()
        );
    }
    if r.command != "events" {
        let reply = session.execute(r.command, r.arguments, follow)?;
        if !follow {
            let text = if r.json {
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
