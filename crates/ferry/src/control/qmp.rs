//! QMP-shaped commands, for tools written against QEMU's monitor
//! (libvirt, KubeVirt, scripts): `{"execute": NAME, "arguments": {...},
//! "id": ...}` answered by `{"return": ...}` or
//! `{"error": {"class": ..., "desc": ...}}`, with `id` echoed.
//!
//! | command | what ferry does |
//! |---|---|
//! | `qmp_capabilities` | `{}`; this connection then also receives events |
//! | `query-migrate` | status and `ram` figures, named as QEMU names them (see [`Monitor::query`](ferry_engine::monitor::Monitor::query)) |
//! | `query-migrate-parameters` | the parameters below, as they are now |
//! | `migrate-set-parameters` | `downtime-limit` (ms), `max-bandwidth` (bytes/s, 0 = no cap), and ferry's `x-converge` (none, auto, quota, dirty-limit), `x-quota-interval` (ms), `x-max-rounds` |
//! | `query-migrate-capabilities` / `migrate-set-capabilities` | `auto-converge` and `dirty-limit`: choose that policy (false: back to the default, quota where the backend meters each vCPU) |
//! | `migrate` | `uri` (`tcp:HOST:PORT`, or `file:PATH`: a snapshot to that file, the guest left paused as QEMU leaves it; `stop: false` runs it on); returns at once, progress is in `query-migrate` and the events. `resume: true` resumes a postcopy in `postcopy-paused`. ferry's own settings (`connections`, `mode`, `compress`, ... as in `{"cmd":"migrate"}`) may follow, with dashes or underscores |
//! | `migrate_cancel` | cancels a migration in precopy (the source runs on) |
//! | `migrate-start-postcopy` | a running migration that may switch (capability `postcopy-ram`, or mode hybrid) switches to postcopy at the end of the round under way |
//! | `query-status` | `running`, and `status`: `inmigrate` (a destination's, while the VM arrives), `running`, `paused` (by `stop`, arrived paused, or held after a lost Commit), `finish-migrate` (switchover) or `postmigrate` (the destination runs the guest) |
//! | `stop` | pauses the guest; the VMM runs on, and a migration moves it paused (it arrives paused) |
//! | `cont` | resumes a guest paused by `stop` or arrived paused, or a copy held paused after a lost Commit (see `ferry_engine::Outcome::Held`): that one only once the other copy is known not to run. A running VM: nothing to do |
//!
//! While a destination's VM arrives, every command that needs the VM is
//! refused (run state `inmigrate`); the queries answer, and the
//! `MIGRATION` events follow the arrival (`setup`, `active`, then
//! `completed` or `failed`), as QEMU's destination monitor does.
//!
//! Events: `MIGRATION` (`status`), `MIGRATION_PASS` (`pass`), and
//! `FERRY_MIGRATION_SUMMARY` (the whole summary, just before the final
//! `MIGRATION`). The `--control` socket sends no greeting: it speaks
//! ferry's own JSON lines too, whose clients expect the first line to be
//! their reply. The `--qmp` socket is QEMU's monitor in shape: a greeting,
//! then capabilities negotiation (nothing but `qmp_capabilities` is
//! answered until it was sent), and QMP requests only.

use super::Writer;
use super::{Shared, VmCommand};
use ferry_control::{Capability, ParamUpdate, QmpCommand, QmpError};
use ferry_engine::custody::CopyState;
use ferry_engine::monitor::MigStatus;
use serde_json::{json, Value};

/// The greeting a `--qmp` connection opens with, as QEMU's.
pub fn greeting() -> Value {
    json!({"QMP": {
        "version": version(),
        "capabilities": [],
    }})
}

/// `query-version`'s reply, as QEMU shapes it: ferry is the package; it
/// is no QEMU release, so the QEMU numbers are zero.
fn version() -> Value {
    json!({
        "qemu": {"major": 0, "minor": 0, "micro": 0},
        "package": format!("ferry {}", env!("CARGO_PKG_VERSION")),
    })
}

/// Answers one line on a `--qmp` socket: QMP only, and while
/// `negotiating`, `qmp_capabilities` only (QEMU's capabilities
/// negotiation mode).
pub fn answer_strict(line: &str, negotiating: &mut bool, shared: &Shared, conn: &Writer) -> Value {
    let (id, command) = match ferry_control::parse(line) {
        Ok(ferry_control::Parsed::Qmp { id, command }) => (id, command),
        Ok(ferry_control::Parsed::Lines(_)) => {
            return handle(
                None,
                Err(QmpError::generic(
                    "this is a QMP socket: ferry's {\"cmd\":...} requests go to --control",
                )),
                shared,
                conn,
            )
        }
        Err(e) => return handle(None, Err(QmpError::generic(e)), shared, conn),
    };
    let command = match command {
        Ok(QmpCommand::Capabilities) if !*negotiating => Err(QmpError {
            class: "CommandNotFound",
            desc: "Capabilities negotiation is already complete, command ignored".into(),
        }),
        Ok(QmpCommand::Capabilities) => {
            *negotiating = false;
            Ok(QmpCommand::Capabilities)
        }
        Ok(_) if *negotiating => Err(QmpError {
            class: "CommandNotFound",
            desc: "Expecting capabilities negotiation with 'qmp_capabilities'".into(),
        }),
        other => other,
    };
    handle(id, command, shared, conn)
}

/// The reply to a parsed QMP request; `conn` is subscribed to events on
/// `qmp_capabilities`.
pub fn handle(
    id: Option<Value>,
    command: Result<QmpCommand, QmpError>,
    shared: &Shared,
    conn: &Writer,
) -> Value {
    let mut reply = match command.and_then(|c| answer(c, shared, conn)) {
        Ok(value) => json!({ "return": value }),
        Err(e) => json!({"error": {"class": e.class, "desc": e.desc}}),
    };
    if let Some(id) = id {
        reply["id"] = id;
    }
    reply
}

fn answer(command: QmpCommand, shared: &Shared, conn: &Writer) -> Result<Value, QmpError> {
    match command {
        QmpCommand::Capabilities => {
            super::subscribe(&shared.monitor, conn);
            Ok(json!({}))
        }
        QmpCommand::QueryMigrate => Ok(shared.monitor.query()),
        QmpCommand::QueryParameters => Ok(parameters(shared)),
        QmpCommand::QueryCapabilities => Ok(capabilities(shared)),
        QmpCommand::SetParameters(update) => {
            super::params::apply(update, shared).map_err(QmpError::generic)?;
            Ok(json!({}))
        }
        QmpCommand::SetCapabilities(list) => set_capabilities(&list, shared),
        QmpCommand::Migrate { resume, settings } => migrate(resume, *settings, shared),
        QmpCommand::Snapshot(request) => snapshot(*request, shared),
        QmpCommand::StartPostcopy => start_postcopy(shared),
        QmpCommand::Cont => cont(shared),
        QmpCommand::Stop => {
            let reply = super::forward(shared, |reply| VmCommand::Pause { reply });
            match reply["ok"].as_bool() {
                Some(true) => Ok(json!({})),
                _ => Err(QmpError::generic(
                    reply["error"].as_str().unwrap_or("the VM did not pause"),
                )),
            }
        }
        QmpCommand::QueryStatus => Ok(run_state(shared)),
        QmpCommand::QueryVersion => Ok(version()),
        QmpCommand::QueryCommands => Ok(ferry_control::COMMANDS
            .iter()
            .map(|name| json!({ "name": name }))
            .collect()),
        QmpCommand::QueryName => Ok(json!({})),
        QmpCommand::Quit => {
            // QEMU answers, then exits; a precopy under way is cancelled so
            // the VM is not left half moved.
            shared.tunables.cancel();
            let stop = super::forward(shared, |reply| VmCommand::Stop { reply });
            match stop["ok"].as_bool() {
                Some(true) => Ok(json!({})),
                _ => Err(QmpError::generic(
                    stop["error"].as_str().unwrap_or("the VM did not stop"),
                )),
            }
        }
        QmpCommand::Cancel => match shared.monitor.status() {
            MigStatus::PostcopyActive | MigStatus::PostcopyRecover => Err(QmpError::generic(
                "a postcopy cannot be cancelled: the destination already runs the guest",
            )),
            _ => {
                shared.tunables.cancel();
                Ok(json!({}))
            }
        },
    }
}

fn start_postcopy(shared: &Shared) -> Result<Value, QmpError> {
    let status = shared.monitor.status();
    if !matches!(status, MigStatus::Setup | MigStatus::Active) {
        return Err(QmpError::generic(format!(
            "no migration in precopy to switch to postcopy (status: {})",
            status.name()
        )));
    }
    if !shared.monitor.may_postcopy() {
        return Err(QmpError::generic(
            "this migration cannot switch to postcopy: start it with the postcopy-ram \
             capability, or with mode hybrid",
        ));
    }
    shared.tunables.request_postcopy();
    Ok(json!({}))
}

fn cont(shared: &Shared) -> Result<Value, QmpError> {
    if shared.tunables.is_migrating() {
        // The migration owns the VM: it resumes or hands it over itself.
        return Err(QmpError::generic(
            "a migration is under way: the VM resumes or moves when it ends",
        ));
    }
    let reply = super::forward(shared, |reply| VmCommand::Cont { reply });
    match reply["ok"].as_bool() {
        Some(true) => Ok(json!({})),
        _ => Err(QmpError::generic(
            reply["error"].as_str().unwrap_or("the VM did not resume"),
        )),
    }
}

fn run_state(shared: &Shared) -> Value {
    let (status, running) = if shared.custody.is_arriving() {
        ("inmigrate", false)
    } else if shared.custody.is_held() || shared.custody.is_paused() {
        ("paused", false)
    } else if shared.custody.has_moved() {
        ("postmigrate", false)
    } else {
        match shared.monitor.status() {
            MigStatus::Device => ("finish-migrate", false),
            // A completed migration moved the VM (custody says so above),
            // or brought it here (a destination's monitor).
            MigStatus::PostcopyActive | MigStatus::PostcopyRecover | MigStatus::PostcopyPaused => {
                ("postmigrate", false)
            }
            _ => ("running", true),
        }
    };
    json!({"status": status, "running": running, "singlestep": false})
}

fn parameters(shared: &Shared) -> Value {
    let t = &shared.tunables;
    json!({
        "downtime-limit": t.downtime_target().as_millis() as u64,
        "max-bandwidth": t.bandwidth_bytes_per_sec(),
        "x-max-rounds": t.max_rounds(),
        "x-converge": shared.next_converge(),
        "x-quota-interval": t.quota_interval().as_millis() as u64,
    })
}

fn capabilities(shared: &Shared) -> Value {
    let policy = shared.next_converge();
    let state = |c: Capability| policy.is_some() && policy == c.policy();
    json!([
        {"capability": "auto-converge", "state": state(Capability::AutoConverge)},
        {"capability": "dirty-limit", "state": state(Capability::DirtyLimit)},
        {"capability": "postcopy-ram", "state": shared.postcopy_ram.load(std::sync::atomic::Ordering::Acquire)},
    ])
}

fn set_capabilities(list: &[(Capability, bool)], shared: &Shared) -> Result<Value, QmpError> {
    for &(cap, on) in list {
        let Some(policy) = cap.policy() else {
            shared
                .postcopy_ram
                .store(on, std::sync::atomic::Ordering::Release);
            continue;
        };
        if on {
            let update = ParamUpdate {
                converge: Some(policy),
                ..ParamUpdate::default()
            };
            super::params::apply(update, shared).map_err(QmpError::generic)?;
        } else if shared.next_converge() == Some(policy) {
            shared.clear_next_converge();
        }
    }
    Ok(json!({}))
}

/// `migrate` to a `file:` URI: returns at once, as a migration does; its
/// progress is in `query-migrate` and the events.
fn snapshot(request: ferry_control::SnapshotRequest, shared: &Shared) -> Result<Value, QmpError> {
    shared
        .custody
        .may_migrate()
        .map_err(|e| QmpError::generic(e.to_string()))?;
    if !shared.monitor.begin() {
        return Err(QmpError::generic("there's a migration process in progress"));
    }
    let (tx, _) = std::sync::mpsc::channel();
    match shared
        .commands
        .send(VmCommand::Snapshot { request, reply: tx })
    {
        Ok(()) => Ok(json!({})),
        Err(_) => {
            shared.monitor.refuse("the VM has stopped");
            Err(QmpError::generic("the VM has stopped"))
        }
    }
}

fn migrate(
    resume: bool,
    settings: ferry_control::MigrateRequest,
    shared: &Shared,
) -> Result<Value, QmpError> {
    let (tx, _) = std::sync::mpsc::channel();
    let custody = shared.custody.state();
    if resume {
        if !matches!(custody, CopyState::PostcopyFailed { .. }) {
            return Err(QmpError::generic("there is no paused postcopy to resume"));
        }
        let to = Some(settings.to);
        return match shared.commands.send(VmCommand::Resume { to, reply: tx }) {
            Ok(()) => Ok(json!({})),
            Err(_) => Err(QmpError::generic("the VM has stopped")),
        };
    }
    shared
        .custody
        .may_migrate()
        .map_err(|e| QmpError::generic(e.to_string()))?;
    let (to, opts, tls) = super::lines::settings(settings, shared).map_err(QmpError::generic)?;
    if !shared.monitor.begin() {
        return Err(QmpError::generic("there's a migration process in progress"));
    }
    match shared.commands.send(VmCommand::Migrate {
        to,
        opts,
        tls,
        reply: tx,
    }) {
        Ok(()) => Ok(json!({})),
        Err(_) => {
            shared.monitor.refuse("the VM has stopped");
            Err(QmpError::generic("the VM has stopped"))
        }
    }
}
