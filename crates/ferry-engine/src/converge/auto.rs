//! QEMU's auto-converge, the baseline policy.
//!
//! At every dirty-bitmap sync, QEMU compares the bytes the guest dirtied in
//! the period with the bytes it transferred. When dirtying exceeds half the
//! transfer twice, it throttles every vCPU: 20% at first, then 10 points
//! more at each further trigger, up to 99%. A vCPU at p% sleeps
//! p/(1 − p) × 10 ms after each 10 ms it runs (the backends'
//! `set_time_throttle`). Readers are slowed as much as writers, which is
//! what the seed's per-vCPU quota improves on.

use super::{Action, Policy, Sample};

/// First throttle, in percent.
pub const INITIAL_PCT: u8 = 20;
/// Added at each further trigger.
pub const INCREMENT_PCT: u8 = 10;
/// Most throttle.
pub const MAX_PCT: u8 = 99;
/// Dirtying above this share of the transfer counts as a trigger.
pub const THRESHOLD_PCT: u64 = 50;
/// Triggers before the throttle moves.
pub const TRIGGERS: u32 = 2;

/// QEMU's auto-converge state.
#[derive(Debug, Default)]
pub struct AutoConverge {
    high: u32,
    pct: u8,
}

impl AutoConverge {
    fn step(&mut self) -> u8 {
        self.pct = if self.pct == 0 {
            INITIAL_PCT
        } else {
            self.pct.saturating_add(INCREMENT_PCT).min(MAX_PCT)
        };
        self.pct
    }
}

impl Policy for AutoConverge {
    fn name(&self) -> &'static str {
        "auto"
    }

    fn decide(&mut self, s: &Sample) -> Option<Action> {
        // QEMU's period is a dirty-bitmap sync: here, a harvest.
        let end = s.round_end?;
        // The full pass sends memory nobody dirtied since: not a period.
        if s.round == 0 || end.sent_bytes == 0 {
            return None;
        }
        if end.dirty_bytes * 100 <= end.sent_bytes * THRESHOLD_PCT {
            return None;
        }
        self.high += 1;
        if self.high < TRIGGERS {
            return None;
        }
        self.high = 0;
        Some(Action::Time(self.step()))
    }

    fn engage(&mut self, _: &Sample) -> Option<Action> {
        (self.pct == 0).then(|| Action::Time(self.step()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converge::sample::{interval, sample};

    #[test]
    fn throttles_after_two_high_periods_then_steps_to_the_cap() {
        let mut a = AutoConverge::default();
        assert_eq!(a.decide(&sample(1, 40, 100)), None, "40% is below half");
        assert_eq!(a.decide(&sample(2, 60, 100)), None, "one trigger");
        assert_eq!(a.decide(&sample(3, 60, 100)), Some(Action::Time(20)));
        assert_eq!(a.decide(&sample(4, 60, 100)), None);
        assert_eq!(a.decide(&sample(5, 60, 100)), Some(Action::Time(30)));
        for r in 6..40 {
            a.decide(&sample(r, 90, 100));
        }
        assert_eq!(a.decide(&sample(40, 90, 100)), None);
        assert_eq!(
            a.decide(&sample(41, 90, 100)),
            Some(Action::Time(99)),
            "capped"
        );
        assert_eq!(a.engage(&sample(42, 0, 0)), None, "already on");
    }

    #[test]
    fn only_harvests_are_periods() {
        let mut a = AutoConverge::default();
        for _ in 0..10 {
            assert_eq!(a.decide(&interval(2, &[1 << 30, 1 << 30])), None);
        }
        assert_eq!(a.decide(&sample(2, 60, 100)), None, "the first trigger");
    }

    #[test]
    fn the_full_pass_is_not_a_period_and_engage_starts_at_20() {
        let mut a = AutoConverge::default();
        assert_eq!(a.decide(&sample(0, 1000, 100)), None);
        assert_eq!(a.decide(&sample(0, 1000, 100)), None);
        assert_eq!(a.engage(&sample(1, 0, 0)), Some(Action::Time(INITIAL_PCT)));
    }
}
