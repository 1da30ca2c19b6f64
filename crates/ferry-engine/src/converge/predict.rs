//! Prediction before a migration starts: does precopy converge unaided, and
//! how long, how much downtime and how much guest slowdown under each policy.
//!
//! ```text
//!   input   per vCPU: dirty rate with tracking on (bytes/s) and the bytes it
//!           can dirty at most (its working set); memory; link; downtime
//!           target; round cap
//!   model   round 0 sends all memory; round k sends what was dirtied while
//!           round k−1 was sent (per vCPU: min(working set, rate × time));
//!           after each round the *real* policy (`Policy::decide`) sees the
//!           same RoundSample the engine would give it, and its action scales
//!           each vCPU's rate: a time throttle p% by (1 − p), a quota q per
//!           100 ms caps it at 10·q per second
//!   stop    what is left fits the downtime target (converged), or the round
//!           cap forces the stop-and-copy (not converged)
//! ```
//!
//! The stall escalation is not modelled: it only acts when the prediction
//! would already say "does not converge".

use super::{policy, Action, ConvergeMode, RoundSample};
use serde::Serialize;
use std::time::Duration;

/// What the guest and the link look like before the migration.
#[derive(Clone, Debug, Serialize)]
pub struct PredictInput {
    /// Guest memory in bytes (all of it goes in the first pass).
    pub memory_bytes: u64,
    /// Per vCPU: bytes dirtied per second with dirty tracking on.
    pub dirty_bytes_per_sec: Vec<f64>,
    /// Per vCPU: the most bytes it can have dirtied at once.
    pub working_set_bytes: Vec<u64>,
    /// Guest bytes per second the link moves.
    pub link_bytes_per_sec: f64,
    /// Whether the link rate was given (a bandwidth cap) rather than assumed.
    pub link_known: bool,
    /// The downtime target.
    pub downtime_target_ms: f64,
    /// The round cap.
    pub max_rounds: u32,
}

/// The outcome predicted for one policy.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PolicyForecast {
    /// none, auto or quota.
    pub policy: String,
    /// What was left fitted the downtime target before the round cap.
    pub converges: bool,
    /// Rounds, the stop-and-copy included.
    pub rounds: u32,
    /// Total migration time, ms.
    pub total_ms: f64,
    /// Downtime, ms.
    pub downtime_ms: f64,
    /// Average share of the migration a vCPU runs (not throttled), percent.
    pub runtime_pct: f64,
}

/// The prediction: every policy asked for, and the one to pick.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Prediction {
    /// One forecast per policy.
    pub policies: Vec<PolicyForecast>,
    /// The policy to pick: among those that converge, the one that slows
    /// the guest least (then the quickest); if none converges, the one with
    /// the least downtime.
    pub recommended: String,
    /// Whether the link rate was known (else assumed; see the input).
    pub link_known: bool,
}

/// Predicts each of `modes` on `input`.
pub fn predict(input: &PredictInput, modes: &[ConvergeMode]) -> Prediction {
    let policies: Vec<PolicyForecast> = modes.iter().map(|&m| forecast(input, m)).collect();
    let best_converging = policies.iter().filter(|f| f.converges).max_by(|a, b| {
        a.runtime_pct
            .total_cmp(&b.runtime_pct)
            .then(b.total_ms.total_cmp(&a.total_ms))
    });
    let recommended = best_converging
        .or_else(|| {
            policies
                .iter()
                .min_by(|a, b| a.downtime_ms.total_cmp(&b.downtime_ms))
        })
        .map_or_else(String::new, |f| f.policy.clone());
    Prediction {
        policies,
        recommended,
        link_known: input.link_known,
    }
}

/// The round loop of one policy.
fn forecast(input: &PredictInput, mode: ConvergeMode) -> PolicyForecast {
    let link = input.link_bytes_per_sec.max(1.0);
    let target = input.downtime_target_ms / 1e3;
    let vcpus = input.dirty_bytes_per_sec.len();
    let mut policy = policy(mode);
    let mut action: Option<Action> = None;
    let mut sent = input.memory_bytes as f64;
    let (mut total, mut running_share, mut round) = (0.0, 0.0, 0u32);
    loop {
        let secs = sent / link;
        // Each vCPU's effective rate under the action in force.
        let mut dirty = 0.0;
        let mut ran = 0.0;
        for v in 0..vcpus {
            let rate = input.dirty_bytes_per_sec[v];
            let (eff, share) = match action {
                Some(Action::Time(p)) => {
                    let run = 1.0 - f64::from(p) / 100.0;
                    (rate * run, run)
                }
                Some(Action::Quota(Some(q))) => {
                    let eff = rate.min(q.bytes_per_sec());
                    (eff, if rate > 0.0 { eff / rate } else { 1.0 })
                }
                // The feedback loop settles the rate on the limit.
                Some(Action::Limit(Some(l))) => {
                    let eff = rate.min(l as f64);
                    (eff, if rate > 0.0 { eff / rate } else { 1.0 })
                }
                _ => (rate, 1.0),
            };
            dirty += (eff * secs).min(input.working_set_bytes[v] as f64);
            ran += share;
        }
        total += secs;
        running_share += secs * ran / vcpus.max(1) as f64;
        let sample = RoundSample {
            round,
            dirty_bytes: dirty as u64,
            sent_bytes: sent as u64,
            remaining_bytes: dirty as u64,
            link_bytes_per_sec: link,
            downtime_target: Duration::from_secs_f64(target),
            quota_interval: ferry_backend::QUOTA_INTERVAL,
            vcpus: vcpus as u32,
        };
        if let Some(a) = policy.as_mut().and_then(|p| p.decide(&sample)) {
            action = Some(a);
        }
        round += 1;
        let converges = dirty <= link * target;
        if converges || round >= input.max_rounds {
            let downtime = dirty / link;
            return PolicyForecast {
                policy: mode.to_string(),
                converges,
                rounds: round + 1,
                total_ms: (total + downtime) * 1e3,
                downtime_ms: downtime * 1e3,
                runtime_pct: 100.0 * running_share / total.max(1e-9),
            };
        }
        sent = dirty;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn input(rates_mib_s: &[f64], link_mib_s: f64) -> PredictInput {
        PredictInput {
            memory_bytes: 256 * MIB * rates_mib_s.len() as u64,
            dirty_bytes_per_sec: rates_mib_s.iter().map(|r| r * MIB as f64).collect(),
            working_set_bytes: vec![256 * MIB; rates_mib_s.len()],
            link_bytes_per_sec: link_mib_s * MIB as f64,
            link_known: true,
            downtime_target_ms: 300.0,
            max_rounds: 30,
        }
    }

    fn of<'a>(p: &'a Prediction, name: &str) -> &'a PolicyForecast {
        p.policies.iter().find(|f| f.policy == name).expect(name)
    }

    const ALL: [ConvergeMode; 3] = [ConvergeMode::None, ConvergeMode::Auto, ConvergeMode::Quota];

    #[test]
    fn a_slow_writer_converges_unaided_and_needs_no_policy() {
        let p = predict(&input(&[10.0], 512.0), &ALL);
        let none = of(&p, "none");
        assert!(none.converges, "{p:?}");
        assert_eq!(none.runtime_pct, 100.0);
        // The first pass alone: 256 MiB at 512 MiB/s.
        assert!(none.total_ms >= 500.0, "{none:?}");
        assert!(
            p.recommended == "none" || of(&p, &p.recommended).runtime_pct == 100.0,
            "{p:?}"
        );
    }

    #[test]
    fn a_writer_faster_than_the_link_needs_a_policy_and_the_quota_spares_a_reader() {
        // One writer at 1 GiB/s, one reader, over 128 MiB/s.
        let mut i = input(&[1024.0, 0.0], 128.0);
        i.working_set_bytes[1] = 0;
        let p = predict(&i, &ALL);
        assert!(!of(&p, "none").converges, "{p:?}");
        let (auto, quota) = (of(&p, "auto"), of(&p, "quota"));
        assert!(quota.converges, "{p:?}");
        // auto slows the reader as much as the writer; the quota does not.
        assert!(quota.runtime_pct > auto.runtime_pct, "{p:?}");
        assert_eq!(p.recommended, "quota", "{p:?}");
    }

    #[test]
    fn nothing_converging_recommends_the_least_downtime() {
        let p = predict(&input(&[4096.0], 8.0), &[ConvergeMode::None]);
        assert!(!p.policies[0].converges);
        assert_eq!(p.recommended, "none");
    }
}
