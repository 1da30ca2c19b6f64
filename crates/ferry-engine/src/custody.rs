//! Who may run a VM's copy once a migration has ended, and what an operator
//! may do with it next: the rules behind `cont`, a new `migrate` and a
//! postcopy's `resume`, for any VMM that embeds the engine (ferry's control
//! socket and QMP monitor use them too).
//!
//! ```text
//!   Arriving ── the migration in completes ──► Running, or Paused (it was paused
//!            │                                 at the source), or Held
//!   Running ⇄ Paused          (an operator's stop and cont; a paused copy may
//!                              migrate, and arrives paused)
//!   Running ── migrate: completed ───────────────────► Moved      (runs elsewhere)
//!      │    ── migrate: Outcome::Held (Commit lost) ──► Held ── cont ──► Running
//!      │    ── migrate: postcopy failed ─────────────► PostcopyFailed ── resume ──► …
//!      └─── migrate: failed or cancelled in precopy ─► Running    (it ran on)
//! ```
//!
//! A held copy has verified memory, but the other copy may run: only an
//! operator who knows it does not may `cont` it. A copy a failed postcopy
//! left has every page, but the destination has run the guest: it must
//! never run here again, only be sent on with `resume`.

use crate::error::PostcopyResume;
use crate::summary::Outcome;
use std::sync::Mutex;
use thiserror::Error;

/// Where a VM's copy stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyState {
    /// A migration is bringing it here: nothing but queries until it has
    /// (QEMU's `inmigrate`).
    Arriving,
    /// It runs here (or never migrated); it may migrate.
    Running,
    /// Paused by an operator (QMP `stop`), or arrived paused as it was at
    /// the source; `cont` runs it, and it may migrate (and arrives paused).
    Paused,
    /// Paused with verified memory after the Commit was lost
    /// ([`Outcome::Held`]); it runs again only on `cont`.
    Held {
        /// Why, in words.
        why: String,
    },
    /// Paused with every page after a postcopy failed; the destination has
    /// run the guest, so this copy may only be resumed elsewhere.
    PostcopyFailed {
        /// What [`crate::resume_postcopy`] needs.
        resume: PostcopyResume,
    },
    /// The migration completed: the guest runs at the destination.
    Moved,
}

/// Why an operator's request is refused in the copy's state.
#[non_exhaustive]
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CustodyError {
    /// A migration of a held copy.
    #[error(
        "this copy is held paused after a lost Commit: cont it once sure the other copy \
         does not run, or stop it"
    )]
    Held,
    /// A migration or `cont` of a copy a failed postcopy left.
    #[error(
        "a failed postcopy holds this VM paused (the destination has run it, so it must not \
         run here): resume that one"
    )]
    PostcopyFailed,
    /// A resume with no failed postcopy.
    #[error("there is no failed postcopy to resume")]
    NothingToResume,
    /// Anything but a query once the VM moved.
    #[error("the VM has moved away: this monitor only answers queries and quit")]
    Moved,
    /// Anything but a query while the VM arrives.
    #[error(
        "a migration is bringing the VM here (inmigrate): this monitor answers queries \
         until it has"
    )]
    Arriving,
    /// A stop of a copy that does not run here.
    #[error("there is no running copy here to stop")]
    NotRunning,
}

/// A copy's state, shared between the thread that owns the VM and those
/// that answer an operator.
#[derive(Debug)]
pub struct Custody {
    state: Mutex<CopyState>,
}

impl Default for Custody {
    fn default() -> Self {
        Custody::new(CopyState::Running)
    }
}

impl Custody {
    /// A copy in `state` (a destination that starts held passes
    /// [`CopyState::Held`]).
    pub fn new(state: CopyState) -> Self {
        Custody {
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CopyState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state now.
    pub fn state(&self) -> CopyState {
        self.lock().clone()
    }

    /// Records how a migration of this copy ended: its summary's `status`
    /// and `error`, and the resume token when a postcopy failed.
    pub fn migration_ended(
        &self,
        status: Outcome,
        error: Option<&str>,
        resume: Option<PostcopyResume>,
    ) {
        let mut state = self.lock();
        let was_paused = *state == CopyState::Paused;
        *state = match (status, resume) {
            // A failed precopy leaves the copy as it was.
            (Outcome::Failed, None) if was_paused => CopyState::Paused,
            (_, Some(resume)) => CopyState::PostcopyFailed { resume },
            (Outcome::Completed, None) => CopyState::Moved,
            (Outcome::Held, None) => CopyState::Held {
                why: error.unwrap_or("the Commit was lost").to_string(),
            },
            (_, None) => CopyState::Running,
        };
    }

    /// Whether a new migration may start.
    pub fn may_migrate(&self) -> Result<(), CustodyError> {
        match *self.lock() {
            CopyState::Running | CopyState::Paused => Ok(()),
            CopyState::Arriving => Err(CustodyError::Arriving),
            CopyState::Held { .. } => Err(CustodyError::Held),
            CopyState::PostcopyFailed { .. } => Err(CustodyError::PostcopyFailed),
            CopyState::Moved => Err(CustodyError::Moved),
        }
    }

    /// An operator's `cont`: runs `start` for a held copy and, once it
    /// started, marks the copy running; a running copy needs nothing.
    /// Returns whether `start` ran. A copy a failed postcopy left is
    /// refused, and so is one that moved.
    pub fn cont<E>(&self, start: impl FnOnce() -> Result<(), E>) -> Result<bool, ContError<E>> {
        let mut state = self.lock();
        match *state {
            CopyState::Running => Ok(false),
            CopyState::Held { .. } | CopyState::Paused => {
                start().map_err(ContError::Start)?;
                *state = CopyState::Running;
                Ok(true)
            }
            CopyState::Arriving => Err(ContError::Refused(CustodyError::Arriving)),
            CopyState::PostcopyFailed { .. } => {
                Err(ContError::Refused(CustodyError::PostcopyFailed))
            }
            CopyState::Moved => Err(ContError::Refused(CustodyError::Moved)),
        }
    }

    /// An operator's `stop`: runs `pause` for a running copy and marks it
    /// paused; a paused copy needs nothing. Returns whether `pause` ran.
    pub fn stop<E>(&self, pause: impl FnOnce() -> Result<(), E>) -> Result<bool, ContError<E>> {
        let mut state = self.lock();
        match *state {
            CopyState::Paused => Ok(false),
            CopyState::Running => {
                pause().map_err(ContError::Start)?;
                *state = CopyState::Paused;
                Ok(true)
            }
            CopyState::Arriving => Err(ContError::Refused(CustodyError::Arriving)),
            CopyState::Moved => Err(ContError::Refused(CustodyError::Moved)),
            _ => Err(ContError::Refused(CustodyError::NotRunning)),
        }
    }

    /// The migration that brought the copy here ended: it runs, is paused
    /// as it was at the source, or is held (`held`: why) for an operator.
    pub fn arrived(&self, paused: bool, held: Option<String>) {
        *self.lock() = match (held, paused) {
            (Some(why), _) => CopyState::Held { why },
            (None, true) => CopyState::Paused,
            (None, false) => CopyState::Running,
        };
    }

    /// Whether a migration is bringing the copy here.
    pub fn is_arriving(&self) -> bool {
        matches!(*self.lock(), CopyState::Arriving)
    }

    /// Whether an operator paused the copy (or it arrived paused).
    pub fn is_paused(&self) -> bool {
        matches!(*self.lock(), CopyState::Paused)
    }

    /// The token of the failed postcopy to resume, taken: the copy is in
    /// the resumed migration's hands until [`Custody::migration_ended`].
    pub fn take_resume(&self) -> Result<PostcopyResume, CustodyError> {
        let mut state = self.lock();
        match *state {
            CopyState::PostcopyFailed { resume } => {
                *state = CopyState::Running;
                Ok(resume)
            }
            CopyState::Moved => Err(CustodyError::Moved),
            _ => Err(CustodyError::NothingToResume),
        }
    }

    /// Whether the copy is held after a lost Commit.
    pub fn is_held(&self) -> bool {
        matches!(*self.lock(), CopyState::Held { .. })
    }

    /// Whether the VM moved away.
    pub fn has_moved(&self) -> bool {
        matches!(*self.lock(), CopyState::Moved)
    }
}

/// Why a `cont` did not run the copy, or a `stop` did not pause it.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ContError<E> {
    /// The copy's state forbids it.
    #[error(transparent)]
    Refused(CustodyError),
    /// Starting (or pausing) the VM failed; the copy stays as it was.
    #[error("cannot start or pause the copy")]
    Start(#[source] E),
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: PostcopyResume = PostcopyResume {
        session: 7,
        round: 3,
        connections: 2,
    };

    #[test]
    fn a_held_copy_runs_only_on_cont_and_refuses_a_migration_until_then() {
        let c = Custody::default();
        c.migration_ended(Outcome::Held, Some("lost"), None);
        assert_eq!(c.may_migrate(), Err(CustodyError::Held));
        // A start that fails leaves it held.
        assert_eq!(c.cont(|| Err::<(), _>("no")), Err(ContError::Start("no")));
        assert!(c.is_held());
        assert_eq!(c.cont(|| Ok::<(), ()>(())), Ok(true));
        assert_eq!(c.state(), CopyState::Running);
        assert_eq!(c.may_migrate(), Ok(()));
        assert_eq!(c.cont(|| Err::<(), _>("never called")), Ok(false));
    }

    #[test]
    fn a_failed_postcopy_never_runs_here_and_resumes_once() {
        let c = Custody::default();
        c.migration_ended(Outcome::Failed, Some("cut"), Some(TOKEN));
        assert_eq!(
            c.cont(|| -> Result<(), ()> { panic!("a failed postcopy's copy was started") }),
            Err(ContError::Refused(CustodyError::PostcopyFailed))
        );
        assert_eq!(c.may_migrate(), Err(CustodyError::PostcopyFailed));
        assert_eq!(c.take_resume(), Ok(TOKEN));
        assert_eq!(c.take_resume(), Err(CustodyError::NothingToResume));
    }

    #[test]
    fn a_moved_vm_refuses_everything_and_a_failed_precopy_runs_on() {
        let c = Custody::default();
        c.migration_ended(Outcome::Failed, Some("refused"), None);
        assert_eq!(c.may_migrate(), Ok(()));
        c.migration_ended(Outcome::Completed, None, None);
        assert!(c.has_moved());
        assert_eq!(c.may_migrate(), Err(CustodyError::Moved));
        assert_eq!(c.take_resume(), Err(CustodyError::Moved));
        assert_eq!(
            c.cont(|| Ok::<(), ()>(())),
            Err(ContError::Refused(CustodyError::Moved))
        );
    }

    #[test]
    fn an_arriving_copy_answers_nothing_but_queries_and_then_runs_or_stays_paused() {
        let c = Custody::new(CopyState::Arriving);
        assert_eq!(c.may_migrate(), Err(CustodyError::Arriving));
        assert_eq!(
            c.cont(|| Ok::<(), ()>(())),
            Err(ContError::Refused(CustodyError::Arriving))
        );
        assert_eq!(
            c.stop(|| Ok::<(), ()>(())),
            Err(ContError::Refused(CustodyError::Arriving))
        );
        c.arrived(true, None);
        assert!(c.is_paused());
        c.arrived(false, Some("lost".into()));
        assert!(c.is_held());
        c.arrived(false, None);
        assert_eq!(c.state(), CopyState::Running);
    }

    #[test]
    fn stop_pauses_a_running_copy_which_may_migrate_and_cont_runs_it() {
        let c = Custody::default();
        assert_eq!(c.stop(|| Ok::<(), ()>(())), Ok(true));
        assert!(c.is_paused());
        assert_eq!(c.stop(|| Err::<(), _>("not again")), Ok(false));
        assert_eq!(c.may_migrate(), Ok(()));
        // A failed precopy leaves it paused; a completed one moved it.
        c.migration_ended(Outcome::Failed, Some("refused"), None);
        assert!(c.is_paused());
        assert_eq!(c.cont(|| Ok::<(), ()>(())), Ok(true));
        assert_eq!(c.state(), CopyState::Running);
        c.migration_ended(Outcome::Completed, None, None);
        assert_eq!(
            c.stop(|| Ok::<(), ()>(())),
            Err(ContError::Refused(CustodyError::Moved))
        );
    }
}
