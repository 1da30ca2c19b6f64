//! The seed's per-vCPU dirty quota.
//!
//! Once dirtying outruns the link (dirtied bytes above half the bytes sent
//! in a round, as auto-converge counts it), every vCPU gets a quota per
//! quota interval (100 ms unless the operator sets another, even mid-migration):
//! an equal share of half the link's rate. A vCPU that
//! dirties its share sleeps until the next interval; a vCPU that reads, or
//! writes little, never notices. The quota follows the measured link each
//! round, and halves while dirtying still outruns the link, so the bytes
//! left shrink at least geometrically.

use super::share::LinkShare;
use super::{Action, Policy, Sample};
use ferry_backend::Quota;

/// The quota policy's state.
#[derive(Debug, Default)]
pub struct QuotaPolicy {
    share: LinkShare,
}

/// A budget in bytes per second as a quota per the sample's interval.
fn quota(s: &Sample, per_sec: f64) -> Action {
    let bytes = (per_sec * s.quota_interval.as_secs_f64()) as u64;
    Action::Quota(Some(Quota::new(bytes, s.quota_interval)))
}

impl Policy for QuotaPolicy {
    fn name(&self) -> &'static str {
        "quota"
    }

    fn decide(&mut self, s: &Sample) -> Option<Action> {
        self.share.decide(s).map(|r| quota(s, r))
    }

    fn engage(&mut self, s: &Sample) -> Option<Action> {
        self.share.engage(s).map(|r| quota(s, r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converge::sample::sample;

    #[test]
    fn engages_on_the_first_outrun_round_and_halves_while_outrun() {
        let mut q = QuotaPolicy::default();
        assert_eq!(q.decide(&sample(0, 900, 100)), None, "the full pass");
        assert_eq!(q.decide(&sample(1, 40, 100)), None, "below half");
        // 1 GB/s × 100 ms × 50% / 2 vCPUs = 25 MB each.
        let Some(Action::Quota(Some(Quota { bytes: first, .. }))) = q.decide(&sample(2, 60, 100))
        else {
            panic!("not engaged");
        };
        assert!((24_900_000..=25_000_000).contains(&first), "{first}");
        let Some(Action::Quota(Some(Quota { bytes: second, .. }))) = q.decide(&sample(3, 60, 100))
        else {
            panic!("no action");
        };
        assert!(
            (second as f64 - first as f64 / 2.0).abs() < 50_000.0,
            "{second}"
        );
        // Converging: the share holds, the quota follows the link.
        assert_eq!(
            q.decide(&sample(4, 10, 100)),
            Some(Action::Quota(Some(Quota::new(
                second,
                ferry_backend::QUOTA_INTERVAL
            ))))
        );
        assert_eq!(q.engage(&sample(5, 10, 100)), None, "already on");
    }
}
