//! ferry's own JSON-lines requests: `{"cmd":"status"}` and the rest (see
//! the module above for the list).

use super::params::Changes;
use super::{forward, Shared, VmCommand};
use crate::cmd::migrate::LinkSettings;
use crate::rates;
use ferry_backend::memstress::read_progress;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A migration's settings, from `{"cmd":"migrate",...}` or QMP's
/// `migrate` (whose dashed names become underscored).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
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
}

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
    Migrate(MigrateRequest),
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

/// Answers one request.
pub fn handle(req: Request, shared: &Shared) -> Value {
    match req {
        Request::Status => status(shared),
        Request::Set {
            downtime_ms,
            bandwidth_mib_s,
            max_rounds,
            converge,
            quota_interval_ms,
        } => {
            // ferry's own `set` switches a running migration's policy only;
            // the next one names its own (QMP's parameters keep a default).
            if converge.is_some() && !shared.tunables.is_migrating() {
                return json!({"ok": false, "error": "no migration is running: give \
                    converge to migrate instead"});
            }
            let changes = Changes {
                downtime_ms,
                bandwidth_bytes_s: bandwidth_mib_s.map(|b| b.saturating_mul(1 << 20)),
                max_rounds,
                converge,
                quota_interval_ms,
            };
            match changes.apply(shared) {
                Ok(()) => {
                    let t = &shared.tunables;
                    json!({
                        "ok": true,
                        "downtime_ms": t.downtime_target().as_millis() as u64,
                        "bandwidth_mib_s": t.bandwidth_bytes_per_sec() >> 20,
                        "max_rounds": t.max_rounds(),
                        "quota_interval_ms": t.quota_interval().as_millis() as u64,
                        "converge": shared.converge_name(),
                    })
                }
                Err(e) => json!({"ok": false, "error": e}),
            }
        }
        Request::Cancel => {
            shared.tunables.cancel();
            json!({"ok": true})
        }
        Request::Migrate(m) => match m.settings(shared) {
            Ok((to, link)) => forward(shared, |reply| VmCommand::Migrate { to, link, reply }),
            Err(e) => json!({"ok": false, "error": e}),
        },
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

impl MigrateRequest {
    /// Checks the request; the destination and the link settings.
    pub fn settings(self, shared: &Shared) -> Result<(String, LinkSettings), String> {
        let on_stall = match self.on_stall.as_deref() {
            None | Some("escalate") => false,
            Some("postcopy") => true,
            Some(other) => {
                return Err(format!(
                    "unknown on_stall '{other}': expected escalate or postcopy"
                ))
            }
        };
        let mode = self
            .mode
            .as_deref()
            .unwrap_or("precopy")
            .parse::<ferry_engine::Mode>()?
            .with_switch(self.postcopy_after_rounds, on_stall);
        if on_stall && !mode.switch_on_stall() {
            return Err("on_stall postcopy needs mode hybrid".into());
        }
        if mode.may_postcopy() && self.delta_cache_mib.unwrap_or(0) > 0 {
            return Err("delta_cache_mib cannot be used with postcopy or hybrid".into());
        }
        let converge = match self.converge.as_deref() {
            Some(c) => Some(c.parse()?),
            None => shared.next_converge(),
        };
        let compression = self.compress.as_deref().unwrap_or("none").parse()?;
        let max = ferry_engine::precopy::MAX_CONNECTIONS;
        let connections = self.connections.unwrap_or(1);
        let stall = self.stall_timeout_s.unwrap_or(10);
        if !(1..=max).contains(&connections) {
            return Err(format!("connections must be 1 to {max}"));
        }
        if !(1..=3600).contains(&stall) {
            return Err("stall_timeout_s must be 1 to 3600".into());
        }
        let tls =
            crate::cmd::migrate::load_tls(self.tls_dir.as_deref()).map_err(|e| e.to_string())?;
        let link = LinkSettings {
            connections,
            compression,
            stall_timeout: Duration::from_secs(stall),
            verify_before_resume: self.verify_before_resume,
            tls,
            delta_cache_bytes: self.delta_cache_mib.unwrap_or(0).saturating_mul(1 << 20),
            converge,
            max_downtime: self.max_downtime_ms.map(Duration::from_millis),
            give_up_after: self.give_up_after_s.map(Duration::from_secs),
            mode,
            recover_timeout: self.recover_timeout_s.map_or(
                ferry_engine::postcopy::DEFAULT_RECOVER_TIMEOUT,
                Duration::from_secs,
            ),
        };
        Ok((self.to, link))
    }
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
