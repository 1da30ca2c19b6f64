//! The source's postcopy switchover: pause, hand over at once, then serve
//! requests and push every missing page until the destination has them all.

use super::recoverable;
use crate::error::MigrationError;
use crate::progress::Phase;
use crate::session::{ship, unexpected, Source};
use crate::summary::RoundKind;
use crate::transport::Dial;
use crate::wire::messages::Hello;
use crate::wire::messages::MAX_MISSING_RUNS;
use crate::wire::{MemoryDigest, Message};
use ferry_vm::DirtyPages;
use std::time::{Duration, Instant};

impl Source<'_> {
    /// Missing pages not handed to a connection yet, for a postcopy that
    /// failed.
    pub(crate) fn unsent(&self) -> u64 {
        self.links.server.as_ref().map_or(0, |s| s.served.unsent())
    }

    /// Switches to postcopy after `round` precopy rounds: the destination
    /// lacks `dirty` (everything, in pure postcopy).
    pub(crate) fn postcopy_switchover(
        &mut self,
        round: u32,
        mut dirty: DirtyPages,
        dialer: &dyn Dial,
        hello: &dyn Fn(u16) -> Hello,
    ) -> Result<(), MigrationError> {
        let paused_at = self.pause_for_switchover()?;
        if self.convergence.logging {
            let mut last = Instant::now();
            let (_, harvest) = self.harvest(&mut dirty, &mut last)?;
            self.finish_round(0, Duration::ZERO, harvest);
        }
        self.send_vcpu_state()?;
        for runs in dirty
            .runs()
            .chunks(MAX_MISSING_RUNS)
            .map(|c| c.iter().map(|(g, n)| (g.0, *n)).collect::<Vec<_>>())
        {
            self.links.ctl.send(&Message::Missing(runs))?;
        }
        let missing = dirty.count();
        self.summary.postcopy.get_or_insert_default().missing_pages = missing;
        let Some(server) = self.links.server.as_ref() else {
            return Err(MigrationError::Aborted);
        };
        server.served.arm(round, &dirty);
        self.links.ctl.send(&Message::Switchover {
            verify_before_resume: false,
            final_round: round,
            postcopy: true,
            paused: false,
        })?;
        // From here the guest is the destination's: never resume this copy,
        // keep every page that has not gone out.
        self.phase.switch_to_postcopy()?;
        self.postcopy_round = round;
        self.convergence.converger.release(&mut *self.vm);
        self.stop_logging("at the postcopy switchover");
        match self.links.ctl.recv_message("Resumed")? {
            (Message::Resumed { resume_ns }, _) => {
                self.record_resumed(paused_at, resume_ns);
            }
            (m, offset) => return Err(unexpected("Resumed", &m, offset)),
        }
        self.finish_postcopy(round, dialer, hello)
    }

    /// After the guest resumed on the destination: push, digest and
    /// verdict, recovering from cuts, then commit and read the report.
    pub(crate) fn finish_postcopy(
        &mut self,
        round: u32,
        dialer: &dyn Dial,
        hello: &dyn Fn(u16) -> Hello,
    ) -> Result<(), MigrationError> {
        let (ours, matched, dest) = loop {
            match self.push_and_verify(round) {
                Ok(v) => break v,
                Err(e) => {
                    let e = self.links.health.settle(e);
                    if !recoverable(&e) || self.opts.recover_timeout.is_zero() {
                        return Err(e);
                    }
                    tracing::warn!(
                        "postcopy connections broke ({}); reconnecting for up to {} s",
                        e.chain(),
                        self.opts.recover_timeout.as_secs()
                    );
                    self.progress.phase(Phase::Recovering);
                    let deadline = Instant::now() + self.opts.recover_timeout;
                    self.recover(dialer, hello, round, deadline, e)?;
                    self.summary.postcopy.get_or_insert_default().recoveries += 1;
                }
            }
        };
        self.phase.verdict()?;
        self.summary.digest_checked = true;
        self.summary.digest_match = matched;
        if !matched {
            // Nothing to roll back to: the guest has run on the destination.
            return Err(MigrationError::DigestMismatch {
                source_digest: ours.value,
                dest_digest: dest.value,
            });
        }
        self.commit()?;
        self.collect_report();
        Ok(())
    }

    /// Pushes what is left, sends the digest and reads the verdict:
    /// (our digest, whether it matched, the destination's digest).
    fn push_and_verify(
        &mut self,
        round: u32,
    ) -> Result<(MemoryDigest, bool, MemoryDigest), MigrationError> {
        self.progress.phase(Phase::Postcopy);
        self.push(round)?;
        self.progress.phase(Phase::Verifying);
        let ours = self.send_digest()?;
        match self.links.ctl.recv_message("Verified")? {
            (Message::Verified { matched, dest }, _) => Ok((ours, matched, dest)),
            (m, offset) => Err(unexpected("Verified", &m, offset)),
        }
    }

    /// Sends every missing page the page server has not, as round `round`,
    /// from wherever the destination last asked.
    fn push(&mut self, round: u32) -> Result<(), MigrationError> {
        let t = Instant::now();
        let bytes_at = self.links.health.data_bytes();
        let Some(served) = self
            .links
            .server
            .as_ref()
            .map(|s| std::sync::Arc::clone(&s.served))
        else {
            return Err(MigrationError::Aborted);
        };
        let Some(senders) = self.links.senders.as_mut() else {
            return Err(MigrationError::Aborted);
        };
        self.progress.round_started(round, served.unsent());
        let (mut pages, mut zero, mut raw) = (0u64, 0u64, 0u64);
        let mut cursor = 0u64;
        let mut batch = senders.batch()?;
        while let Some((first, n)) = served.next_run(&mut cursor, batch.room()) {
            let buf = batch.push_run(first, n);
            self.ram
                .read_pages_to_send(first, buf)
                .map_err(MigrationError::ram("read guest memory"))?;
            if batch.room() == 0 {
                let full = std::mem::replace(&mut batch, senders.batch()?);
                let (p, z, r) = ship(senders, full, round, false, self.opts, self.progress)?;
                pages += p;
                zero += z;
                raw += r;
            }
        }
        if batch.is_empty() {
            senders.recycle(batch);
        } else {
            let (p, z, r) = ship(senders, batch, round, false, self.opts, self.progress)?;
            pages += p;
            zero += z;
            raw += r;
        }
        senders.end_round(round)?;
        self.record_round(round, RoundKind::Postcopy, t, bytes_at, (pages, zero, raw));
        Ok(())
    }
}
