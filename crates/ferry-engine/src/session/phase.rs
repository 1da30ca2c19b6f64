//! Where a migration stands on its source, and so what a failure does
//! there: the one place that says when the source runs the guest again.
//!
//! ```text
//!  Copying ──pause──▶ Paused ──digest──▶ Verifying ──verdict──▶ Paused ──commit──▶ Committed
//!                       │
//!                       └──postcopy──▶ Postcopy ──digest──▶ Postcopy (verifying) ──verdict──▶ Postcopy ──commit──▶ Committed
//!
//!  rollback, from Copying, Paused or Verifying ──▶ RolledBack (the guest runs here again if
//!  the migration paused it); never from Postcopy: the destination runs the guest there.
//! ```
//!
//! A recovered postcopy source (`postcopy::resume`) starts in Postcopy.
//! Any other move is refused with [`PhaseError`]: it is a bug in the
//! engine, and the migration fails rather than take a step out of order.

/// The source's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SourcePhase {
    /// Rounds copy memory while the guest runs here (or stays paused, if
    /// its owner had paused it).
    Copying,
    /// Paused for the switchover. `by_us`: the migration paused the guest,
    /// so a failure resumes it; otherwise its owner had, and it stays so.
    Paused { by_us: bool },
    /// The digest went out; the verdict is pending. A failure now may leave
    /// the destination running its copy: the error says it is unconfirmed.
    Verifying { by_us: bool },
    /// The destination runs the guest and this source serves the pages it
    /// lacks: never resumed here, and no page is given up. `verifying`: the
    /// digest went out and the verdict is pending.
    Postcopy { verifying: bool },
    /// The guest is the destination's; this copy stays paused.
    Committed,
    /// The migration failed before the destination took the guest; the
    /// source runs it again if the migration had paused it.
    RolledBack,
}

/// A step taken out of order.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("internal error: the migration source cannot {step} while {from:?}")]
pub(crate) struct PhaseError {
    /// What was asked.
    step: &'static str,
    /// The phase it was asked in.
    from: SourcePhase,
}

impl From<PhaseError> for crate::error::MigrationError {
    fn from(e: PhaseError) -> Self {
        crate::error::MigrationError::Phase {
            step: e.step,
            phase: format!("{:?}", e.from),
        }
    }
}

impl SourcePhase {
    fn refuse(self, step: &'static str) -> PhaseError {
        PhaseError { step, from: self }
    }

    /// The switchover paused the guest (`by_us`), or found it paused.
    pub(crate) fn pause(&mut self, by_us: bool) -> Result<(), PhaseError> {
        match *self {
            SourcePhase::Copying => *self = SourcePhase::Paused { by_us },
            other => return Err(other.refuse("pause for a switchover")),
        }
        Ok(())
    }

    /// The digest went out (in postcopy, again after each recovery).
    pub(crate) fn digest_sent(&mut self) -> Result<(), PhaseError> {
        *self = match *self {
            SourcePhase::Paused { by_us } => SourcePhase::Verifying { by_us },
            SourcePhase::Postcopy { .. } => SourcePhase::Postcopy { verifying: true },
            other => return Err(other.refuse("send the digest")),
        };
        Ok(())
    }

    /// The destination's verdict arrived (a match or not).
    pub(crate) fn verdict(&mut self) -> Result<(), PhaseError> {
        *self = match *self {
            SourcePhase::Verifying { by_us } => SourcePhase::Paused { by_us },
            SourcePhase::Postcopy { verifying: true } => SourcePhase::Postcopy { verifying: false },
            other => return Err(other.refuse("take a verdict")),
        };
        Ok(())
    }

    /// The paused guest now runs on the destination, which fetches what it
    /// lacks from here.
    pub(crate) fn switch_to_postcopy(&mut self) -> Result<(), PhaseError> {
        match *self {
            SourcePhase::Paused { .. } => *self = SourcePhase::Postcopy { verifying: false },
            other => return Err(other.refuse("switch to postcopy")),
        }
        Ok(())
    }

    /// The guest is the destination's, once its copy was verified (or, a
    /// Commit lost, held on both ends for an operator).
    pub(crate) fn commit(&mut self) -> Result<(), PhaseError> {
        match *self {
            SourcePhase::Paused { .. } | SourcePhase::Postcopy { verifying: false } => {
                *self = SourcePhase::Committed
            }
            other => return Err(other.refuse("commit")),
        }
        Ok(())
    }

    /// The migration failed: whether the guest runs here again. Refused
    /// once the destination runs the guest or owns it.
    pub(crate) fn roll_back(&mut self) -> Result<bool, PhaseError> {
        let resume = match *self {
            SourcePhase::Copying => false,
            SourcePhase::Paused { by_us } | SourcePhase::Verifying { by_us } => by_us,
            SourcePhase::RolledBack => return Ok(false),
            other => return Err(other.refuse("roll back")),
        };
        *self = SourcePhase::RolledBack;
        Ok(resume)
    }

    /// Whether the migration paused the guest and still holds it paused.
    pub(crate) fn paused_by_us(self) -> bool {
        matches!(
            self,
            SourcePhase::Paused { by_us: true } | SourcePhase::Verifying { by_us: true }
        )
    }

    /// Whether the destination runs the guest on pages from here.
    pub(crate) fn in_postcopy(self) -> bool {
        matches!(self, SourcePhase::Postcopy { .. })
    }

    /// Whether the digest is out and its verdict pending (outside postcopy,
    /// whose failures say so on their own).
    pub(crate) fn awaiting_verdict(self) -> bool {
        matches!(self, SourcePhase::Verifying { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::SourcePhase::*;
    use super::*;

    /// What rolling back from `p` would do, `p` left as it is.
    fn rolled_back(mut p: SourcePhase) -> Result<bool, PhaseError> {
        p.roll_back()
    }

    #[test]
    fn a_precopy_resumes_the_guest_it_paused_until_the_verdict_and_never_after_the_commit() {
        let mut p = Copying;
        p.pause(true).unwrap();
        assert!(p.paused_by_us());
        p.digest_sent().unwrap();
        assert!(p.awaiting_verdict());
        assert_eq!(
            rolled_back(p),
            Ok(true),
            "a failure while verifying resumes"
        );
        p.verdict().unwrap();
        assert_eq!(p, Paused { by_us: true });
        p.commit().unwrap();
        assert!(!p.paused_by_us());
        assert!(
            p.roll_back().is_err(),
            "a committed guest is the destination's"
        );
    }

    #[test]
    fn a_guest_its_owner_paused_stays_paused_on_a_rollback() {
        let mut p = Copying;
        p.pause(false).unwrap();
        assert!(!p.paused_by_us());
        assert_eq!(p.roll_back(), Ok(false));
        assert_eq!(p, RolledBack);
        assert_eq!(
            p.roll_back(),
            Ok(false),
            "rolling back twice resumes nothing twice"
        );
    }

    #[test]
    fn a_postcopy_source_never_resumes_and_commits_only_after_its_verdict() {
        let mut p = Copying;
        p.pause(true).unwrap();
        p.switch_to_postcopy().unwrap();
        assert!(p.in_postcopy());
        assert!(!p.paused_by_us(), "the destination runs the guest");
        assert!(rolled_back(p).is_err());
        p.digest_sent().unwrap();
        assert!(
            !p.awaiting_verdict(),
            "postcopy's failures carry their own kind"
        );
        p.digest_sent().unwrap(); // again, after a recovery
        assert!({ p }.commit().is_err(), "no commit before the verdict");
        p.verdict().unwrap();
        p.commit().unwrap();
        assert_eq!(p, Committed);
    }

    #[test]
    fn steps_out_of_order_are_refused_and_leave_the_phase_as_it_was() {
        type Step = fn(&mut SourcePhase) -> Result<(), PhaseError>;
        let cases: [(SourcePhase, Step); 7] = [
            (Copying, |p| p.digest_sent()),
            (Copying, |p| p.verdict()),
            (Copying, |p| p.commit()),
            (Copying, |p| p.switch_to_postcopy()),
            (Paused { by_us: true }, |p| p.pause(true)),
            (Verifying { by_us: true }, |p| p.switch_to_postcopy()),
            (Verifying { by_us: true }, |p| p.digest_sent()),
        ];
        for (from, step) in cases {
            let mut p = from;
            let e = step(&mut p).unwrap_err();
            assert_eq!(p, from);
            assert!(e.to_string().contains(&format!("{from:?}")), "{e}");
        }
        let mut p = Committed;
        assert!(p.pause(true).is_err());
        let mut p = RolledBack;
        assert!(p.commit().is_err());
    }
}
