//! ferry's own JSON-lines requests: `{"cmd":"status"}` and the rest (see
//! the module above for the list).

use super::{forward, Shared, VmCommand};
use crate::rates;
use ferry_control::ParamUpdate;
use ferry_control::{MigrateRequest, Request};
use ferry_engine::{PrecopyOptions, TlsConfig, TunableChange};
use ferry_memstress::read_progress;
use ferry_memstress::MemstressProbe;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
            let update = ParamUpdate {
                tunables: TunableChange {
                    downtime_ms,
                    bandwidth_bytes_per_sec: bandwidth_mib_s.map(|b| b.saturating_mul(1 << 20)),
                    max_rounds,
                    quota_interval_ms,
                },
                converge,
            };
            match super::params::apply(update, shared) {
                Ok(()) => {
                    let t = &shared.tunables;
                    json!({
                        "ok": true,
                        "downtime_ms": t.downtime_target().as_millis() as u64,
                        "bandwidth_mib_s": t.bandwidth_bytes_per_sec() >> 20,
                        "max_rounds": t.max_rounds(),
                        "quota_interval_ms": t.quota_interval().as_millis() as u64,
                        "converge": shared.next_converge(),
                    })
                }
                Err(e) => json!({"ok": false, "error": e}),
            }
        }
        Request::Cancel => {
            shared.tunables.cancel();
            json!({"ok": true})
        }
        Request::Migrate(m) => match settings(m, shared) {
            Ok((to, opts, tls)) => forward(shared, |reply| VmCommand::Migrate {
                to,
                opts,
                tls,
                reply,
            }),
            Err(e) => json!({"ok": false, "error": e}),
        },
        Request::Snapshot(request) => {
            if let Some(parent) = request.parent.as_ref().filter(|p| !p.is_absolute()) {
                return json!({"ok": false, "error": format!(
                    "snapshot parent {} is not absolute (the VM's process does not share its \
                     client's working directory)", parent.display()
                )});
            }
            if !request.path.is_absolute() {
                return json!({"ok": false, "error": format!(
                    "snapshot path {} is not absolute (the VM's process does not share its \
                     client's working directory)", request.path.display()
                )});
            }
            forward(shared, |reply| VmCommand::Snapshot { request, reply })
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
        Request::Cont => forward(shared, |reply| VmCommand::Cont { reply }),
    }
}

/// The destination, the engine's options (on the VM's own tunables, so
/// that `set` reaches the migration) and the TLS material a migrate request
/// asks for, checked by the engine.
pub fn settings(
    m: MigrateRequest,
    shared: &Shared,
) -> Result<(String, PrecopyOptions, Option<TlsConfig>), String> {
    let mut settings = m.settings();
    // QMP's postcopy-ram: precopy until migrate-start-postcopy (or
    // postcopy_after_rounds, or a stall with on_stall).
    settings.postcopy_ram = shared
        .postcopy_ram
        .load(std::sync::atomic::Ordering::Acquire);
    if settings.converge.is_none() {
        settings.converge = shared.next_converge();
    }
    let opts = settings
        .options(Arc::clone(&shared.tunables), Some(Arc::new(MemstressProbe)))
        .map_err(|e| e.to_string())?;
    let tls = crate::tls::load_tls(m.tls_dir.as_deref()).map_err(|e| e.to_string())?;
    Ok((m.to, opts, tls))
}

fn status(shared: &Shared) -> Value {
    let Some(guest) = shared.guest.get() else {
        return json!({"ok": false, "error": "no guest here yet: a migration is bringing it (inmigrate)"});
    };
    let Ok(before) = read_progress(&guest.ram, guest.vcpus) else {
        return json!({"ok": false, "error": "cannot read guest progress"});
    };
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let after = read_progress(&guest.ram, guest.vcpus).unwrap_or(before.clone());
    json!({
        "ok": true,
        "progress": after,
        "rates": rates::rates(&before, &after, t.elapsed()),
    })
}
