//! Prediction before a migration starts: does precopy converge unaided, and
//! how long, how much downtime and how much guest slowdown under each policy.
//!
//! ```text
//!   input   per vCPU: the rate it dirties clean pages at with tracking on
//!           (bytes/s) and the bytes it can dirty at most (its working set);
//!           memory and the pages holding data; link; downtime target; round cap
//!   model   `super::model`, run RUNS times with round times drawn from
//!           each run's seed; a policy converges if most runs do, and its
//!           figures are those runs' mean
//! ```
//!
//! The stall escalation is not modelled: it only acts when the prediction
//! would already say "does not converge".

use super::model::{MigrationModel, RUNS};
use super::ConvergeMode;
use crate::summary::{PolicyForecast, PredictInput, Prediction};

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
        .map_or(ConvergeMode::None, |f| f.policy);
    Prediction {
        policies,
        recommended,
        link_known: input.link_known,
        input: input.clone(),
    }
}

/// One policy's forecast: the mean of [`RUNS`] runs of the model (see
/// [`super::model`]'s jitter); it converges if most runs do, and its
/// figures are those runs' mean.
fn forecast(input: &PredictInput, mode: ConvergeMode) -> PolicyForecast {
    let runs: Vec<PolicyForecast> = (1..=RUNS)
        .map(|seed| forecast_once(input, mode, seed))
        .collect();
    let converging = runs.iter().filter(|r| r.converges).count() as u64;
    let converges = converging * 2 > RUNS;
    let agree: Vec<&PolicyForecast> = runs.iter().filter(|r| r.converges == converges).collect();
    let n = agree.len().max(1) as f64;
    let mean = |f: fn(&PolicyForecast) -> f64| agree.iter().map(|r| f(r)).sum::<f64>() / n;
    PolicyForecast {
        policy: mode,
        converges,
        rounds: mean(|r| f64::from(r.rounds)).round() as u32,
        total_ms: mean(|r| r.total_ms),
        downtime_ms: mean(|r| r.downtime_ms),
        runtime_pct: mean(|r| r.runtime_pct),
        throttled_ms: mean(|r| r.throttled_ms),
    }
}

/// One run of the model at the input's link, round times drawn from `seed`.
fn forecast_once(input: &PredictInput, mode: ConvergeMode, seed: u64) -> PolicyForecast {
    MigrationModel::new(input, mode, seed)
        .advance(f64::INFINITY, input.link_bytes_per_sec)
        .cloned()
        .expect("a modelled migration ends by the model's horizon")
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
            burst_bytes_per_sec: Vec::new(),
            link_bytes_per_sec: link_mib_s * MIB as f64,
            link_known: true,
            downtime_target_ms: 300.0,
            max_rounds: 30,
            harvest_within_rounds: false,
        }
    }

    fn of(p: &Prediction, mode: ConvergeMode) -> &PolicyForecast {
        p.policies
            .iter()
            .find(|f| f.policy == mode)
            .unwrap_or_else(|| panic!("no forecast for {mode}: {p:?}"))
    }

    const ALL: [ConvergeMode; 3] = [ConvergeMode::None, ConvergeMode::Auto, ConvergeMode::Quota];

    #[test]
    fn a_slow_writer_converges_unaided_and_needs_no_policy() {
        let p = predict(&input(&[10.0], 512.0), &ALL);
        let none = of(&p, ConvergeMode::None);
        assert!(none.converges, "{p:?}");
        assert_eq!(none.runtime_pct, 100.0);
        // The first pass alone: 256 MiB at 512 MiB/s.
        assert!(none.total_ms >= 500.0, "{none:?}");
        assert!(
            p.recommended == ConvergeMode::None || of(&p, p.recommended).runtime_pct == 100.0,
            "{p:?}"
        );
    }

    #[test]
    fn a_writer_faster_than_the_link_needs_a_policy_and_the_quota_spares_a_reader() {
        // One writer at 1 GiB/s, one reader, over 128 MiB/s.
        let mut i = input(&[1024.0, 0.0], 128.0);
        i.working_set_bytes[1] = 0;
        let p = predict(&i, &ALL);
        assert!(!of(&p, ConvergeMode::None).converges, "{p:?}");
        let (auto, quota) = (of(&p, ConvergeMode::Auto), of(&p, ConvergeMode::Quota));
        assert!(quota.converges, "{p:?}");
        // auto slows the reader as much as the writer, for longer; the
        // quota engages in the first interval and ends sooner.
        assert!(quota.throttled_ms < auto.throttled_ms, "{p:?}");
        assert!(quota.total_ms < auto.total_ms, "{p:?}");
        assert_eq!(p.recommended, ConvergeMode::Quota, "{p:?}");
    }

    #[test]
    fn zero_pages_cost_the_full_pass_nothing() {
        // A writer at 5 MiB/s that has touched a tenth of its 256 MiB, over
        // 128 MiB/s: the first pass moves 25.6 MiB, not 256.
        let mut i = input(&[5.0], 128.0);
        let full = of(&predict(&i, &ALL), ConvergeMode::None).total_ms;
        i.data_bytes = i.memory_bytes / 10;
        let tenth = of(&predict(&i, &ALL), ConvergeMode::None).clone();
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
        let plain = of(&predict(&i, &ALL), ConvergeMode::None).clone();
        i.harvest_within_rounds = true;
        let within = of(&predict(&i, &ALL), ConvergeMode::None).clone();
        assert!(within.total_ms < plain.total_ms, "{within:?} {plain:?}");
        // About half of the 128 MiB it dirtied lies behind the cursor.
        assert!(within.total_ms > 2000.0, "{within:?}");
    }

    /// Two writers of 64 MiB and two readers over a 128 MiB/s link, the
    /// writers dirtying clean pages at `rate` MiB/s each.
    fn mix(rate: f64) -> PredictInput {
        let mut i = input(&[rate, rate, 0.0, 0.0], 128.0);
        i.memory_bytes = 256 * MIB;
        i.data_bytes = 128 * MIB;
        i.working_set_bytes = vec![64 * MIB, 64 * MIB, 0, 0];
        i
    }

    const PER_VCPU: [ConvergeMode; 3] = [
        ConvergeMode::Auto,
        ConvergeMode::DirtyLimit,
        ConvergeMode::Quota,
    ];

    #[test]
    fn a_writer_that_dirties_its_set_within_a_slice_beats_any_time_throttle() {
        // 30 GiB/s of clean pages (the soft MMU's writers): each 10 ms slice
        // a throttle leaves dirties all 64 MiB, and at 99% a slice comes
        // every second, as often as a round: only the quota, which charges
        // every page, holds them.
        let p = predict(&mix(30.0 * 1024.0), &PER_VCPU);
        assert!(!of(&p, ConvergeMode::Auto).converges, "{p:?}");
        assert!(!of(&p, ConvergeMode::DirtyLimit).converges, "{p:?}");
        let quota = of(&p, ConvergeMode::Quota);
        assert!(quota.converges, "{p:?}");
        // The pass (1 s), then one resend of what the writers dirtied
        // before the quota engaged (1 s), then little.
        assert!((1800.0..2600.0).contains(&quota.total_ms), "{quota:?}");
    }

    #[test]
    fn a_writer_held_by_its_faults_yields_to_a_time_throttle_at_last() {
        // 800 MiB/s each (kvm's write-protect faults): a slice dirties 8 MiB,
        // so auto-converge's throttle converges once high enough, after
        // many periods; dirty-limit's loop settles each writer near its
        // limit within a round or two.
        let p = predict(&mix(800.0), &PER_VCPU);
        let (auto, limit) = (of(&p, ConvergeMode::Auto), of(&p, ConvergeMode::DirtyLimit));
        assert!(auto.converges && limit.converges, "{p:?}");
        assert!(auto.total_ms > 10_000.0, "{auto:?}");
        assert!(limit.total_ms < auto.total_ms / 2.0, "{p:?}");
        assert!(
            of(&p, ConvergeMode::Quota).total_ms <= limit.total_ms,
            "{p:?}"
        );
    }

    #[test]
    fn nothing_converging_recommends_the_least_downtime() {
        let p = predict(&input(&[4096.0], 8.0), &[ConvergeMode::None]);
        assert!(!p.policies[0].converges);
        assert_eq!(p.recommended, ConvergeMode::None);
    }
}
