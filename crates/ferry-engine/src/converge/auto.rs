//! QEMU's auto-converge, the baseline policy.
//!
//! At a dirty-bitmap sync that ends a period of at least a second, QEMU
//! compares the bytes the guest dirtied in the period with the bytes it
//! transferred (`migration_bitmap_sync` and `migration_trigger_throttle`
//! in QEMU 7.2's `migration/ram.c`). When dirtying exceeds half the
//! transfer twice, it throttles every vCPU: 20% at first, then 10 points
//! more at each further trigger, up to 99%. A vCPU at p% sleeps
//! p/(1 − p) × 10 ms after each 10 ms it runs (the backends'
//! `set_time_throttle`). Readers are slowed as much as writers, which is
//! what the seed's per-vCPU quota improves on.
//!
//! Here a sync is a harvest. As in QEMU, syncs less than [`PERIOD`] apart
//! add up into one period (a fast link's short rounds would otherwise step
//! the throttle several times a second), and the first pass is a period
//! like any other: a guest that dirtied more than half of memory while it
//! was sent counts once.

use super::{Action, Policy, Sample};
use std::time::Duration;

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
/// The shortest period: QEMU checks at a sync more than 1 s after the last
/// period's end.
pub const PERIOD: Duration = Duration::from_secs(1);

/// QEMU's auto-converge state.
#[derive(Debug, Default)]
pub struct AutoConverge {
    high: u32,
    pct: u8,
    /// The period so far: time since its start, bytes dirtied and sent.
    period: Duration,
    dirty: u64,
    sent: u64,
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
        self.period += s.elapsed;
        // QEMU's period ends at a dirty-bitmap sync: here, a harvest.
        let end = s.round_end?;
        self.dirty += end.dirty_bytes;
        self.sent += end.sent_bytes;
        if self.period < PERIOD {
            return None;
        }
        let (dirty, sent) = (self.dirty, self.sent);
        (self.period, self.dirty, self.sent) = (Duration::ZERO, 0, 0);
        if sent == 0 || dirty * 100 <= sent * THRESHOLD_PCT {
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
    fn the_full_pass_is_a_period_and_engage_starts_at_20() {
        let mut a = AutoConverge::default();
        assert_eq!(a.decide(&sample(0, 1000, 1000)), None, "the first trigger");
        assert_eq!(a.decide(&sample(1, 600, 1000)), Some(Action::Time(20)));
        let mut b = AutoConverge::default();
        assert_eq!(b.engage(&sample(1, 0, 0)), Some(Action::Time(INITIAL_PCT)));
        assert_eq!(b.engage(&sample(2, 0, 0)), None, "already on");
    }

    /// Harvests less than a second apart add up into one period, as QEMU's
    /// bitmap syncs do: four high quarter-second rounds are one trigger.
    #[test]
    fn syncs_within_a_second_are_one_period() {
        let mut a = AutoConverge::default();
        let quarter = |dirty, sent| Sample {
            elapsed: Duration::from_millis(250),
            ..sample(1, dirty, sent)
        };
        for _ in 0..3 {
            assert_eq!(a.decide(&quarter(60, 100)), None, "the period runs on");
        }
        assert_eq!(a.decide(&quarter(60, 100)), None, "the first trigger");
        for _ in 0..3 {
            assert_eq!(a.decide(&quarter(60, 100)), None);
        }
        assert_eq!(a.decide(&quarter(60, 100)), Some(Action::Time(20)));
        // A period's sums decide, not its last round: 3 × 90 + 0 of 400.
        for _ in 0..3 {
            a.decide(&quarter(90, 100));
        }
        assert_eq!(a.decide(&quarter(0, 100)), None, "270 of 400 is high");
        for _ in 0..3 {
            a.decide(&quarter(40, 100));
        }
        let second = a.decide(&quarter(100, 100));
        assert_eq!(second, Some(Action::Time(30)), "220 of 400: the second");
    }
}
