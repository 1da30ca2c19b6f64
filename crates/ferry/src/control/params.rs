//! Changing a migration's parameters, live: one path for ferry's `set` and
//! QMP's `migrate-set-parameters`.

use super::Shared;
use ferry_control::ParamUpdate;

/// Checks every change, then applies them all (or none): the tunables'
/// ranges are the engine's ([`ferry_engine::TunableChange`]).
pub fn apply(update: ParamUpdate, shared: &Shared) -> Result<(), String> {
    let t = &shared.tunables;
    // Checks every tunable before it sets any; the policy, parsed with the
    // request, cannot fail after it.
    t.apply(&update.tunables).map_err(|e| e.to_string())?;
    if let Some(p) = update.converge {
        if t.is_migrating() {
            t.request_policy(p);
        }
        shared.set_next_converge(p);
    }
    Ok(())
}
