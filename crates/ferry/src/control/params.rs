//! Changing a migration's parameters, live: one path for ferry's `set` and
//! QMP's `migrate-set-parameters`.

use super::Shared;
use ferry::protocol::ParamUpdate;
use std::time::Duration;

/// Checks every change, then applies them all (or none).
pub fn apply(update: ParamUpdate, shared: &Shared) -> Result<(), String> {
    let policy = update
        .converge
        .as_deref()
        .map(str::parse::<ferry_engine::converge::ConvergeMode>)
        .transpose()?;
    if let Some(ms) = update.quota_interval_ms {
        if !(10..=10_000).contains(&ms) {
            return Err("the quota interval must be 10 to 10000 ms".into());
        }
    }
    if update.max_rounds == Some(0) {
        return Err("max rounds must be at least 1".into());
    }
    let t = &shared.tunables;
    if let Some(ms) = update.quota_interval_ms {
        t.set_quota_interval(Duration::from_millis(ms));
    }
    if let Some(p) = policy {
        if t.is_migrating() {
            t.request_policy(p);
        }
        shared.set_next_converge(p);
    }
    if let Some(ms) = update.downtime_ms {
        t.set_downtime_target(Duration::from_millis(ms));
    }
    if let Some(b) = update.bandwidth_bytes_s {
        t.set_bandwidth_bytes_per_sec(b);
    }
    if let Some(r) = update.max_rounds {
        t.set_max_rounds(r);
    }
    Ok(())
}
