//! When precopy switches over: a prediction of the final round's downtime
//! from what this migration measured, and an aim well under the target.
//!
//! **The prediction.** The final round sends, with the guest paused, what
//! the data connections still hold queued (the previous round's tail, not
//! yet acknowledged), then the dirty set; it harvests the dirty logs once
//! more, and pauses, saves, loads and resumes the guest. So the downtime is
//! predicted as `(queued + dirty + device) / link + device / device rate +
//! harvest + SWITCH_OVERHEAD`, with the link's rate from the last round
//! measured, the harvest's time from the last harvest, and the device state
//! as its sections declare it (`SectionSpec::max_bytes`: a VMM with large
//! device state declares it, and small undeclared state is in the
//! overhead) plus what live sections still have pending. The device rate
//! is saving and loading it, as this kind of VM showed at its previous
//! large switchover, or a calibrated default (`ferry_engine::device_cost`).
//!
//! **The aim.** Switching at the target itself leaves no room for a link
//! that slows in the last round, and a run whose prediction is a little
//! low then overshoots. Once a throttle holds the guest, or it dirties
//! slowly anyway, another round costs little and shrinks the set. So
//! precopy switches at once only when the prediction is under
//! [`AIM_SHARE`] of the target. Under the target but over the aim, it runs
//! further rounds while each shrinks the prediction by a quarter, at most
//! [`AIM_ROUNDS`] of them, and then switches. Over the target it never
//! switches: it iterates, and the convergence and stall rules escalate.

use std::time::Duration;

/// Fixed costs of a switchover besides the transfer: pausing the vCPUs,
/// saving and loading their state and the devices', resuming, and the
/// message that says so. `ferry bench local` measures all of them with no
/// page to send (docs/results.md, "Same-host upgrade"); taken as 5 ms, above
/// what it measured on this project's kvm host.
pub const SWITCH_OVERHEAD: Duration = Duration::from_millis(5);
/// The share of the downtime target precopy aims at.
pub const AIM_SHARE: f64 = 0.25;
/// Most rounds run under the target to reach the aim.
pub const AIM_ROUNDS: u32 = 3;
/// A round that chases the aim must bring the prediction below this share
/// of the one before, or precopy switches.
const SHRINK: f64 = 0.75;

/// What the final round would carry if the guest paused now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FinalRound {
    /// Guest bytes queued on the data connections ahead of it.
    pub queued_bytes: u64,
    /// Guest bytes of the dirty set.
    pub dirty_bytes: u64,
    /// Bytes of device state the sections declare, sent at the pause.
    pub device_bytes: u64,
    /// The rate at which device state is saved and loaded, besides the
    /// link (`ferry_engine::device_cost::rate`).
    pub device_bytes_per_sec: f64,
    /// Guest bytes per second the link moves.
    pub link_bytes_per_sec: f64,
    /// What the last harvest of the dirty logs took.
    pub harvest: Duration,
}

impl FinalRound {
    /// The downtime it would cost.
    pub fn downtime(&self) -> Duration {
        let bytes = (self.queued_bytes + self.dirty_bytes + self.device_bytes) as f64;
        let send = bytes / self.link_bytes_per_sec.max(1.0);
        Duration::from_secs_f64(send.min(1e6))
            + crate::session::device_cost::cost(self.device_bytes, self.device_bytes_per_sec)
            + self.harvest
            + SWITCH_OVERHEAD
    }
}

/// The switchover rule's state across rounds.
#[derive(Debug, Default)]
pub struct SwitchRule {
    /// Rounds run under the target, over the aim.
    chased: u32,
    /// The prediction at the last decision.
    last: Option<Duration>,
}

impl SwitchRule {
    /// Whether to switch over now, with `predicted` downtime against
    /// `target`.
    pub fn decide(&mut self, predicted: Duration, target: Duration) -> bool {
        let last = self.last.replace(predicted);
        if predicted > target {
            self.chased = 0;
            return false;
        }
        if predicted <= target.mul_f64(AIM_SHARE) {
            return true;
        }
        let shrinking = last.is_none_or(|l| predicted < l.mul_f64(SHRINK));
        self.chased += 1;
        !shrinking || self.chased > AIM_ROUNDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_prediction_counts_the_queue_the_set_the_device_state_the_harvest_and_the_overhead() {
        let f = FinalRound {
            queued_bytes: 1_000_000,
            dirty_bytes: 3_000_000,
            device_bytes: 0,
            device_bytes_per_sec: 50e6,
            link_bytes_per_sec: 100e6,
            harvest: 2 * MS,
        };
        assert_eq!(f.downtime(), 40 * MS + 2 * MS + SWITCH_OVERHEAD);
        let with_device = FinalRound {
            device_bytes: 10_000_000,
            ..f
        };
        // 10 MB more on the link (100 ms) and saved and loaded (200 ms).
        assert_eq!(with_device.downtime(), 340 * MS + 2 * MS + SWITCH_OVERHEAD);
        let dead = FinalRound {
            link_bytes_per_sec: 0.0,
            ..f
        };
        assert!(dead.downtime() > Duration::from_secs(1000));
    }

    #[test]
    fn under_the_aim_switches_at_once_and_over_the_target_never() {
        let mut r = SwitchRule::default();
        assert!(!r.decide(301 * MS, 300 * MS));
        assert!(!r.decide(900 * MS, 300 * MS));
        assert!(r.decide(75 * MS, 300 * MS));
        assert!(!SwitchRule::default().decide(Duration::from_nanos(1), Duration::ZERO));
    }

    #[test]
    fn between_aim_and_target_it_chases_while_rounds_shrink() {
        let mut r = SwitchRule::default();
        assert!(!r.decide(400 * MS, 300 * MS));
        assert!(!r.decide(250 * MS, 300 * MS), "first round under");
        assert!(
            !r.decide(180 * MS, 300 * MS),
            "shrank by more than a quarter"
        );
        assert!(r.decide(150 * MS, 300 * MS), "shrank less: switch");
    }

    #[test]
    fn chasing_stops_after_its_rounds() {
        let mut r = SwitchRule::default();
        let mut p = 290.0;
        let mut rounds = 0;
        while !r.decide(Duration::from_secs_f64(p / 1e3), 300 * MS) {
            p *= 0.7;
            rounds += 1;
            assert!(rounds <= AIM_ROUNDS, "{rounds}");
        }
        assert_eq!(rounds, AIM_ROUNDS);
        // A prediction back over the target starts the count again.
        assert!(!r.decide(400 * MS, 300 * MS));
        assert!(!r.decide(200 * MS, 300 * MS));
    }
}
