//! QEMU 8.1's dirty-limit, the second baseline next to auto-converge.
//!
//! Triggered as the quota is (dirtying above half of what a round sent),
//! it gives every vCPU the same dirty-rate limit: an equal share of half the
//! link, halved while dirtying still outruns the link, down to QEMU's default
//! of 1 MB/s. The backend enforces
//! it with a feedback loop per vCPU (`ferry_vm::dirty_limit`): each
//! writer's own time throttle follows its measured rate, so readers run on.
//! The difference from the quota is the enforcement: a rate measured per
//! period and a throttle that converges on it, against a budget that is
//! slept off as soon as it is spent.

use super::share::LinkShare;
use super::{Action, Policy, Sample};

/// The lowest limit, per vCPU: QEMU's default `vcpu-dirty-limit`, 1 MB/s.
/// Lower, a reader's own bookkeeping writes would count as dirtying.
pub const MIN_LIMIT: u64 = 1_000_000;

/// The dirty-limit policy's state.
#[derive(Debug, Default)]
pub struct DirtyLimitPolicy {
    share: LinkShare,
}

fn limit(per_sec: f64) -> Action {
    Action::Limit(Some((per_sec as u64).max(MIN_LIMIT)))
}

impl Policy for DirtyLimitPolicy {
    fn name(&self) -> &'static str {
        "dirty-limit"
    }

    fn decide(&mut self, s: &Sample) -> Option<Action> {
        self.share.decide(s).map(limit)
    }

    fn engage(&mut self, s: &Sample) -> Option<Action> {
        self.share.engage(s).map(limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converge::sample::sample;

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
