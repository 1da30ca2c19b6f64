//! Changing a migration's parameters, live: one path for ferry's `set` and
//! QMP's `migrate-set-parameters`.

use super::Shared;
use std::time::Duration;

/// Parameter changes; `None` leaves a parameter as it is.
#[derive(Debug, Default)]
pub struct Changes {
    pub downtime_ms: Option<u64>,
    pub bandwidth_bytes_s: Option<u64>,
    pub max_rounds: Option<u32>,
    /// A convergence policy: switched at once in a running migration, else
    /// the default of the next one.
    pub converge: Option<String>,
    /// The quota policy's refill interval.
    pub quota_interval_ms: Option<u64>,
}

impl Changes {
    /// Checks every change, then applies them all (or none).
    pub fn apply(self, shared: &Shared) -> Result<(), String> {
        let policy = self
            .converge
            .as_deref()
            .map(str::parse::<ferry_engine::converge::ConvergeMode>)
            .transpose()?;
        if let Some(ms) = self.quota_interval_ms {
            if !(10..=10_000).contains(&ms) {
                return Err("the quota interval must be 10 to 10000 ms".into());
            }
        }
        if self.max_rounds == Some(0) {
            return Err("max rounds must be at least 1".into());
        }
        let t = &shared.tunables;
        if let Some(ms) = self.quota_interval_ms {
            t.set_quota_interval(Duration::from_millis(ms));
        }
        if let Some(p) = policy {
            if t.is_migrating() {
                t.request_policy(p);
            }
            shared.set_next_converge(p);
        }
        if let Some(ms) = self.downtime_ms {
            t.set_downtime_target(Duration::from_millis(ms));
        }
        if let Some(b) = self.bandwidth_bytes_s {
            t.set_bandwidth_bytes_per_sec(b);
        }
        if let Some(r) = self.max_rounds {
            t.set_max_rounds(r);
        }
        Ok(())
    }
}
