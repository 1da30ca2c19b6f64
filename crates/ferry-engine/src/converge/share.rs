//! The budget both per-vCPU policies (quota and dirty-limit) give the
//! guest: a share of the link, split equally between the vCPUs.
//!
//! It engages once dirtying outruns the link (dirtied bytes above half the
//! bytes a round sent, as auto-converge counts it) at half the link, and
//! halves while dirtying still outruns it, so the bytes left shrink at least
//! geometrically. The policies differ only in how the backend enforces it.

use super::RoundSample;

/// Dirtying above this share of the transfer engages the budget.
pub const THRESHOLD_PCT: u64 = 50;
/// The share of the link the guest may dirty at first, in percent.
pub const INITIAL_SHARE_PCT: u64 = 50;

/// The share in force.
#[derive(Debug, Default)]
pub(super) struct LinkShare {
    /// In 1/1024ths of the link (0: not engaged).
    share: u64,
}

impl LinkShare {
    fn outrun(s: &RoundSample) -> bool {
        s.round > 0 && s.sent_bytes > 0 && s.dirty_bytes * 100 > s.sent_bytes * THRESHOLD_PCT
    }

    /// Each vCPU's budget in bytes per second after round `s`, once engaged.
    pub fn decide(&mut self, s: &RoundSample) -> Option<f64> {
        if self.share == 0 {
            if !Self::outrun(s) {
                return None;
            }
            self.share = INITIAL_SHARE_PCT * 1024 / 100;
        } else if Self::outrun(s) {
            self.share = (self.share / 2).max(1);
        }
        Some(self.per_vcpu(s))
    }

    /// Engages at once (a stall): the budget, or `None` if already engaged.
    pub fn engage(&mut self, s: &RoundSample) -> Option<f64> {
        if self.share != 0 {
            return None;
        }
        self.share = INITIAL_SHARE_PCT * 1024 / 100;
        Some(self.per_vcpu(s))
    }

    fn per_vcpu(&self, s: &RoundSample) -> f64 {
        let total = s.link_bytes_per_sec * self.share as f64 / 1024.0;
        total / f64::from(s.vcpus.max(1))
    }
}
