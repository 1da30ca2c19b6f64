//! QEMU 8.1's dirty-limit, the second baseline next to auto-converge.
//!
//! Triggered as the quota is (dirtying above half of what a round sent),
//! it gives every vCPU the same dirty-rate limit: an equal share of half the
//! link, halved while dirtying still outruns the link, down to QEMU's default
//! of 1 MB/s. The backend enforces
//! it with a feedback loop per vCPU (`ferry_backend::dirty_limit`): each
//! writer's own time throttle follows its measured rate, so readers run on.
//! The difference from the quota is the enforcement: a rate measured per
//! period and a throttle that converges on it, against a budget that is
//! slept off as soon as it is spent.

use super::{Action, Policy, RoundSample};

/// Dirtying above this share of the transfer engages the limit.
pub const THRESHOLD_PCT: u64 = 50;
/// The share of the link the guest may dirty at first, in percent.
pub const INITIAL_SHARE_PCT: u64 = 50;
/// The lowest limit, per vCPU: QEMU's default `vcpu-dirty-limit`, 1 MB/s.
/// Lower, a reader's own bookkeeping writes would count as dirtying.
pub const MIN_LIMIT: u64 = 1_000_000;

/// The dirty-limit policy's state.
#[derive(Debug, Default)]
pub struct DirtyLimitPolicy {
    /// Share of the link the guest may dirty, in 1/1024ths (0: not engaged).
    share: u64,
}

impl DirtyLimitPolicy {
    fn limit(&self, s: &RoundSample) -> Action {
        let total = s.link_bytes_per_sec * self.share as f64 / 1024.0;
        let per_vcpu = (total / f64::from(s.vcpus.max(1))) as u64;
        Action::Limit(Some(per_vcpu.max(MIN_LIMIT)))
    }

    fn outrun(s: &RoundSample) -> bool {
        s.round > 0 && s.sent_bytes > 0 && s.dirty_bytes * 100 > s.sent_bytes * THRESHOLD_PCT
    }
}

impl Policy for DirtyLimitPolicy {
    fn name(&self) -> &'static str {
        "dirty-limit"
    }

    fn decide(&mut self, s: &RoundSample) -> Option<Action> {
        if self.share == 0 {
            if !Self::outrun(s) {
                return None;
            }
            self.share = INITIAL_SHARE_PCT * 1024 / 100;
        } else if Self::outrun(s) {
            self.share = (self.share / 2).max(1);
        }
        Some(self.limit(s))
    }

    fn engage(&mut self, s: &RoundSample) -> Option<Action> {
        if self.share != 0 {
            return None;
        }
        self.share = INITIAL_SHARE_PCT * 1024 / 100;
        Some(self.limit(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converge::sample;

    #[test]
    fn engages_when_outrun_and_halves_while_outrun() {
        let mut p = DirtyLimitPolicy::default();
        assert_eq!(p.decide(&sample(1, 40, 100)), None, "below half");
        // 1 GB/s × 50% / 2 vCPUs = 250 MB/s each.
        let Some(Action::Limit(Some(first))) = p.decide(&sample(2, 60, 100)) else {
            panic!("not engaged");
        };
        assert!((249_000_000..=250_000_000).contains(&first), "{first}");
        let Some(Action::Limit(Some(second))) = p.decide(&sample(3, 60, 100)) else {
            panic!("no action");
        };
        assert!(
            (second as f64 - first as f64 / 2.0).abs() < 500_000.0,
            "{second}"
        );
        assert_eq!(p.engage(&sample(4, 10, 100)), None, "already on");
    }
}
