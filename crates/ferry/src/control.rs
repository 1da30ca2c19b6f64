//! The control socket of `ferry run --control PATH`: one JSON object per line,
//! one reply per request.
//!
//! ```text
//!  {"cmd":"status"}                                  -> progress and rates per vCPU
//!  {"cmd":"set","downtime_ms":100,"bandwidth_mib_s":512,"max_rounds":10,
//!   "converge":"quota","quota_interval_ms":50}      -> tunables, live, also mid-migration
//!  {"cmd":"throttle","percent":50}                   -> vCPUs sleep 50% of each 10 ms
//!  {"cmd":"migrate","to":"10.0.0.2:7070"}            -> the migration summary (blocks)
//!      optional: connections, stall_timeout_s, compress, verify_before_resume, tls_dir,
//!      delta_cache_mib, converge, max_downtime_ms, give_up_after_s, mode,
//!      postcopy_after_rounds, on_stall, recover_timeout_s
//!  {"cmd":"resume"}                                  -> resumes a postcopy whose automatic
//!      recovery ran out of time (the source stays paused until then);
//!      optional: to (another address of the same destination)
//!  {"cmd":"cancel"}                                  -> cancels a migration in precopy
//!  {"cmd":"stop"}                                    -> stops the VM and `ferry run`
//! ```
//!
//! Status, set and cancel are answered on the connection's own thread, so they
//! work while a migration is running. Migrate and stop go to the thread that
//! owns the VM; so does throttle, except during a migration, when the engine
//! applies it at its next batch (and records it in the summary's
//! throttle_timeline and operator_changes). A policy switch (`converge` in
//! `set`) lifts the old policy's throttle and engages the new one at once;
//! it needs a running migration, as the policy is chosen per migration.

use crate::cmd::migrate::LinkSettings;
use crate::rates;
use ferry_backend::memstress::read_progress;
use ferry_backend::GuestRam;
use ferry_engine::Tunables;
use serde::Deserialize;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A request on the control socket.
#[derive(Debug, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    Status,
    Set {
        downtime_ms: Option<u64>,
        bandwidth_mib_s: Option<u64>,
        max_rounds: Option<u32>,
        /// Switch the running migration's convergence policy.
        converge: Option<String>,
        /// The quota policy's refill interval, 10 to 10000 ms.
        quota_interval_ms: Option<u64>,
    },
    Migrate {
        to: String,
        #[serde(default)]
        verify_before_resume: bool,
        /// Data connections (default 1).
        connections: Option<usize>,
        /// Seconds the link may stand still (default 10).
        stall_timeout_s: Option<u64>,
        /// none, lz4, zstd or auto (default none).
        compress: Option<String>,
        /// Mutual TLS with the material in this directory (default: none).
        tls_dir: Option<std::path::PathBuf>,
        /// MiB of delta cache for re-sent pages (default 0: off).
        delta_cache_mib: Option<u64>,
        /// none, auto or quota (default: quota where the backend meters
        /// each vCPU, else auto).
        converge: Option<String>,
        /// Highest downtime target a stall may raise the target to.
        max_downtime_ms: Option<u64>,
        /// Cancel the migration if it has not switched over by then.
        give_up_after_s: Option<u64>,
        /// precopy, postcopy or hybrid (default precopy).
        mode: Option<String>,
        /// hybrid: precopy rounds before postcopy (default 1, or only on a
        /// stall with on_stall "postcopy").
        postcopy_after_rounds: Option<u32>,
        /// escalate (default) or postcopy (hybrid: switch on a stall).
        on_stall: Option<String>,
        /// Postcopy: seconds to keep reconnecting after the connections
        /// break (default 60).
        recover_timeout_s: Option<u64>,
    },
    Throttle {
        percent: u8,
    },
    /// Resumes a postcopy whose automatic recovery ran out of time (to the
    /// same destination, or `to`).
    Resume {
        to: Option<String>,
    },
    Cancel,
    Stop,
}

/// What the VM's thread must do, with where to send the reply.
pub enum VmCommand {
    Migrate {
        to: String,
        link: LinkSettings,
        reply: Sender<Value>,
    },
    Throttle {
        percent: u8,
        reply: Sender<Value>,
    },
    Resume {
        to: Option<String>,
        reply: Sender<Value>,
    },
    Stop {
        reply: Sender<Value>,
    },
}

/// Errors of the control socket.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket could not be created.
    #[error("cannot listen on control socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The socket could not be reached.
    #[error("cannot reach control socket {path} (is `ferry run --control` running?)")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Talking on the socket failed.
    #[error("control socket I/O")]
    Io(#[from] std::io::Error),
    /// The reply was not JSON.
    #[error("control socket reply is not JSON: {0}")]
    Reply(String),
}

/// What connection threads share.
#[derive(Clone)]
pub struct Shared {
    pub ram: Arc<GuestRam>,
    pub vcpus: u32,
    pub tunables: Arc<Tunables>,
    pub commands: Sender<VmCommand>,
    /// Requests being answered: `ferry run` waits for these before it exits,
    /// so the reply to the migrate or stop that ends it is written whole.
    pub answering: Arc<AtomicUsize>,
}

/// Waits (at most 5 s) until no reply is being written.
pub fn wait_answered(answering: &AtomicUsize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while answering.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Listens on `path` and serves each connection on its own thread.
pub fn serve(path: &Path, shared: Shared) -> Result<(), ControlError> {
    // A stale socket file from a killed run would make bind fail.
    if path.exists() && UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path).map_err(|source| ControlError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let shared = shared.clone();
                let _ = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || serve_connection(conn, &shared));
            }
        })
        .map_err(ControlError::Io)?;
    Ok(())
}

fn serve_connection(conn: UnixStream, shared: &Shared) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        shared.answering.fetch_add(1, Ordering::AcqRel);
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(req) => handle(req, shared),
            Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
        };
        let written = writeln!(out, "{reply}").and_then(|_| out.flush());
        shared.answering.fetch_sub(1, Ordering::AcqRel);
        if written.is_err() {
            return;
        }
    }
}

fn handle(req: Request, shared: &Shared) -> Value {
    match req {
        Request::Status => status(shared),
        Request::Set {
            downtime_ms,
            bandwidth_mib_s,
            max_rounds,
            converge,
            quota_interval_ms,
        } => {
            let mode = match converge.as_deref().map(str::parse).transpose() {
                Ok(m) => m,
                Err(e) => return json!({"ok": false, "error": e}),
            };
            if mode.is_some() && !shared.tunables.is_migrating() {
                return json!({"ok": false, "error": "no migration is running: give \
                    converge to migrate instead"});
            }
            if let Some(ms) = quota_interval_ms {
                if !(10..=10_000).contains(&ms) {
                    return json!({"ok": false, "error": "quota_interval_ms must be 10 to 10000"});
                }
                shared
                    .tunables
                    .set_quota_interval(Duration::from_millis(ms));
            }
            if let Some(m) = mode {
                shared.tunables.request_policy(m);
            }
            if let Some(ms) = downtime_ms {
                shared
                    .tunables
                    .set_downtime_target(Duration::from_millis(ms));
            }
            if let Some(b) = bandwidth_mib_s {
                shared.tunables.set_bandwidth_bytes_per_sec(b << 20);
            }
            if let Some(r) = max_rounds {
                shared.tunables.set_max_rounds(r);
            }
            json!({
                "ok": true,
                "downtime_ms": shared.tunables.downtime_target().as_millis() as u64,
                "bandwidth_mib_s": shared.tunables.bandwidth_bytes_per_sec() >> 20,
                "max_rounds": shared.tunables.max_rounds(),
                "quota_interval_ms": shared.tunables.quota_interval().as_millis() as u64,
                "converge": mode.map(|m| m.to_string()),
            })
        }
        Request::Cancel => {
            shared.tunables.cancel();
            json!({"ok": true})
        }
        Request::Migrate {
            to,
            verify_before_resume,
            connections,
            stall_timeout_s,
            compress,
            tls_dir,
            delta_cache_mib,
            converge,
            max_downtime_ms,
            give_up_after_s,
            mode,
            postcopy_after_rounds,
            on_stall,
            recover_timeout_s,
        } => {
            let on_stall = match on_stall.as_deref() {
                None | Some("escalate") => false,
                Some("postcopy") => true,
                Some(other) => {
                    return json!({"ok": false, "error": format!("unknown on_stall '{other}': expected escalate or postcopy")})
                }
            };
            let mode = match mode
                .as_deref()
                .unwrap_or("precopy")
                .parse::<ferry_engine::Mode>()
            {
                Ok(m) => m.with_switch(postcopy_after_rounds, on_stall),
                Err(e) => return json!({"ok": false, "error": e}),
            };
            if on_stall && !mode.switch_on_stall() {
                return json!({"ok": false, "error": "on_stall postcopy needs mode hybrid"});
            }
            if mode.may_postcopy() && delta_cache_mib.unwrap_or(0) > 0 {
                return json!({"ok": false, "error": "delta_cache_mib cannot be used with postcopy or hybrid"});
            }
            let converge = match converge.as_deref().map(str::parse).transpose() {
                Ok(c) => c,
                Err(e) => return json!({"ok": false, "error": e}),
            };
            let compression = match compress.as_deref().unwrap_or("none").parse() {
                Ok(c) => c,
                Err(e) => return json!({"ok": false, "error": e}),
            };
            let max = ferry_engine::precopy::MAX_CONNECTIONS;
            let connections = connections.unwrap_or(1);
            let stall = stall_timeout_s.unwrap_or(10);
            if !(1..=max).contains(&connections) {
                return json!({"ok": false, "error": format!("connections must be 1 to {max}")});
            }
            if !(1..=3600).contains(&stall) {
                return json!({"ok": false, "error": "stall_timeout_s must be 1 to 3600"});
            }
            let tls = match crate::cmd::migrate::load_tls(tls_dir.as_deref()) {
                Ok(t) => t,
                Err(e) => return json!({"ok": false, "error": e.to_string()}),
            };
            let link = LinkSettings {
                connections,
                compression,
                stall_timeout: Duration::from_secs(stall),
                verify_before_resume,
                tls,
                delta_cache_bytes: delta_cache_mib.unwrap_or(0).saturating_mul(1 << 20),
                converge,
                max_downtime: max_downtime_ms.map(Duration::from_millis),
                give_up_after: give_up_after_s.map(Duration::from_secs),
                mode,
                recover_timeout: recover_timeout_s.map_or(
                    ferry_engine::postcopy::DEFAULT_RECOVER_TIMEOUT,
                    Duration::from_secs,
                ),
            };
            forward(shared, |reply| VmCommand::Migrate { to, link, reply })
        }
        Request::Throttle { percent } => {
            if shared.tunables.is_migrating() {
                // The VM's thread is inside the migration: the engine applies
                // it at the end of the round under way.
                shared.tunables.request_throttle(percent);
                return json!({
                    "ok": true,
                    "throttle_percent": percent.min(99),
                    "applies": "at the migration's next batch",
                });
            }
            forward(shared, |reply| VmCommand::Throttle { percent, reply })
        }
        Request::Resume { to } => forward(shared, |reply| VmCommand::Resume { to, reply }),
        Request::Stop => forward(shared, |reply| VmCommand::Stop { reply }),
    }
}

fn forward(shared: &Shared, make: impl FnOnce(Sender<Value>) -> VmCommand) -> Value {
    let (tx, rx) = std::sync::mpsc::channel();
    if shared.commands.send(make(tx)).is_err() {
        return json!({"ok": false, "error": "the VM has stopped"});
    }
    rx.recv()
        .unwrap_or_else(|_| json!({"ok": false, "error": "the VM stopped before replying"}))
}

fn status(shared: &Shared) -> Value {
    let Ok(before) = read_progress(&shared.ram, shared.vcpus) else {
        return json!({"ok": false, "error": "cannot read guest progress"});
    };
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let after = read_progress(&shared.ram, shared.vcpus).unwrap_or(before.clone());
    json!({
        "ok": true,
        "progress": after,
        "rates": rates::rates(&before, &after, t.elapsed()),
    })
}

/// Sends one request to a control socket and returns the reply.
pub fn request(path: &Path, req: &Value) -> Result<Value, ControlError> {
    let mut conn = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    writeln!(conn, "{req}")?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| ControlError::Reply(format!("{e}: {line:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_unknown_ones_do_not() {
        assert!(matches!(
            serde_json::from_str::<Request>(r#"{"cmd":"status"}"#),
            Ok(Request::Status)
        ));
        assert!(matches!(
            serde_json::from_str::<Request>(r#"{"cmd":"set","downtime_ms":5}"#),
            Ok(Request::Set {
                downtime_ms: Some(5),
                ..
            })
        ));
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"explode"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"set","speed":1}"#).is_err());
    }
}
