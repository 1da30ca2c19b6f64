//! ferry's own JSON-lines requests: `{"cmd": ...}`.

use ferry_engine::{MigrationSettings, TunableChange};
use serde::Deserialize;

/// A migration's settings, from `{"cmd":"migrate",...}` or QMP's
/// `migrate` (whose dashed names become underscored).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// The destination, HOST:PORT.
    pub to: String,
    /// Have the destination verify the digest before it resumes the guest.
    #[serde(default)]
    pub verify_before_resume: bool,
    /// Harvest the dirty log within rounds (default off; see
    /// `ferry migrate --harvest-within-rounds`).
    #[serde(default)]
    pub harvest_within_rounds: bool,
    /// Data connections (default 1).
    pub connections: Option<usize>,
    /// Seconds the link may stand still (default 10).
    pub stall_timeout_s: Option<u64>,
    /// none, lz4, zstd or auto (default none).
    pub compress: Option<String>,
    /// Mutual TLS with the material in this directory (default: none).
    pub tls_dir: Option<std::path::PathBuf>,
    /// MiB of delta cache for re-sent pages (default 0: off).
    pub delta_cache_mib: Option<u64>,
    /// none, auto or quota (default: quota where the backend meters
    /// each vCPU, else auto).
    pub converge: Option<String>,
    /// Highest downtime target a stall may raise the target to.
    pub max_downtime_ms: Option<u64>,
    /// Cancel the migration if it has not switched over by then.
    pub give_up_after_s: Option<u64>,
    /// precopy, postcopy or hybrid (default precopy).
    pub mode: Option<String>,
    /// hybrid: precopy rounds before postcopy (default 1, or only on a
    /// stall with on_stall "postcopy").
    pub postcopy_after_rounds: Option<u32>,
    /// escalate (default) or postcopy (hybrid: switch on a stall).
    pub on_stall: Option<String>,
    /// Postcopy: seconds to keep reconnecting after the connections
    /// break (default 60).
    pub recover_timeout_s: Option<u64>,
}

impl MigrateRequest {
    /// The engine's settings this request asks for, its names parsed. What
    /// the server holds (the VM's tunables, QMP's `postcopy-ram`, a policy
    /// chosen before) it adds, then maps the settings to the engine's
    /// options as every other face does
    /// ([`MigrationSettings::options`]).
    pub fn settings(&self) -> Result<MigrationSettings, String> {
        let on_stall_postcopy = match self.on_stall.as_deref() {
            None | Some("escalate") => false,
            Some("postcopy") => true,
            Some(other) => {
                return Err(format!(
                    "unknown on_stall '{other}': expected escalate or postcopy"
                ))
            }
        };
        let mode = self.mode.as_deref().map(str::parse).transpose()?;
        let converge = self.converge.as_deref().map(str::parse).transpose()?;
        let compression = self.compress.as_deref().unwrap_or("none").parse()?;
        Ok(MigrationSettings {
            tunables: TunableChange::default(),
            verify_before_resume: self.verify_before_resume,
            connections: self.connections,
            stall_timeout_s: self.stall_timeout_s,
            compression,
            delta_cache_bytes: self.delta_cache_mib.unwrap_or(0).saturating_mul(1 << 20),
            harvest_within_rounds: self.harvest_within_rounds,
            converge,
            max_downtime_ms: self.max_downtime_ms,
            give_up_after_s: self.give_up_after_s,
            mode,
            postcopy_after_rounds: self.postcopy_after_rounds,
            on_stall_postcopy,
            postcopy_ram: false,
            recover_timeout_s: self.recover_timeout_s,
        })
    }
}

/// A request on the control socket.
#[derive(Debug, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// The guest's progress and rates per vCPU.
    Status,
    /// Changes the live tunables, also mid-migration.
    Set {
        /// The downtime target, in ms.
        downtime_ms: Option<u64>,
        /// The bandwidth cap, in MiB/s (0: none).
        bandwidth_mib_s: Option<u64>,
        /// The round cap.
        max_rounds: Option<u32>,
        /// Switch the running migration's convergence policy.
        converge: Option<String>,
        /// The quota policy's refill interval, 10 to 10000 ms.
        quota_interval_ms: Option<u64>,
    },
    /// Migrates the VM; the reply is the summary.
    Migrate(MigrateRequest),
    /// Throttles every vCPU.
    Throttle {
        /// Share of each 10 ms slice a vCPU sleeps, in percent.
        percent: u8,
    },
    /// Resumes a postcopy whose automatic recovery ran out of time (to the
    /// same destination, or `to`).
    Resume {
        /// Another address of the same destination.
        to: Option<String>,
    },
    /// Cancels a migration in precopy; the VM runs on.
    Cancel,
    /// Resumes a copy held paused after a lost Commit.
    Cont,
    /// Stops the VM and `ferry run`.
    Stop,
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

    fn migrate(line: &str) -> MigrateRequest {
        match serde_json::from_str::<Request>(line) {
            Ok(Request::Migrate(m)) => m,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn a_migrate_request_names_its_settings() {
        let m = migrate(
            r#"{"cmd":"migrate","to":"h:1","compress":"lz4","converge":"auto","mode":"hybrid",
                "on_stall":"postcopy","delta_cache_mib":2,"harvest_within_rounds":true}"#,
        );
        let s = m.settings().unwrap();
        assert_eq!(s.compression.to_string(), "lz4");
        assert_eq!(s.converge.map(|c| c.to_string()).as_deref(), Some("auto"));
        assert_eq!(s.mode.map(|m| m.name()), Some("hybrid"));
        assert!(s.on_stall_postcopy && s.harvest_within_rounds);
        assert_eq!(s.delta_cache_bytes, 2 << 20);
        let defaults = migrate(r#"{"cmd":"migrate","to":"h:1"}"#)
            .settings()
            .unwrap();
        assert!(defaults.mode.is_none() && !defaults.harvest_within_rounds);
        for bad in [
            r#""on_stall":"panic""#,
            r#""compress":"gzip""#,
            r#""mode":"teleport""#,
        ] {
            let line = format!(r#"{{"cmd":"migrate","to":"h:1",{bad}}}"#);
            assert!(migrate(&line).settings().is_err(), "{line}");
        }
    }
}
