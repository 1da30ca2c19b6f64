//! Progress callbacks, so a CLI can drive a progress bar (indicatif) or a
//! control socket can stream events, without the engine knowing which.
//! Every method has an empty default; [`NoProgress`] is the no-op observer.

use crate::summary::{RoundStats, ThrottleStep};

/// Where a migration is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// Exchanging preamble, header and Accept.
    Handshake,
    /// The first pass over all memory.
    FullPass,
    /// Re-sending pages dirtied since the previous round.
    DirtyRounds,
    /// Source paused: final pages and vCPU state.
    Switchover,
    /// Postcopy: the guest runs on the destination, pages follow.
    Postcopy,
    /// Postcopy: the connections broke; reconnecting.
    Recovering,
    /// Computing and comparing the memory digest.
    Verifying,
    /// Waiting for the destination's guest report.
    Reporting,
    /// Finished (successfully or not).
    Done,
}

/// Observer of a migration's progress. Called on the migrating thread, so
/// implementations must be quick.
pub trait Progress {
    /// The migration entered `phase`.
    fn phase(&self, _phase: Phase) {}
    /// Round `round` (0 = full pass) starts and will send `pages` pages.
    fn round_started(&self, _round: u32, _pages: u64) {}
    /// A batch of `pages` pages (`bytes` on the wire) was sent.
    fn pages_sent(&self, _pages: u64, _bytes: u64) {}
    /// A round finished.
    fn round_finished(&self, _stats: &RoundStats) {}
    /// The convergence policy changed the vCPUs' throttle or quota.
    fn throttle_changed(&self, _step: &ThrottleStep) {}
    /// After each round: the downtime the final round would cost if the
    /// guest paused now (`precopy::downtime`).
    fn downtime_predicted(&self, _downtime: std::time::Duration) {}
}

/// Reports nothing.
#[derive(Copy, Clone, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// Reports to two observers, in order (a progress bar and a monitor).
#[derive(Copy, Clone)]
pub struct Both<'a>(pub &'a dyn Progress, pub &'a dyn Progress);

impl Progress for Both<'_> {
    fn phase(&self, phase: Phase) {
        self.0.phase(phase);
        self.1.phase(phase);
    }
    fn round_started(&self, round: u32, pages: u64) {
        self.0.round_started(round, pages);
        self.1.round_started(round, pages);
    }
    fn pages_sent(&self, pages: u64, bytes: u64) {
        self.0.pages_sent(pages, bytes);
        self.1.pages_sent(pages, bytes);
    }
    fn round_finished(&self, stats: &RoundStats) {
        self.0.round_finished(stats);
        self.1.round_finished(stats);
    }
    fn throttle_changed(&self, step: &ThrottleStep) {
        self.0.throttle_changed(step);
        self.1.throttle_changed(step);
    }
    fn downtime_predicted(&self, downtime: std::time::Duration) {
        self.0.downtime_predicted(downtime);
        self.1.downtime_predicted(downtime);
    }
}
