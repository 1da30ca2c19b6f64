//! QMP-shaped commands, for tools written against QEMU's monitor
//! (libvirt, KubeVirt, scripts): `{"execute": NAME, "arguments": {...},
//! "id": ...}` answered by `{"return": ...}` or
//! `{"error": {"class": ..., "desc": ...}}`, with `id` echoed.
//!
//! | command | what ferry does |
//! |---|---|
//! | `qmp_capabilities` | `{}`; this connection then also receives events |
//! | `query-migrate` | status and `ram` figures, named as QEMU names them (see [`Monitor::query`](super::monitor::Monitor::query)) |
//! | `query-migrate-parameters` | the parameters below, as they are now |
//! | `migrate-set-parameters` | `downtime-limit` (ms), `max-bandwidth` (bytes/s, 0 = no cap), and ferry's `x-converge` (none, auto, quota, dirty-limit), `x-quota-interval` (ms), `x-max-rounds` |
//! | `query-migrate-capabilities` / `migrate-set-capabilities` | `auto-converge` and `dirty-limit`: choose that policy (false: back to the default, quota where the backend meters each vCPU) |
//! | `migrate` | `uri` (`tcp:HOST:PORT`); returns at once, progress is in `query-migrate` and the events. `resume: true` resumes a postcopy in `postcopy-paused`. ferry's own settings (`connections`, `mode`, `compress`, ... as in `{"cmd":"migrate"}`) may follow, with dashes or underscores |
//! | `migrate_cancel` | cancels a migration in precopy (the source runs on) |
//!
//! Events: `MIGRATION` (`status`), `MIGRATION_PASS` (`pass`), and
//! `FERRY_MIGRATION_SUMMARY` (the whole summary, just before the final
//! `MIGRATION`). There is no greeting: the socket speaks ferry's own JSON
//! lines too, whose clients expect the first line to be their reply.

use super::lines::MigrateRequest;
use super::monitor::{MigStatus, Writer};
use super::params::Changes;
use super::{Shared, VmCommand};
use serde_json::{json, Map, Value};

/// An error in QMP's shape.
fn error(class: &str, desc: impl Into<String>) -> Value {
    json!({"error": {"class": class, "desc": desc.into()}})
}

fn generic(desc: impl Into<String>) -> Value {
    error("GenericError", desc)
}

/// Answers one QMP request; `conn` is subscribed to events on
/// `qmp_capabilities`.
pub fn handle(request: &Map<String, Value>, shared: &Shared, conn: &Writer) -> Value {
    let mut reply = answer(request, shared, conn);
    if let Some(id) = request.get("id") {
        reply["id"] = id.clone();
    }
    reply
}

fn answer(request: &Map<String, Value>, shared: &Shared, conn: &Writer) -> Value {
    let Some(name) = request.get("execute").and_then(Value::as_str) else {
        return generic("'execute' must be a string naming a command");
    };
    if let Some(key) = request
        .keys()
        .find(|k| !matches!(k.as_str(), "execute" | "arguments" | "id"))
    {
        return generic(format!("QMP input member '{key}' is unexpected"));
    }
    let empty = Map::new();
    let args = match request.get("arguments") {
        None => &empty,
        Some(Value::Object(a)) => a,
        Some(_) => return generic("'arguments' must be an object"),
    };
    let no_args = |reply: Value| {
        if let Some(k) = args.keys().next() {
            return generic(format!("parameter '{k}' is unexpected"));
        }
        json!({ "return": reply })
    };
    match name {
        "qmp_capabilities" => {
            shared.monitor.subscribe(conn);
            no_args(json!({}))
        }
        "query-migrate" => no_args(shared.monitor.query()),
        "query-migrate-parameters" => no_args(parameters(shared)),
        "query-migrate-capabilities" => no_args(capabilities(shared)),
        "migrate-set-parameters" => set_parameters(args, shared),
        "migrate-set-capabilities" => set_capabilities(args, shared),
        "migrate" => migrate(args, shared),
        "migrate_cancel" => match shared.monitor.status() {
            MigStatus::PostcopyActive | MigStatus::PostcopyRecover => {
                generic("a postcopy cannot be cancelled: the destination already runs the guest")
            }
            _ => {
                shared.tunables.cancel();
                no_args(json!({}))
            }
        },
        other => error(
            "CommandNotFound",
            format!("the command {other} has not been found"),
        ),
    }
}

fn parameters(shared: &Shared) -> Value {
    let t = &shared.tunables;
    json!({
        "downtime-limit": t.downtime_target().as_millis() as u64,
        "max-bandwidth": t.bandwidth_bytes_per_sec(),
        "x-max-rounds": t.max_rounds(),
        "x-converge": shared.converge_name(),
        "x-quota-interval": t.quota_interval().as_millis() as u64,
    })
}

fn capabilities(shared: &Shared) -> Value {
    let policy = shared.converge_name();
    json!([
        {"capability": "auto-converge", "state": policy.as_deref() == Some("auto")},
        {"capability": "dirty-limit", "state": policy.as_deref() == Some("dirty-limit")},
    ])
}

fn number(args: &Map<String, Value>, key: &str) -> Result<Option<u64>, Value> {
    match args.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| generic(format!("parameter '{key}' expects a whole number"))),
    }
}

fn set_parameters(args: &Map<String, Value>, shared: &Shared) -> Value {
    const KNOWN: [&str; 5] = [
        "downtime-limit",
        "max-bandwidth",
        "x-max-rounds",
        "x-converge",
        "x-quota-interval",
    ];
    if let Some(k) = args.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return generic(format!(
            "parameter '{k}' is not supported by ferry (supported: {})",
            KNOWN.join(", ")
        ));
    }
    let changes = (|| -> Result<Changes, Value> {
        let max_rounds = number(args, "x-max-rounds")?
            .map(|r| u32::try_from(r).map_err(|_| generic("x-max-rounds is too large")))
            .transpose()?;
        let converge = match args.get("x-converge") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(generic("parameter 'x-converge' expects a string")),
        };
        Ok(Changes {
            downtime_ms: number(args, "downtime-limit")?,
            bandwidth_bytes_s: number(args, "max-bandwidth")?,
            max_rounds,
            converge,
            quota_interval_ms: number(args, "x-quota-interval")?,
        })
    })();
    match changes.map(|c| c.apply(shared)) {
        Ok(Ok(())) => json!({"return": {}}),
        Ok(Err(e)) => generic(e),
        Err(reply) => reply,
    }
}

fn set_capabilities(args: &Map<String, Value>, shared: &Shared) -> Value {
    let Some(Value::Array(list)) = args.get("capabilities") else {
        return generic("migrate-set-capabilities needs 'capabilities', a list");
    };
    let mut choice = None;
    for cap in list {
        let (Some(name), Some(state)) = (
            cap.get("capability").and_then(Value::as_str),
            cap.get("state").and_then(Value::as_bool),
        ) else {
            return generic(
                "each capability needs 'capability' (a name) and 'state' (true or false)",
            );
        };
        let policy = match name {
            "auto-converge" => "auto",
            "dirty-limit" => "dirty-limit",
            other => {
                return generic(format!(
                    "capability '{other}' is not supported by ferry (supported: auto-converge, \
                     dirty-limit; use x-converge for the others)"
                ))
            }
        };
        match (state, choice) {
            (true, Some(other)) if other != policy => {
                return generic("auto-converge and dirty-limit are exclusive: choose one")
            }
            (true, _) => choice = Some(policy),
            (false, _) if shared.converge_name().as_deref() == Some(policy) => {
                shared.clear_next_converge()
            }
            (false, _) => {}
        }
    }
    if let Some(policy) = choice {
        let changes = Changes {
            converge: Some(policy.to_string()),
            ..Changes::default()
        };
        if let Err(e) = changes.apply(shared) {
            return generic(e);
        }
    }
    json!({"return": {}})
}

fn migrate(args: &Map<String, Value>, shared: &Shared) -> Value {
    let Some(uri) = args.get("uri").and_then(Value::as_str) else {
        return generic("migrate needs 'uri', e.g. \"tcp:10.0.0.2:7070\"");
    };
    let Some(to) = uri.strip_prefix("tcp:") else {
        return generic(format!(
            "uri '{uri}': ferry migrates over tcp only (tcp:HOST:PORT; TLS with tls-dir)"
        ));
    };
    let resume = match args.get("resume") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return generic("parameter 'resume' expects true or false"),
    };
    let (tx, _) = std::sync::mpsc::channel();
    if resume {
        if shared.monitor.status() != MigStatus::PostcopyPaused {
            return generic("there is no paused postcopy to resume");
        }
        let to = Some(to.to_string());
        return match shared.commands.send(VmCommand::Resume { to, reply: tx }) {
            Ok(()) => json!({"return": {}}),
            Err(_) => generic("the VM has stopped"),
        };
    }
    if shared.monitor.status() == MigStatus::PostcopyPaused {
        return generic(
            "a failed postcopy holds this VM paused (the destination has run it): resume it \
             with migrate and resume: true",
        );
    }
    let mut fields: Map<String, Value> = args
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "uri" | "resume"))
        .map(|(k, v)| (k.replace('-', "_"), v.clone()))
        .collect();
    fields.insert("to".into(), json!(to));
    let request: MigrateRequest = match serde_json::from_value(Value::Object(fields)) {
        Ok(r) => r,
        Err(e) => return generic(format!("bad migrate arguments: {e}")),
    };
    let (to, link) = match request.settings(shared) {
        Ok(s) => s,
        Err(e) => return generic(e),
    };
    if !shared.monitor.begin() {
        return generic("there's a migration process in progress");
    }
    match shared.commands.send(VmCommand::Migrate {
        to,
        link,
        reply: tx,
    }) {
        Ok(()) => json!({"return": {}}),
        Err(_) => {
            shared.monitor.refuse("the VM has stopped");
            generic("the VM has stopped")
        }
    }
}
