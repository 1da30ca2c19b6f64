//! Prediction before a migration starts: does precopy converge unaided, and
//! how long, how much downtime and how much guest slowdown under each policy.
//!
//! ```text
//!   input   per vCPU: dirty rate with tracking on (bytes/s) and the bytes it
//!           can dirty at most (its working set); memory; link; downtime
//!           target; round cap
//!   model   round 0 sends all memory, but its time on the link is that of
//!           the pages holding data (a zero page travels as one bit); it is
//!           modelled interval by interval (with harvests within rounds,
//!           only what the guest dirties behind the send cursor is sent
//!           again); round k sends what was
//!           dirtied while round k−1 was sent (per vCPU: min(working set,
//!           rate × time)); the *real* policy (`Policy::decide`) sees the
//!           samples the engine would give it: each interval's (what each
//!           vCPU dirtied) and each round's end; its action scales each
//!           vCPU's rate: a time throttle p% by (1 − p), a quota q per
//!           100 ms caps it at 10·q per second
//!   stop    what is left fits the downtime target (converged), or the round
//!           cap forces the stop-and-copy (not converged)
//! ```
//!
//! The stall escalation is not modelled: it only acts when the prediction
//! would already say "does not converge".

use super::{policy, Action, ConvergeMode, RoundEnd, Sample};
pub use crate::summary::{PolicyForecast, Prediction};
use serde::Serialize;
use std::time::Duration;

/// What the guest and the link look like before the migration.
#[derive(Clone, Debug, Serialize)]
pub struct PredictInput {
    /// Guest memory in bytes (all of it goes in the first pass).
    pub memory_bytes: u64,
    /// Of those, the bytes of pages that hold data: what the first pass puts
    /// on the link (zero pages travel as a bit, no data). A guest that has
    /// written a tenth of its memory sends its first pass ten times faster
    /// than its size says.
    pub data_bytes: u64,
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
    /// Whether the engine harvests within rounds (a page dirtied ahead of
    /// the send cursor is then not sent again).
    pub harvest_within_rounds: bool,
}

/// Predicts each of `modes` on `input`.
pub fn predict(input: &PredictInput, modes: &[ConvergeMode]) -> Prediction {
    let policies: Vec<PolicyForecast> = modes.iter().map(|&m| forecast(input, m)).collect();
    let best_converging = policies.iter().filter(|f| f.converges).min_by(|a, b| {
        a.throttled_ms
            .total_cmp(&b.throttled_ms)
            .then(a.total_ms.total_cmp(&b.total_ms))
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

/// The most steps the full pass is modelled in (longer passes take longer
/// steps than the policy interval).
const MAX_PASS_STEPS: f64 = 400.0;

/// The round loop of one policy.
fn forecast(input: &PredictInput, mode: ConvergeMode) -> PolicyForecast {
    let link = input.link_bytes_per_sec.max(1.0);
    let target = input.downtime_target_ms / 1e3;
    let vcpus = input.dirty_bytes_per_sec.len();
    let mut policy = policy(mode);
    let interval = ferry_vm::QUOTA_INTERVAL;
    let template = Sample {
        round: 0,
        elapsed: interval,
        vcpu_dirty_bytes: Vec::new(),
        remaining_bytes: input.memory_bytes,
        guest_bytes: input.memory_bytes,
        link_bytes_per_sec: link,
        downtime_target: Duration::from_secs_f64(target),
        quota_interval: interval,
        vcpus: vcpus as u32,
        round_end: None,
        harvests_within_rounds: input.harvest_within_rounds,
    };
    let mut decide = |action: &mut Option<Action>, s: &Sample| {
        if let Some(a) = policy.as_mut().and_then(|p| p.decide(s)) {
            *action = Some(a);
        }
    };
    let mut action: Option<Action> = None;
    let (mut total, mut running_share) = (0.0, 0.0);

    // The full pass, interval by interval, as the engine samples it.
    // Without harvests within the round, the dirty log is not reset in the
    // pass: a vCPU's meter counts only pages it had not dirtied yet in it (a
    // vCPU whose working set is all dirty runs free, unmetered), and all it
    // dirtied is sent again. With them, each interval's harvest re-protects
    // what it finds: the meter counts each interval's dirtying, and only
    // what lies behind the send cursor then (for writes spread over memory:
    // the share sent) is sent again (`precopy::ahead`).
    let pass = input.data_bytes.min(input.memory_bytes) as f64 / link;
    let steps = (pass / interval.as_secs_f64())
        .ceil()
        .clamp(1.0, MAX_PASS_STEPS);
    let dt = pass / steps;
    // Per vCPU: bytes dirtied in the pass, and of those, to be sent again.
    let mut touched = vec![0.0f64; vcpus];
    let mut again = vec![0.0f64; vcpus];
    for step in 1..=steps as u64 {
        // The cursor at the harvest that ends this step (the last step's
        // writes meet the round's end harvest, all behind the cursor).
        let sent_share = step as f64 / steps;
        let mut ran = 0.0;
        let metered: Vec<u64> = (0..vcpus)
            .map(|v| {
                let ws = input.working_set_bytes[v] as f64;
                let (eff, mut share) = under(&action, v, input.dirty_bytes_per_sec[v]);
                let new = if input.harvest_within_rounds {
                    let new = (eff * dt).min(ws);
                    again[v] = (again[v] + new * sent_share).min(ws);
                    new
                } else {
                    // Metered policies stop at an unmetered vCPU; time does not.
                    if touched[v] >= ws && !matches!(action, Some(Action::Time(_))) {
                        share = 1.0;
                    }
                    let new = (eff * dt).min(ws - touched[v]);
                    touched[v] += new;
                    again[v] = touched[v];
                    new
                };
                ran += share;
                new as u64
            })
            .collect();
        total += dt;
        running_share += dt * ran / vcpus.max(1) as f64;
        if step as f64 >= steps {
            // The round's end sample replaces the last interval's.
            break;
        }
        let unsent = 1.0 - step as f64 / steps;
        decide(
            &mut action,
            &Sample {
                elapsed: Duration::from_secs_f64(dt),
                vcpu_dirty_bytes: metered,
                remaining_bytes: (input.memory_bytes as f64 * unsent) as u64,
                ..template.clone()
            },
        );
    }
    let mut sent = input.memory_bytes as f64;
    let mut dirty: f64 = again.iter().sum();
    let mut round = 0u32;
    loop {
        decide(
            &mut action,
            &Sample {
                round,
                // In the pass, the harvest follows the last interval's sample.
                elapsed: Duration::from_secs_f64(if round == 0 { dt } else { sent / link }),
                remaining_bytes: dirty as u64,
                round_end: Some(RoundEnd {
                    dirty_bytes: dirty as u64,
                    sent_bytes: sent as u64,
                }),
                ..template.clone()
            },
        );
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
                throttled_ms: (total - running_share) * 1e3,
            };
        }
        // A dirty round sends what the last one dirtied (all of it data: the
        // guest's stamp at least) under the action in force.
        sent = dirty;
        let secs = sent / link;
        let mut ran = 0.0;
        dirty = 0.0;
        for v in 0..vcpus {
            let (eff, share) = under(&action, v, input.dirty_bytes_per_sec[v]);
            dirty += (eff * secs).min(input.working_set_bytes[v] as f64);
            ran += share;
        }
        total += secs;
        running_share += secs * ran / vcpus.max(1) as f64;
    }
}

/// vCPU `v`'s dirty rate under `action` when it would dirty `rate` bytes/s
/// unthrottled, and the share of the time it runs.
fn under(action: &Option<Action>, v: usize, rate: f64) -> (f64, f64) {
    let capped = |cap: f64| {
        let eff = rate.min(cap);
        (eff, if rate > 0.0 { eff / rate } else { 1.0 })
    };
    match action {
        Some(Action::Time(p)) => {
            let run = 1.0 - f64::from(*p) / 100.0;
            (rate * run, run)
        }
        Some(Action::Quota(Some(q))) => capped(q.bytes_per_sec(v)),
        // The feedback loop settles the rate on the limit.
        Some(Action::Limit(Some(l))) => capped(*l as f64),
        _ => (rate, 1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn input(rates_mib_s: &[f64], link_mib_s: f64) -> PredictInput {
        PredictInput {
            memory_bytes: 256 * MIB * rates_mib_s.len() as u64,
            data_bytes: 256 * MIB * rates_mib_s.len() as u64,
            dirty_bytes_per_sec: rates_mib_s.iter().map(|r| r * MIB as f64).collect(),
            working_set_bytes: vec![256 * MIB; rates_mib_s.len()],
            link_bytes_per_sec: link_mib_s * MIB as f64,
            link_known: true,
            downtime_target_ms: 300.0,
            max_rounds: 30,
            harvest_within_rounds: false,
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
        // auto slows the reader as much as the writer, for longer; the
        // quota engages in the first interval and ends sooner.
        assert!(quota.throttled_ms < auto.throttled_ms, "{p:?}");
        assert!(quota.total_ms < auto.total_ms, "{p:?}");
        assert_eq!(p.recommended, "quota", "{p:?}");
    }

    #[test]
    fn zero_pages_cost_the_full_pass_nothing() {
        // A writer at 5 MiB/s that has touched a tenth of its 256 MiB, over
        // 128 MiB/s: the first pass moves 25.6 MiB, not 256.
        let mut i = input(&[5.0], 128.0);
        let full = of(&predict(&i, &ALL), "none").total_ms;
        i.data_bytes = i.memory_bytes / 10;
        let tenth = of(&predict(&i, &ALL), "none").clone();
        assert!(tenth.converges, "{tenth:?}");
        // 256 MiB / 128 MiB/s = 2 s; a tenth of it, 0.2 s (and a short round).
        assert!(full > 2000.0, "{full}");
        assert!((200.0..300.0).contains(&tenth.total_ms), "{tenth:?}");
    }

    #[test]
    fn harvests_within_rounds_send_less_again() {
        // A writer at 64 MiB/s over 256 MiB and a 128 MiB/s link: without
        // harvests in the pass, all it dirtied in the 2 s pass goes again.
        let mut i = input(&[64.0], 128.0);
        let plain = of(&predict(&i, &ALL), "none").clone();
        i.harvest_within_rounds = true;
        let within = of(&predict(&i, &ALL), "none").clone();
        assert!(within.total_ms < plain.total_ms, "{within:?} {plain:?}");
        // About half of the 128 MiB it dirtied lies behind the cursor.
        assert!(within.total_ms > 2000.0, "{within:?}");
    }

    #[test]
    fn nothing_converging_recommends_the_least_downtime() {
        let p = predict(&input(&[4096.0], 8.0), &[ConvergeMode::None]);
        assert!(!p.policies[0].converges);
        assert_eq!(p.recommended, "none");
    }
}
