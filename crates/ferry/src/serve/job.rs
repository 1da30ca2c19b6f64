//! A migration the VM's thread runs when its control socket asks: a new
//! one, or the resume of a postcopy that failed; and what the VM's monitor
//! and custody learn from how it ended.

use super::{say, say_held};
use crate::control;
use crate::driver::migrate_running;
use ferry_engine::custody::CopyState;
use ferry_engine::{Outcome, PrecopyOptions, TlsConfig, Tunables};
use std::sync::Arc;

/// A migration the control socket asked for: a new one, or the resume of
/// a postcopy that failed.
pub struct Job {
    pub to: String,
    pub opts: PrecopyOptions,
    pub tls: Option<TlsConfig>,
    pub since: Option<crate::vcpu_share::Sample>,
    /// Resume the failed postcopy in custody instead of a new migration.
    pub resume: bool,
}

/// Where the last migration went and how: what a resume of its failed
/// postcopy sends again.
pub type LastJob = (String, PrecopyOptions, Option<TlsConfig>);

impl Job {
    /// Runs it and replies with the summary. Returns whether the VM moved
    /// (this process then stops). A failed postcopy leaves the VM paused
    /// with every page, in custody for a resume; `last` keeps where it went.
    pub fn run(
        self,
        vm: &mut dyn ferry_vm::Vm,
        tunables: &Arc<Tunables>,
        last: &mut Option<LastJob>,
        reply: std::sync::mpsc::Sender<serde_json::Value>,
        ctl: &control::Shared,
    ) -> bool {
        let resume = if self.resume {
            match ctl.custody.take_resume() {
                Ok(token) => Some(token),
                Err(e) => {
                    let _ = reply.send(serde_json::json!({"ok": false, "error": e.to_string()}));
                    return false;
                }
            }
        } else {
            None
        };
        // A cancel aimed at an earlier migration must not stop this one.
        tunables.reset_cancel();
        // Claimed already when QMP's migrate asked for it.
        ctl.monitor.begin();
        ctl.monitor.set_may_postcopy(self.opts.mode.may_postcopy());
        // From here this thread is busy: a throttle asked meanwhile goes
        // through the tunables to the migration, not into this thread's
        // queue behind it.
        tunables.set_migrating(true);
        let (summary, token) = migrate_running(
            vm,
            &self.to,
            self.opts.clone(),
            self.tls.as_ref(),
            self.since,
            resume,
            &*ctl.monitor,
        );
        tunables.set_migrating(false);
        tunables.take_throttle_request();
        let cancelled = tunables.is_cancelled();
        let summary_json = crate::summary::json(&summary, &Default::default());
        // Before the `completed` event goes out: a client that reads it
        // and asks again must find the VM moved (or held).
        ctl.custody
            .migration_ended(summary.status, summary.error.as_deref(), token);
        ctl.monitor
            .finish(&summary, summary_json, cancelled, token.is_some());
        let moved = summary.status == Outcome::Completed;
        if let CopyState::Held { why } = ctl.custody.state() {
            say_held(&why);
        }
        *last = Some((self.to.clone(), self.opts, self.tls));
        let _ = reply.send(crate::summary::json(&summary, &Default::default()));
        if moved {
            say(format_args!(
                "the VM now runs at {}; stopping here",
                self.to
            ));
            // The summary and the last events must reach the askers before
            // this exits.
            control::wait_answered(&ctl.answering);
            ctl.monitor.drain();
        }
        moved
    }
}
