//! Prediction before a migration starts: does precopy converge unaided, and
//! how long, how much downtime and how much guest slowdown under each policy.
//!
//! ```text
//!   input   per vCPU: the rate it dirties clean pages at with tracking on
//!           (bytes/s) and the bytes it can dirty at most (its working set);
//!           memory and the pages holding data; link; downtime target; round cap
//!   model   every round, the full pass included, is run in steps of the
//!           policy interval: round 0 sends the data pages (a zero page
//!           travels as a bit), round k what the harvest ending round k−1
//!           found. In each step each vCPU dirties clean pages at its rate
//!           under the action in force, at most its working set between two
//!           harvests (with harvests within rounds, only what lies behind
//!           the send cursor is sent again). The *real* policy
//!           (`Policy::decide`) sees the samples the engine would give it:
//!           each interval's per-vCPU dirtying, and each round's end
//!   action  a time throttle p% leaves a vCPU (1 − p) of the time, in 10 ms
//!           slices: it dirties at its rate × (1 − p), but at most its
//!           working set per slice; a quota q per interval caps a vCPU at
//!           q / interval while it has clean pages; dirty-limit runs the
//!           backends' own feedback loop (`ferry_vm::dirty_limit::adjust`)
//!           per vCPU, period by period, and throttles by time
//!   stop    what is left fits the downtime target (converged), or the round
//!           cap forces the stop-and-copy (not converged)
//! ```
//!
//! The stall escalation is not modelled: it only acts when the prediction
//! would already say "does not converge".

use super::{policy, Action, ConvergeMode, RoundEnd, Sample};
pub use crate::summary::{PolicyForecast, PredictInput, Prediction};
use std::time::Duration;

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
        input: input.clone(),
    }
}

/// The most steps a round is modelled in (longer rounds take longer steps
/// than the policy interval).
const MAX_ROUND_STEPS: f64 = 400.0;
/// A migration modelled past this is taken not to converge.
const HORIZON_SECS: f64 = 3600.0;

/// One vCPU as the model runs it.
#[derive(Clone, Debug, Default)]
struct VcpuModel {
    /// Bytes/s it dirties clean pages at, unthrottled.
    rate: f64,
    /// The most bytes it can have dirtied at once.
    ws: f64,
    /// Bytes dirtied since its pages were last protected.
    dirty: f64,
    /// With harvests within rounds: bytes the next round sends again.
    again: f64,
    /// Bytes newly dirtied since the policy's last sample (its meter).
    metered: f64,
    /// dirty-limit: the throttle its feedback loop holds it at, percent,
    /// and the loop's period so far (seconds, bytes).
    limit_pct: u8,
    period: (f64, f64),
}

impl VcpuModel {
    /// Its dirty rate under a time throttle of `pct`, and the share of
    /// the time it runs. A throttled vCPU runs slices of
    /// [`ferry_vm::THROTTLE_SLICE`] and sleeps between them, so one that
    /// dirties its whole working set within a slice (a writer on a host
    /// whose faults are cheap) dirties all of it once per slice it gets,
    /// whatever the throttle: its rate is capped at the working set per
    /// slice, not at its own.
    fn time_throttled(&self, pct: u8) -> (f64, f64) {
        if pct == 0 {
            return (self.rate, 1.0);
        }
        let run = 1.0 - f64::from(pct.min(ferry_vm::MAX_THROTTLE_PERCENT)) / 100.0;
        let slice = ferry_vm::THROTTLE_SLICE.as_secs_f64();
        (self.rate.min(self.ws / slice) * run, run)
    }

    /// Its dirty rate under `action`, and the share of the time it runs.
    fn under(&self, action: &Option<Action>, v: usize) -> (f64, f64) {
        match action {
            Some(Action::Time(p)) => self.time_throttled(*p),
            Some(Action::Quota(Some(q))) => {
                let cap = q.bytes_per_sec(v);
                let all_dirty = self.dirty >= self.ws;
                match self.rate > cap && !all_dirty {
                    true => (cap, cap / self.rate),
                    false => (self.rate, 1.0),
                }
            }
            Some(Action::Limit(Some(_))) => self.time_throttled(self.limit_pct),
            _ => (self.rate, 1.0),
        }
    }

    /// The rate dirty-limit's loop reads off a period in which this vCPU
    /// dirtied at `average`. Once its throttle's cycle (a slice and a
    /// sleep) outlasts the period, a period holds one slice or none, and
    /// the loop reads the slice's dirtying over the period (a period with
    /// none says nothing): so it keeps raising the throttle while a slice
    /// dirties more than the limit allows a period, far past the share
    /// that would hold the average there.
    fn seen_by_limit(&self, average: f64) -> f64 {
        let period = ferry_vm::dirty_limit::PERIOD.as_secs_f64();
        let slice = ferry_vm::THROTTLE_SLICE.as_secs_f64();
        let run = 1.0 - f64::from(self.limit_pct.min(ferry_vm::MAX_THROTTLE_PERCENT)) / 100.0;
        if self.limit_pct == 0 || slice / run <= period {
            return average;
        }
        (self.rate * slice).min(self.ws) / period
    }

    /// Runs it `dt` seconds under `action`; `again_share` is the share of
    /// what it dirties that is sent again (`None`: no harvest within the
    /// round, the round's end finds all it dirtied). Returns the share of
    /// `dt` it ran.
    fn advance(
        &mut self,
        v: usize,
        dt: f64,
        action: &Option<Action>,
        again_share: Option<f64>,
    ) -> f64 {
        let (eff, share) = self.under(action, v);
        let new = (eff * dt).min((self.ws - self.dirty).max(0.0));
        self.dirty += new;
        self.metered += new;
        if let Some(f) = again_share {
            // The interval's harvest protects its pages again.
            self.again = (self.again + new * f).min(self.ws);
            self.dirty = 0.0;
        }
        if let Some(Action::Limit(Some(limit))) = action {
            // The backend's loop: each period's rate moves the throttle.
            self.period.0 += dt;
            self.period.1 += new;
            let period = ferry_vm::dirty_limit::PERIOD.as_secs_f64();
            if self.period.0 >= period * 0.999 {
                if self.period.1 > 0.0 {
                    let rate = self.seen_by_limit(self.period.1 / self.period.0);
                    self.limit_pct =
                        ferry_vm::dirty_limit::adjust(self.limit_pct, rate, *limit as f64);
                }
                self.period = (0.0, 0.0);
            }
        } else {
            self.limit_pct = 0;
            self.period = (0.0, 0.0);
        }
        share
    }

    /// What the round's end harvest finds of it, and protects again.
    fn harvest(&mut self, within: bool) -> f64 {
        let found = if within { self.again } else { self.dirty };
        self.dirty = 0.0;
        self.again = 0.0;
        found
    }
}

/// One policy's migration as the model runs it: every round in steps of
/// the policy interval, the policy told what the engine would tell it.
struct Run {
    vcpus: Vec<VcpuModel>,
    policy: Option<Box<dyn super::Policy>>,
    action: Option<Action>,
    template: Sample,
    /// Seconds modelled, and vCPU-seconds run (not throttled).
    total: f64,
    ran: f64,
    /// Seconds since the policy's last sample.
    since_sample: f64,
}

impl Run {
    fn step(&mut self, dt: f64, again_share: Option<f64>) {
        let mut ran = 0.0;
        for (v, m) in self.vcpus.iter_mut().enumerate() {
            ran += m.advance(v, dt, &self.action, again_share);
        }
        self.total += dt;
        self.since_sample += dt;
        self.ran += dt * ran / self.vcpus.len().max(1) as f64;
    }

    /// Tells the policy what the meter read since its last sample.
    fn sample(&mut self, round: u32, remaining: f64, round_end: Option<RoundEnd>) {
        let s = Sample {
            round,
            elapsed: Duration::from_secs_f64(self.since_sample),
            vcpu_dirty_bytes: self
                .vcpus
                .iter_mut()
                .map(|m| std::mem::take(&mut m.metered) as u64)
                .collect(),
            remaining_bytes: remaining as u64,
            round_end,
            ..self.template.clone()
        };
        self.since_sample = 0.0;
        if let Some(a) = self.policy.as_mut().and_then(|p| p.decide(&s)) {
            self.action = Some(a);
        }
    }

    /// Sends one round of `bytes` (round 0: the full pass, whose `bytes`
    /// are the data pages of `memory` bytes) at `link` bytes/s, and
    /// harvests at its end: what the next round sends.
    fn round(&mut self, round: u32, bytes: f64, memory: f64, link: f64, within: bool) -> f64 {
        let interval = self.template.quota_interval.as_secs_f64();
        let secs = bytes / link;
        let steps = (secs / interval).ceil().clamp(1.0, MAX_ROUND_STEPS);
        let dt = secs / steps;
        let listed = if round == 0 { memory } else { bytes };
        for step in 1..=steps as u64 {
            let sent_share = step as f64 / steps;
            // With harvests within rounds, in the pass only what the guest
            // dirties behind the cursor goes again; in a dirty round, all.
            let again = within.then_some(if round == 0 { sent_share } else { 1.0 });
            self.step(dt, again);
            if (step as f64) < steps {
                self.sample(round, listed * (1.0 - sent_share), None);
            }
        }
        let found: f64 = self.vcpus.iter_mut().map(|m| m.harvest(within)).sum();
        self.sample(
            round,
            found,
            Some(RoundEnd {
                dirty_bytes: found as u64,
                sent_bytes: listed as u64,
            }),
        );
        found
    }
}

/// The round loop of one policy.
fn forecast(input: &PredictInput, mode: ConvergeMode) -> PolicyForecast {
    let link = input.link_bytes_per_sec.max(1.0);
    let target = input.downtime_target_ms / 1e3;
    let vcpus = input.dirty_bytes_per_sec.len();
    let interval = ferry_vm::QUOTA_INTERVAL;
    let mut run = Run {
        vcpus: (0..vcpus)
            .map(|v| VcpuModel {
                rate: input.dirty_bytes_per_sec[v].max(0.0),
                ws: input.working_set_bytes.get(v).copied().unwrap_or(0) as f64,
                ..VcpuModel::default()
            })
            .collect(),
        policy: policy(mode),
        action: None,
        template: Sample {
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
        },
        total: 0.0,
        ran: 0.0,
        since_sample: 0.0,
    };
    let memory = input.memory_bytes as f64;
    let within = input.harvest_within_rounds;
    let mut bytes = input.data_bytes.min(input.memory_bytes) as f64;
    let mut round = 0u32;
    loop {
        let found = run.round(round, bytes, memory, link, within);
        round += 1;
        let converges = found <= link * target;
        if converges || round >= input.max_rounds || run.total > HORIZON_SECS {
            let downtime = found / link;
            return PolicyForecast {
                policy: mode.to_string(),
                converges,
                rounds: round + 1,
                total_ms: (run.total + downtime) * 1e3,
                downtime_ms: downtime * 1e3,
                runtime_pct: 100.0 * run.ran / run.total.max(1e-9),
                throttled_ms: (run.total - run.ran) * 1e3,
            };
        }
        bytes = found;
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
        assert!(!of(&p, "auto").converges, "{p:?}");
        assert!(!of(&p, "dirty-limit").converges, "{p:?}");
        let quota = of(&p, "quota");
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
        let (auto, limit) = (of(&p, "auto"), of(&p, "dirty-limit"));
        assert!(auto.converges && limit.converges, "{p:?}");
        assert!(auto.total_ms > 10_000.0, "{auto:?}");
        assert!(limit.total_ms < auto.total_ms / 2.0, "{p:?}");
        assert!(of(&p, "quota").total_ms <= limit.total_ms, "{p:?}");
    }

    #[test]
    fn dirty_limit_holds_a_steady_writer_near_its_limit() {
        // One writer at 64 MiB/s over all of its 256 MiB, the limit engaged
        // at half of a 64 MiB/s link (32 MiB/s): the loop's throttle ends
        // near a half, and the writer near its limit.
        let mut m = VcpuModel {
            rate: 64.0 * MIB as f64,
            ws: 256.0 * MIB as f64,
            ..VcpuModel::default()
        };
        let limit = Some(Action::Limit(Some(32 * MIB)));
        for _ in 0..30 {
            m.advance(0, 0.1, &limit, Some(1.0));
        }
        assert!((40..=60).contains(&m.limit_pct), "{m:?}");
        let (eff, _) = m.under(&limit, 0);
        assert!((eff / (32.0 * MIB as f64) - 1.0).abs() < 0.25, "{eff}");
    }

    #[test]
    fn nothing_converging_recommends_the_least_downtime() {
        let p = predict(&input(&[4096.0], 8.0), &[ConvergeMode::None]);
        assert!(!p.policies[0].converges);
        assert_eq!(p.recommended, "none");
    }
}
