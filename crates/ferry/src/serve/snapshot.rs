//! A snapshot the VM's thread takes when its control socket asks
//! (`{"cmd":"snapshot"}`, or QMP's `migrate` to a `file:` URI): the
//! engine's live save, watched by the VM's monitor and steered by its
//! tunables, after which the guest runs on or stays paused.

use super::say;
use crate::control;
use ferry_control::SnapshotRequest;
use ferry_engine::error::SnapshotError;
use ferry_engine::monitor::SnapshotEnd;
use ferry_engine::snapshot::{self, SnapshotOptions, Steering};
use serde_json::{json, Value};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

/// Saves `vm` as `request` asks and replies with the summary (or why it
/// failed: the guest then runs on as before, and the file is not written).
pub fn run(
    vm: &mut dyn ferry_vm::Vm,
    request: SnapshotRequest,
    reply: Sender<Value>,
    ctl: &control::Shared,
) {
    if let Err(e) = ctl.custody.may_migrate() {
        let error = e.to_string();
        ctl.monitor.refuse(&error);
        let _ = reply.send(json!({"ok": false, "error": error}));
        return;
    }
    let tunables = &ctl.tunables;
    let mut opts = SnapshotOptions::default();
    opts.max_downtime = request
        .max_downtime_ms
        .map_or_else(|| tunables.downtime_target(), Duration::from_millis);
    opts.max_rounds = request.max_rounds.unwrap_or_else(|| tunables.max_rounds());
    opts.stop = request.stop;
    opts.parent = request.parent.clone();
    opts.converge = request.converge.or_else(|| ctl.next_converge());
    opts.first_touches = ctl
        .first_touches
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    // A cancel aimed at an earlier migration must not stop this one.
    tunables.reset_cancel();
    // Claimed already when QMP's migrate asked for it.
    ctl.monitor.begin();
    tunables.set_migrating(true);
    say(format_args!(
        "saving the VM to {} while it runs",
        request.path.display()
    ));
    let steering = Steering {
        progress: &*ctl.monitor,
        tunables: Arc::clone(tunables),
    };
    let result = snapshot::save_steered(vm, &request.path, &opts, &steering);
    tunables.set_migrating(false);
    tunables.take_throttle_request();
    // The reply, the progress line and the monitor's end, from one match.
    let (answer, end) = match &result {
        Ok(summary) => {
            if summary.stopped {
                // The guest stays paused, its state the file's: `cont` runs it.
                let _ = ctl.custody.stop(|| Ok::<(), std::convert::Infallible>(()));
            }
            say(format_args!(
                "snapshot written to {}: {:.0} ms, the guest paused {:.0} ms, {} MiB on disk; \
                 the guest {}",
                request.path.display(),
                summary.total_ms,
                summary.pause_ms,
                summary.bytes >> 20,
                if summary.stopped {
                    "stays paused (cont runs it)"
                } else {
                    "runs on"
                }
            ));
            let mut v = serde_json::to_value(summary).unwrap_or_default();
            v["ok"] = true.into();
            v["file"] = json!(request.path);
            let end = SnapshotEnd::Completed {
                total_ms: summary.total_ms,
                pause_ms: summary.pause_ms,
            };
            (v, end)
        }
        Err(e) => {
            let why = ferry_vm::error_chain(e);
            say(format_args!(
                "the snapshot failed, the guest runs as before: {why}"
            ));
            let answer = json!({"ok": false, "error": why});
            let end = match e {
                SnapshotError::Cancelled { .. } => SnapshotEnd::Cancelled(why),
                _ => SnapshotEnd::Failed(why),
            };
            (answer, end)
        }
    };
    ctl.monitor.finish_snapshot(end, answer.clone());
    let _ = reply.send(answer);
}
