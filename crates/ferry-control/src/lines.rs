//! ferry's own JSON-lines requests: `{"cmd": ...}`.

use ferry_engine::choices::Compression;
use ferry_engine::choices::ConvergeMode;
use ferry_engine::{MigrationSettings, Mode, OnStall, TunableChange};
use serde::Deserialize;

/// A migration's settings, from `{"cmd":"migrate",...}` or QMP's
/// `migrate` (whose dashed names become underscored). The engine's choices
/// parse as they deserialise, by the names the CLI takes: a name that is
/// none of them refuses the request, naming the accepted ones.
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
    #[serde(default)]
    pub compress: Compression,
    /// Mutual TLS with the material in this directory (default: none).
    pub tls_dir: Option<std::path::PathBuf>,
    /// MiB of delta cache for re-sent pages (default 0: off).
    pub delta_cache_mib: Option<u64>,
    /// none, auto, quota or dirty-limit (default: the policy set
    /// before, else quota where the backend meters each vCPU, else auto).
    pub converge: Option<ConvergeMode>,
    /// Highest downtime target a stall may raise the target to.
    pub max_downtime_ms: Option<u64>,
    /// Cancel the migration if it has not switched over by then.
    pub give_up_after_s: Option<u64>,
    /// precopy, postcopy or hybrid (default precopy).
    pub mode: Option<Mode>,
    /// hybrid: precopy rounds before postcopy (default 1, or only on a
    /// stall with on_stall "postcopy").
    pub postcopy_after_rounds: Option<u32>,
    /// escalate (default) or postcopy (hybrid: switch on a stall).
    #[serde(default)]
    pub on_stall: OnStall,
    /// Postcopy: seconds to keep reconnecting after the connections
    /// break (default 60).
    pub recover_timeout_s: Option<u64>,
}

impl MigrateRequest {
    /// The engine's settings this request asks for. What the server holds
    /// (the VM's tunables, QMP's `postcopy-ram`, a policy chosen before) it
    /// adds, then maps the settings to the engine's options as every other
    /// face does ([`MigrationSettings::options`]).
    pub fn settings(&self) -> MigrationSettings {
        MigrationSettings {
            tunables: TunableChange::default(),
            verify_before_resume: self.verify_before_resume,
            connections: self.connections,
            stall_timeout_s: self.stall_timeout_s,
            compression: self.compress,
            delta_cache_bytes: self.delta_cache_mib.unwrap_or(0).saturating_mul(1 << 20),
            harvest_within_rounds: self.harvest_within_rounds,
            converge: self.converge,
            max_downtime_ms: self.max_downtime_ms,
            give_up_after_s: self.give_up_after_s,
            mode: self.mode,
            postcopy_after_rounds: self.postcopy_after_rounds,
            on_stall: self.on_stall,
            postcopy_ram: false,
            recover_timeout_s: self.recover_timeout_s,
        }
    }
}

/// A snapshot's settings, from `{"cmd":"snapshot",...}` or QMP's
/// `migrate` to a `file:` URI.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// The file to write; absolute, since the VM's process may run
    /// elsewhere in the file system than its client. It is written beside
    /// itself and renamed into place once complete.
    pub path: std::path::PathBuf,
    /// Leave the guest paused afterwards (QMP: the default, as QEMU's
    /// guest stays stopped after a migration to a file; `cont` runs it).
    #[serde(default)]
    pub stop: bool,
    /// The longest pause aimed for, in ms (default: the VM's downtime
    /// target, `set`'s `downtime_ms` or QMP's `downtime-limit`).
    pub max_downtime_ms: Option<u64>,
    /// The most live rounds (default: the VM's round cap).
    pub max_rounds: Option<u32>,
    /// Write a diff against this snapshot of the VM: only the frames that
    /// differ from it (absolute, as `path`).
    pub parent: Option<std::path::PathBuf>,
    /// The convergence policy while the live rounds write (default: the
    /// one the next migration would take, else the best the VM serves).
    pub converge: Option<ConvergeMode>,
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
        converge: Option<ConvergeMode>,
        /// The quota policy's refill interval, 10 to 10000 ms.
        quota_interval_ms: Option<u64>,
    },
    /// Migrates the VM; the reply is the summary.
    Migrate(MigrateRequest),
    /// Saves the VM to a file while it runs; the reply is the summary.
    Snapshot(SnapshotRequest),
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
    fn set_parses_its_policy_and_refuses_an_unknown_one_naming_the_policies() {
        assert!(matches!(
            serde_json::from_str::<Request>(r#"{"cmd":"set","converge":"dirty-limit"}"#),
            Ok(Request::Set {
                converge: Some(ConvergeMode::DirtyLimit),
                ..
            })
        ));
        let err = serde_json::from_str::<Request>(r#"{"cmd":"set","converge":"fast"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(r#"converge "fast": expected one of none, auto, quota, dirty-limit"#),
            "{err}"
        );
    }

    #[test]
    fn a_snapshot_request_names_its_policy() {
        let line = r#"{"cmd":"snapshot","path":"/var/tmp/vm.snap","converge":"quota"}"#;
        match serde_json::from_str::<Request>(line) {
            Ok(Request::Snapshot(s)) => {
                assert_eq!(s.converge, Some(ConvergeMode::Quota));
                assert!(!s.stop && s.parent.is_none());
            }
            other => panic!("{line}: {other:?}"),
        }
        let err = serde_json::from_str::<Request>(
            r#"{"cmd":"snapshot","path":"/v.snap","converge":"fast"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("expected one of none, auto, quota, dirty-limit"),
            "{err}"
        );
    }

    #[test]
    fn a_migrate_request_names_its_settings() {
        let m = migrate(
            r#"{"cmd":"migrate","to":"h:1","compress":"lz4","converge":"auto","mode":"hybrid",
                "on_stall":"postcopy","delta_cache_mib":2,"harvest_within_rounds":true}"#,
        );
        let s = m.settings();
        assert_eq!(s.compression.to_string(), "lz4");
        assert_eq!(s.converge, Some(ConvergeMode::Auto));
        assert_eq!(s.mode.map(|m| m.name()), Some("hybrid"));
        assert!(s.on_stall == OnStall::Postcopy && s.harvest_within_rounds);
        assert_eq!(s.delta_cache_bytes, 2 << 20);
        let defaults = migrate(r#"{"cmd":"migrate","to":"h:1"}"#).settings();
        assert!(defaults.mode.is_none() && !defaults.harvest_within_rounds);
        assert_eq!(defaults.compression, Compression::None);
        assert_eq!(defaults.on_stall, OnStall::Escalate);
        for (bad, names) in [
            (r#""on_stall":"panic""#, "escalate, postcopy"),
            (r#""compress":"gzip""#, "none, lz4, zstd, auto"),
            (r#""mode":"teleport""#, "precopy, postcopy, hybrid"),
            (r#""converge":"fast""#, "none, auto, quota, dirty-limit"),
        ] {
            let line = format!(r#"{{"cmd":"migrate","to":"h:1",{bad}}}"#);
            let err = serde_json::from_str::<Request>(&line)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("expected one of {names}")),
                "{line}: {err}"
            );
        }
    }
}
