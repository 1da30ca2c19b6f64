//! The give-up deadline (`PrecopyOptions::give_up_after`): a thread that
//! cancels the migration at the deadline unless it is disarmed first, so a
//! migration that cannot switch over in time ends with the source running.

use crate::error::MigrationError;
use crate::tunables::Tunables;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// An armed deadline.
pub(crate) struct GiveUp {
    after: Duration,
    done: Sender<()>,
    fired: JoinHandle<bool>,
}

impl GiveUp {
    /// Cancels through `tunables` once `after` has passed.
    pub(crate) fn arm(tunables: &Arc<Tunables>, after: Duration) -> GiveUp {
        let (done, wait) = channel::<()>();
        let tunables = Arc::clone(tunables);
        let watch = move || {
            let timed_out = matches!(wait.recv_timeout(after), Err(RecvTimeoutError::Timeout));
            if timed_out {
                tunables.cancel();
            }
            timed_out
        };
        // Named for a VMM's seccomp list (`ferry_engine::seccomp::THREADS`).
        let fired = std::thread::Builder::new()
            .name("give-up".into())
            .spawn(watch)
            .expect("a thread for the migration's deadline");
        GiveUp { after, done, fired }
    }

    /// Stops the deadline; an error it caused says so.
    pub(crate) fn disarm(self, result: Result<(), MigrationError>) -> Result<(), MigrationError> {
        let _ = self.done.send(());
        let fired = self.fired.join().unwrap_or(false);
        match result {
            Err(e) if fired => Err(MigrationError::GaveUp {
                after_s: self.after.as_secs_f64(),
                cause: Box::new(e),
            }),
            other => other,
        }
    }
}
