//! Changing a migration's parameters, live: one path for ferry's `set` and
//! QMP's `migrate-set-parameters`.

use super::Shared;
use ferry_control::ParamUpdate;
use ferry_engine::TunableChange;

/// Checks every change, then applies them all (or none): the tunables'
/// ranges are the engine's ([`ferry_engine::TunableChange`]).
pub fn apply(update: ParamUpdate, shared: &Shared) -> Result<(), String> {
    let policy = update
        .converge
        .as_deref()
        .map(str::parse::<ferry_engine::converge::ConvergeMode>)
        .transpose()?;
    let change = TunableChange {
        downtime_ms: update.downtime_ms,
        max_rounds: update.max_rounds,
        bandwidth_bytes_per_sec: update.bandwidth_bytes_s,
        quota_interval_ms: update.quota_interval_ms,
    };
    change.validate().map_err(|e| e.to_string())?;
    let t = &shared.tunables;
    if let Some(p) = policy {
        if t.is_migrating() {
            t.request_policy(p);
        }
        shared.set_next_converge(p);
    }
    t.apply(&change).map_err(|e| e.to_string())
}
