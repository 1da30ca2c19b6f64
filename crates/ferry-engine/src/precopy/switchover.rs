//! Precopy's switchover: pause, send the final round and the vCPU state,
//! hand over, verify the digest, then commit (stay paused) or roll back (run
//! again). See the module docs of [`super`] for why the digest is checked
//! after resume; the steps it shares with postcopy are in
//! `crate::session`'s `switchover.rs`.

use crate::error::MigrationError;
use crate::progress::Phase;
use crate::session::{unexpected, Source};
use crate::summary::{Outcome, RoundKind};
use crate::wire::Message;
use ferry_vm::DirtyPages;
use std::time::{Duration, Instant};

impl Source<'_> {
    /// Settle, pause, send the rest, hand over, verify, and commit or roll
    /// back. A guest a policy holds first runs free until it has dirtied
    /// `settle` bytes, or briefly (`converge::settle`).
    pub(crate) fn switchover(
        &mut self,
        round: u32,
        mut dirty: DirtyPages,
        strict: bool,
        settle: u64,
    ) -> Result<(), MigrationError> {
        if let Some(s) = self.convergence.converger.settle(&mut *self.vm, settle) {
            self.summary.switchover.settle_ms = s.ms;
            self.summary.switchover.settle_pages = s.pages;
            self.summary.switchover.settle_all_ran = s.all_ran;
        }
        let paused_at = self.pause_for_switchover()?;
        let mut last = Instant::now();
        let (_, harvest) = self.harvest(&mut dirty, &mut last)?;
        self.send_round(round, RoundKind::Final, &dirty)?;
        self.finish_round(0, Duration::ZERO, harvest);
        if std::env::var_os("FERRY_DIGEST_DUMP").is_some() {
            // The digest diagnostic: nothing may be dirtied while paused.
            let mut after = DirtyPages::new(self.pages);
            let mut t = Instant::now();
            let (n, _) = self.harvest(&mut after, &mut t)?;
            let first: Vec<u64> = after.iter().take(8).map(|g| g.0).collect();
            tracing::warn!("pages dirtied after the final harvest, while paused: {n} {first:x?}");
        }
        self.send_vcpu_state()?;
        self.links.ctl.send(&Message::Switchover {
            verify_before_resume: strict,
            final_round: round,
            postcopy: false,
            // The guest was paused before the switchover paused it.
            paused: !self.phase.paused_by_us(),
        })?;

        self.progress.phase(Phase::Verifying);
        let mut digest = None;
        let mut resumed = false;
        if strict && self.dest_takes.held_outputs {
            // The destination holds its guest's outputs (capability
            // held-outputs): it resumes at once, before it needs our
            // digest, so its Resumed comes first and the downtime ends
            // there, not after the hashing below.
            match self.links.ctl.recv_message("Resumed")? {
                (Message::Resumed { resume_ns }, _) => {
                    resumed = true;
                    self.record_resumed(paused_at, resume_ns);
                    self.yield_to_resumed_guest();
                }
                (m, offset) => return Err(unexpected("Resumed", &m, offset)),
            }
        }
        if strict {
            digest = Some(self.send_digest()?);
        }
        let (matched, dest) = loop {
            match self.links.ctl.recv_message("Resumed or Verified")? {
                (Message::Resumed { resume_ns }, _) if !resumed => {
                    resumed = true;
                    self.record_resumed(paused_at, resume_ns);
                    if digest.is_none() {
                        self.yield_to_resumed_guest();
                        digest = Some(self.send_digest()?);
                    }
                }
                (Message::Verified { matched, dest }, _) if digest.is_some() => {
                    break (matched, dest)
                }
                (m, offset) => return Err(unexpected("Resumed or Verified", &m, offset)),
            }
        };
        self.phase.verdict()?;
        let ours = digest.unwrap_or(dest);
        self.summary.digest_match = matched;
        self.summary.digest_checked = true;
        if !matched {
            let err = MigrationError::DigestMismatch {
                source_digest: ours.value,
                dest_digest: dest.value,
            };
            tracing::error!("{err}; the destination paused its guest, the source resumes");
            self.rollback();
            self.summary.error = Some(err.to_string());
            return Ok(());
        }
        if ours != dest {
            tracing::warn!("destination reports a match for digest {dest:?}, ours is {ours:?}");
        }
        // From the verdict on, this source never runs the guest again: the
        // destination may already run it. Commit tells it so; should
        // Commit be lost, the destination pauses its copy too, and the
        // guest waits, paused and verified on both ends, for an operator:
        // stopped, never split in two.
        if let Err(e) = self.links.ctl.send(&Message::Commit) {
            self.commit()?;
            self.summary.status = Outcome::Held;
            self.summary.error = Some(format!(
                "the link failed as the source confirmed the commit ({}): unless the \
                 confirmation reached it, the destination holds its copy paused too; this \
                 source holds its paused, verified copy for an operator to resume (cont) \
                 once sure the destination's does not run",
                e.chain()
            ));
            return Ok(());
        }
        self.commit()?;
        if !resumed {
            // A strict destination resumes only once it has the Commit.
            match self.links.ctl.recv_message("Resumed") {
                Ok((Message::Resumed { resume_ns }, _)) => {
                    self.record_resumed(paused_at, resume_ns);
                }
                Ok((m, offset)) => {
                    self.summary.error = Some(unexpected("Resumed", &m, offset).to_string());
                }
                Err(e) => {
                    self.summary.error = Some(format!(
                        "migration committed, but the destination did not say it resumed: {}",
                        e.chain()
                    ));
                }
            }
        }
        self.collect_report();
        Ok(())
    }
}
