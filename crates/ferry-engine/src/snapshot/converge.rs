//! Convergence during a live snapshot: a migration's policies, with the
//! file as the link.
//!
//! **Why.** A guest that dirties memory faster than the file takes it
//! (a slow disk, or the operator's bandwidth cap, which paces the writes)
//! leaves as much dirty at every round's end as at the last, and the pause
//! then writes it all: the pause grows with the guest's write rate, not
//! with the downtime target. A migration answers that with its policies
//! (`converge`); a snapshot runs the same ones, on the same samples:
//! - the link is the file's measured rate (guest bytes a second, so a hole
//!   written for a zero page counts as what it saves), capped by the
//!   operator's bandwidth cap ([`LinkEstimate`]);
//! - an interval sample between the chunks of a round, and a harvest's at
//!   each round's end, which also feeds the stall detector (a stall
//!   engages the policy; the snapshot's downtime target is never raised);
//! - before the pause, a guest the policy holds settles (runs free for a
//!   moment, `converge::settle`), so a vCPU asleep on its quota does not
//!   carry its sleep into the pause;
//! - a snapshot that fails or is cancelled lifts whatever it set.

use super::pages::Written;
use crate::converge::{
    self, ConvergeMode, Converger, LinkEstimate, RoundEnd, Sample, Settled, Transfer,
};
use crate::error::SnapshotError;
use crate::progress::Progress;
use crate::summary::ConvergenceReport;
use crate::Tunables;
use ferry_vm::{Vm, PAGE_SIZE};
use std::time::Duration;

/// The policy a snapshot runs, and the file as its link.
pub(super) struct FileConvergence {
    converger: Converger,
    link: LinkEstimate,
    /// The snapshot's downtime target: the samples' (never raised).
    target: Duration,
}

impl FileConvergence {
    /// The policy `requested` (or, by default, the best `vm` serves), for
    /// a snapshot that aims at pauses of `target`. A policy the VM does
    /// not serve is refused, naming what it needs.
    pub fn new(
        vm: &mut dyn Vm,
        requested: Option<ConvergeMode>,
        target: Duration,
    ) -> Result<Self, SnapshotError> {
        let mode =
            converge::choose(requested, vm).map_err(|e| SnapshotError::Converge(Box::new(e)))?;
        Ok(FileConvergence {
            // A stall engages the policy and never raises a downtime
            // target: a cap of zero is under any target (the one a
            // migration's escalation raises is the VM's tunable, which a
            // snapshot leaves alone).
            converger: Converger::new(mode, Duration::ZERO),
            link: LinkEstimate::default(),
            target,
        })
    }

    /// Starts metering each vCPU's writes (as the dirty logs start).
    pub fn start(&mut self, vm: &mut dyn Vm) {
        self.converger.start_meter(vm);
    }

    /// Between two chunks of round `round`: `so_far` written in `secs`,
    /// `left` pages of the round to go. Serves the operator's requests at
    /// once, and the policy once per interval.
    pub fn between_chunks(
        &mut self,
        vm: &mut dyn Vm,
        tunables: &Tunables,
        progress: &dyn Progress,
        round: u32,
        (so_far, secs): (Written, f64),
        left: u64,
    ) -> Result<(), SnapshotError> {
        let result = if self.converger.interval_due(tunables) {
            self.link.learn(transfer(so_far, secs, false));
            let sample = self.sample(vm, tunables, round, left, None);
            self.converger.on_interval(sample, vm, tunables)
        } else {
            self.converger.live_requests(vm, tunables, round)
        };
        self.show_steps(progress);
        result.map_err(|e| SnapshotError::Converge(Box::new(e)))
    }

    /// At round `round`'s end: it wrote `done` in `secs`, and the harvest
    /// found `dirty` pages. Runs the policy and the stall detector.
    pub fn after_round(
        &mut self,
        vm: &mut dyn Vm,
        tunables: &Tunables,
        progress: &dyn Progress,
        round: u32,
        (done, secs): (Written, f64),
        dirty: u64,
    ) -> Result<(), SnapshotError> {
        self.link.learn(transfer(done, secs, true));
        let end = RoundEnd {
            dirty_bytes: dirty * PAGE_SIZE as u64,
            sent_bytes: done.pages * PAGE_SIZE as u64,
        };
        let sample = self.sample(vm, tunables, round, dirty, Some(end));
        let result = self.converger.after_round(sample, vm, tunables);
        self.show_steps(progress);
        result.map_err(|e| SnapshotError::Converge(Box::new(e)))
    }

    /// Guest bytes a second the file takes, as measured, within the cap.
    pub fn rate(&self, tunables: &Tunables) -> f64 {
        self.link.guest_rate(tunables.bandwidth_bytes_per_sec())
    }

    /// Just before the pause: a guest the policy holds runs free until it
    /// has dirtied what the target's slack over `predicted` writes, or
    /// briefly; then nothing holds it. What the settle did, if one ran.
    pub fn settle(
        &mut self,
        vm: &mut dyn Vm,
        tunables: &Tunables,
        predicted: Duration,
    ) -> Option<Settled> {
        let allowance = converge::settle_allowance(predicted, self.target, self.rate(tunables));
        let settled = self.converger.settle(vm, allowance);
        self.converger.release(vm);
        settled
    }

    /// Lifts whatever the policy set (a failed or cancelled snapshot).
    pub fn release(&mut self, vm: &mut dyn Vm) {
        self.converger.release(vm);
    }

    /// The policy that ran and what it did, for the summary (once: the
    /// steps are taken).
    pub fn report(&mut self) -> ConvergenceReport {
        ConvergenceReport {
            converge: Some(self.converger.mode()),
            predicted: None,
            throttle_timeline: std::mem::take(&mut self.converger.timeline),
            escalations: std::mem::take(&mut self.converger.escalations),
            operator_changes: std::mem::take(&mut self.converger.operator_changes),
            vcpu_shares: Vec::new(),
        }
    }

    fn sample(
        &mut self,
        vm: &mut dyn Vm,
        tunables: &Tunables,
        round: u32,
        left_pages: u64,
        round_end: Option<RoundEnd>,
    ) -> Sample {
        let (elapsed, vcpu_dirty_bytes) = self.converger.read_meter(vm);
        Sample {
            round,
            elapsed,
            vcpu_dirty_bytes,
            remaining_bytes: left_pages * PAGE_SIZE as u64,
            guest_bytes: vm.ram().size(),
            link_bytes_per_sec: self.rate(tunables),
            downtime_target: self.target,
            quota_interval: tunables.quota_interval(),
            vcpus: vm.vcpus(),
            round_end,
            within_round_found: None,
            resends_found: None,
        }
    }

    /// Tells the progress display of each throttle change since the last.
    fn show_steps(&mut self, progress: &dyn Progress) {
        for step in self.converger.unreported() {
            progress.throttle_changed(step);
        }
    }
}

/// What a pass wrote, as a link's transfer: guest bytes in, file bytes
/// out (a hole for a zero page is written as nothing).
fn transfer(w: Written, secs: f64, whole_round: bool) -> Transfer {
    Transfer {
        raw: w.pages * PAGE_SIZE as u64,
        wire: w.bytes,
        secs,
        whole_round,
    }
}
