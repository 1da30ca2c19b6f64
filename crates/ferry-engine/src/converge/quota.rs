//! The seed's per-vCPU dirty quota.
//!
//! Once dirtying outruns the link (dirtied bytes above half the bytes sent
//! in a round, as auto-converge counts it), every vCPU gets a quota per
//! `QUOTA_INTERVAL`: an equal share of half the link's rate. A vCPU that
//! dirties its share sleeps until the next interval; a vCPU that reads, or
//! writes little, never notices. The quota follows the measured link each
//! round, and halves while dirtying still outruns the link, so the bytes
//! left shrink at least geometrically.

use super::{Action, Policy, RoundSample};
use ferry_backend::{PAGE_SIZE, QUOTA_INTERVAL};

/// Dirtying above this share of the transfer engages the quota.
pub const THRESHOLD_PCT: u64 = 50;
/// The share of the link the guest may dirty at first, in percent.
pub const INITIAL_SHARE_PCT: u64 = 50;

/// The quota policy's state.
#[derive(Debug, Default)]
pub struct QuotaPolicy {
    /// Share of the link the guest may dirty, in 1/1024ths (0: not engaged).
    share: u64,
}

impl QuotaPolicy {
    /// Bytes each vCPU may dirty per interval at the current share.
    fn quota(&self, s: &RoundSample) -> Action {
        let link_per_interval = s.link_bytes_per_sec * QUOTA_INTERVAL.as_secs_f64();
        let total = link_per_interval * self.share as f64 / 1024.0;
        let per_vcpu = (total / f64::from(s.vcpus.max(1))) as u64;
        Action::Quota(Some(per_vcpu.max(PAGE_SIZE as u64)))
    }

    fn outrun(s: &RoundSample) -> bool {
        s.round > 0 && s.sent_bytes > 0 && s.dirty_bytes * 100 > s.sent_bytes * THRESHOLD_PCT
    }
}

impl Policy for QuotaPolicy {
    fn name(&self) -> &'static str {
        "quota"
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
        Some(self.quota(s))
    }

    fn engage(&mut self, s: &RoundSample) -> Option<Action> {
        if self.share != 0 {
            return None;
        }
        self.share = INITIAL_SHARE_PCT * 1024 / 100;
        Some(self.quota(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converge::sample;

    #[test]
    fn engages_on_the_first_outrun_round_and_halves_while_outrun() {
        let mut q = QuotaPolicy::default();
        assert_eq!(q.decide(&sample(0, 900, 100)), None, "the full pass");
        assert_eq!(q.decide(&sample(1, 40, 100)), None, "below half");
        // 1 GB/s × 100 ms × 50% / 2 vCPUs = 25 MB each.
        let Some(Action::Quota(Some(first))) = q.decide(&sample(2, 60, 100)) else {
            panic!("not engaged");
        };
        assert!((24_900_000..=25_000_000).contains(&first), "{first}");
        let Some(Action::Quota(Some(second))) = q.decide(&sample(3, 60, 100)) else {
            panic!("no action");
        };
        assert!(
            (second as f64 - first as f64 / 2.0).abs() < 50_000.0,
            "{second}"
        );
        // Converging: the share holds, the quota follows the link.
        assert_eq!(
            q.decide(&sample(4, 10, 100)),
            Some(Action::Quota(Some(second)))
        );
        assert_eq!(q.engage(&sample(5, 10, 100)), None, "already on");
    }
}
