//! The model the prediction runs, one migration at a time: every round,
//! the full pass included, in steps of at most the policy interval, under
//! a link whose rate the caller gives at each step (a constant for the
//! prediction; the share a fleet simulator's flows leave it).
//!
//! ```text
//!   round 0   sends the data pages (a zero page travels as a bit); round k
//!             what the harvest ending round k−1 found
//!   a step    each vCPU dirties clean pages at its rate under the action in
//!             force, at most its working set between two harvests (with
//!             harvests within rounds, only what lies behind the send cursor
//!             is sent again); the *real* policy (`Policy::decide`) sees the
//!             samples the engine would give it: each interval's per-vCPU
//!             dirtying, and each round's end
//!   actions   a time throttle p% leaves a vCPU (1 − p) of the time, in 10 ms
//!             slices: it dirties at its rate × (1 − p), but at most its
//!             working set per slice; a vCPU that paces itself by the clock
//!             falls behind while it sleeps, and in its slices catches up at
//!             its burst rate (sampled under a throttle); a quota q per
//!             interval caps a vCPU at
//!             q / interval while it has clean pages; dirty-limit runs the
//!             backends' own feedback loop (`ferry_vm::dirty_limit::adjust`)
//!             per vCPU, period by period, and throttles by time
//!   stop      what is left fits the downtime target (converged), or the
//!             round cap forces the stop-and-copy (not converged)
//! ```

use super::{policy, Action, ConvergeMode, RoundEnd, Sample};
use crate::summary::{PolicyForecast, PredictInput};
use std::time::Duration;

/// A migration modelled past this is taken not to converge.
pub const HORIZON_SECS: f64 = 3600.0;

/// One vCPU as the model runs it.
#[derive(Clone, Debug, Default)]
struct VcpuModel {
    /// Bytes/s it dirties clean pages at, unthrottled.
    rate: f64,
    /// Bytes/s it dirties while behind its own pace (`rate` if lower).
    burst: f64,
    /// Bytes its pace is behind by: what it would have dirtied while it
    /// slept and has not caught up yet (at most a working set: a pass).
    behind: f64,
    /// The most bytes it can have dirtied at once.
    ws: f64,
    /// Bytes dirtied since its pages were last protected.
    dirty: f64,
    /// With harvests within rounds: bytes the next round sends again, and
    /// the distinct bytes the round's harvests have found (a page
    /// rewritten after a harvest counts once: at most a working set).
    again: f64,
    found: f64,
    /// Bytes newly dirtied since the policy's last sample (its meter).
    metered: f64,
    /// dirty-limit: the throttle its feedback loop holds it at, percent,
    /// and the loop's period so far (seconds, bytes).
    limit_pct: u8,
    period: (f64, f64),
    /// Under a time throttle: what is left of the slice it runs now, and
    /// of the sleep after it (both 0: not throttled).
    run_left: f64,
    sleep_left: f64,
    /// Draws where in its cycle a throttle first finds it.
    phase: Jitter,
}

impl VcpuModel {
    /// Runs it `dt` seconds under a time throttle of `pct`: slices of
    /// [`ferry_vm::THROTTLE_SLICE`] at its own rate, each followed by
    /// `throttle_sleep(pct)`, as the backends run it. Slice by slice, not
    /// as an average: a writer that dirties its whole working set within
    /// a slice (the soft MMU's, whose faults are cheap) dirties all of it
    /// in every round that holds a slice of its, whatever the throttle, and
    /// nothing in a round that holds none. Returns the bytes it dirtied
    /// and the share of `dt` it ran.
    fn run_throttled(&mut self, dt: f64, pct: u8) -> (f64, f64) {
        let slice = ferry_vm::THROTTLE_SLICE.as_secs_f64();
        let sleep = ferry_vm::throttle_sleep(pct).as_secs_f64();
        if self.run_left <= 0.0 && self.sleep_left <= 0.0 {
            // Newly throttled: somewhere in a slice.
            self.run_left = slice * self.phase.unit();
        }
        let (mut t, mut ran, mut new) = (0.0, 0.0, 0.0);
        while t < dt {
            if self.run_left > 0.0 {
                let r = self.run_left.min(dt - t);
                let d = self.run(r).min((self.ws - self.dirty - new).max(0.0));
                new += d;
                ran += r;
                t += r;
                self.run_left -= r;
                if self.run_left <= 1e-12 {
                    self.run_left = 0.0;
                    self.sleep_left = sleep.max(1e-9);
                }
            } else {
                let s = self.sleep_left.min(dt - t);
                t += s;
                self.sleep_left -= s;
                self.behind = (self.behind + self.rate * s).min(self.ws);
                if self.sleep_left <= 1e-12 {
                    self.sleep_left = 0.0;
                    self.run_left = slice;
                }
            }
        }
        (new, if dt > 0.0 { ran / dt } else { 1.0 })
    }

    /// What it would dirty running `r` seconds: its pace, plus what it is
    /// behind by, at most its burst rate.
    fn run(&mut self, r: f64) -> f64 {
        let want = (self.rate * r + self.behind).min(self.burst.max(self.rate) * r);
        self.behind = (self.behind + self.rate * r - want).max(0.0);
        want
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
        let pct = match action {
            Some(Action::Time(p)) => *p,
            Some(Action::Limit(Some(_))) => self.limit_pct,
            _ => 0,
        };
        let left = (self.ws - self.dirty).max(0.0);
        let (new, share) = match action {
            _ if pct > 0 => self.run_throttled(dt, pct),
            // A vCPU that has used its quota sleeps to the next interval;
            // one with nothing clean left to dirty is never charged.
            Some(Action::Quota(Some(q))) if self.rate > q.bytes_per_sec(v) && left > 0.0 => {
                let cap = q.bytes_per_sec(v);
                ((cap * dt).min(left), cap / self.rate)
            }
            _ => (self.run(dt).min(left), 1.0),
        };
        if pct == 0 {
            (self.run_left, self.sleep_left) = (0.0, 0.0);
        }
        self.dirty += new;
        self.metered += new;
        if let Some(f) = again_share {
            // The interval's harvest protects its pages again.
            self.again = (self.again + new * f).min(self.ws);
            self.found = (self.found + new).min(self.ws);
            self.dirty = 0.0;
        }
        if let Some(Action::Limit(Some(limit))) = action {
            // The backend's loop: each period's rate moves the throttle (a
            // period in which it dirtied nothing says nothing).
            self.period.0 += dt;
            self.period.1 += new;
            let period = ferry_vm::dirty_limit::PERIOD.as_secs_f64();
            if self.period.0 >= period * 0.999 {
                if self.period.1 > 0.0 {
                    let rate = self.period.1 / self.period.0;
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
        self.found = 0.0;
        found
    }
}

/// How much a round's time on the link varies about bytes / rate: about as
/// much as the bandwidth cap's rounds on this project's hosts did
/// (docs/convergence.md, "The prediction").
const JITTER: f64 = 0.03;
/// Runs of the model per policy, each with its own round times.
pub const RUNS: u64 = 8;

/// Each round's share of its nominal time, 1 ± [`JITTER`], drawn from a
/// fixed sequence (the same prediction for the same input).
///
/// A policy that acts on wall-clock periods meets the rounds at a phase
/// that this decides. QEMU's auto-converge closes a period at the first
/// harvest at least 1 s after the last: with rounds of about 1 s, a period
/// holds one round or two by a few milliseconds either way, and its
/// throttle steps every 2 or every 4 rounds. Measured, it stepped every 3
/// (kvm, 2 writers of 64 MiB over 128 MiB/s), and a run of exact rounds
/// predicted that migration far shorter than it took. The model runs
/// [`RUNS`] times with rounds that vary as measured ones do, and reports
/// their mean.
#[derive(Clone, Debug, Default)]
struct Jitter(u64);

impl Jitter {
    /// Uniform in [0, 1) (xorshift64*).
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next round's share of its nominal time.
    fn next(&mut self) -> f64 {
        1.0 + JITTER * (2.0 * self.unit() - 1.0)
    }
}

/// A migration as the model runs it.
pub struct MigrationModel {
    vcpus: Vec<VcpuModel>,
    policy: Option<Box<dyn super::Policy>>,
    action: Option<Action>,
    template: Sample,
    mode: ConvergeMode,
    memory: f64,
    within: bool,
    max_rounds: u32,
    target_secs: f64,
    /// The round being sent, what it sends, and what it has left.
    round: u32,
    round_bytes: f64,
    left: f64,
    /// This round's share of its nominal time (see [`Jitter`]).
    stretch: f64,
    jitter: Jitter,
    /// Seconds modelled, and vCPU-seconds run (not throttled).
    total: f64,
    ran: f64,
    /// Seconds since the policy's last sample.
    since_sample: f64,
    done: Option<PolicyForecast>,
}

impl MigrationModel {
    /// A migration of the guest `input` describes under `mode`, its round
    /// times drawn from `seed` (see `Jitter`). The input's link only
    /// matters to the caller: each step gives its own.
    pub fn new(input: &PredictInput, mode: ConvergeMode, seed: u64) -> Self {
        let vcpus = input.dirty_bytes_per_sec.len();
        let interval = ferry_vm::QUOTA_INTERVAL;
        let mut jitter = Jitter(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let data = input.data_bytes.min(input.memory_bytes) as f64;
        MigrationModel {
            vcpus: (0..vcpus)
                .map(|v| VcpuModel {
                    rate: input.dirty_bytes_per_sec[v].max(0.0),
                    burst: input.burst_bytes_per_sec.get(v).copied().unwrap_or(0.0),
                    ws: input.working_set_bytes.get(v).copied().unwrap_or(0) as f64,
                    phase: Jitter(
                        (jitter.unit().to_bits()
                            ^ (v as u64 + 1).wrapping_mul(0xff51_afd7_ed55_8ccd))
                            | 1,
                    ),
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
                link_bytes_per_sec: input.link_bytes_per_sec.max(1.0),
                downtime_target: Duration::from_secs_f64(input.downtime_target_ms / 1e3),
                quota_interval: interval,
                vcpus: vcpus as u32,
                round_end: None,
                within_round_found: input.harvest_within_rounds.then_some(0),
                resends_found: None,
            },
            mode,
            memory: input.memory_bytes as f64,
            within: input.harvest_within_rounds,
            max_rounds: input.max_rounds,
            target_secs: input.downtime_target_ms / 1e3,
            round: 0,
            round_bytes: data,
            left: data,
            stretch: jitter.next(),
            jitter,
            total: 0.0,
            ran: 0.0,
            since_sample: 0.0,
            done: None,
        }
    }

    /// Seconds modelled so far.
    pub fn elapsed(&self) -> f64 {
        self.total
    }

    /// Runs up to `secs` with the link moving `link` bytes/s; stops early
    /// when the migration ends, and returns its outcome then (and on every
    /// later call).
    pub fn advance(&mut self, secs: f64, link: f64) -> Option<&PolicyForecast> {
        let link = link.max(1.0);
        self.template.link_bytes_per_sec = link;
        let interval = self.template.quota_interval.as_secs_f64();
        let mut budget = secs;
        while self.done.is_none() && budget > 0.0 {
            // This round moves `link / stretch` bytes a second.
            let rate = link / self.stretch;
            let to_sample = (interval - self.since_sample).max(0.0);
            let to_end = self.left / rate;
            let dt = budget.min(to_sample).min(to_end);
            self.step(dt);
            budget -= dt;
            self.left = (self.left - dt * rate).max(0.0);
            if dt >= to_end || self.left <= 0.0 || self.total > HORIZON_SECS {
                // A round past the horizon ends there (a link too slow to
                // finish it would otherwise be modelled for ever).
                self.end_round(link);
            } else if self.since_sample >= interval * 0.999 {
                let listed = if self.round == 0 {
                    self.memory
                } else {
                    self.round_bytes
                };
                let unsent = self.left / self.round_bytes.max(1.0);
                self.sample(listed * unsent, None);
            }
        }
        self.done.as_ref()
    }

    fn step(&mut self, dt: f64) {
        // With harvests within rounds, in the pass only what the guest
        // dirties behind the cursor goes again; in a dirty round, all.
        let sent_share = 1.0 - self.left / self.round_bytes.max(1.0);
        let again = self
            .within
            .then_some(if self.round == 0 { sent_share } else { 1.0 });
        let mut ran = 0.0;
        for (v, m) in self.vcpus.iter_mut().enumerate() {
            ran += m.advance(v, dt, &self.action, again);
        }
        self.total += dt;
        self.since_sample += dt;
        self.ran += dt * ran / self.vcpus.len().max(1) as f64;
    }

    /// Tells the policy what the meter read since its last sample.
    fn sample(&mut self, remaining: f64, round_end: Option<RoundEnd>) {
        let s = Sample {
            round: self.round,
            elapsed: Duration::from_secs_f64(self.since_sample),
            vcpu_dirty_bytes: self
                .vcpus
                .iter_mut()
                .map(|m| std::mem::take(&mut m.metered) as u64)
                .collect(),
            remaining_bytes: remaining as u64,
            round_end,
            within_round_found: self
                .within
                .then(|| self.vcpus.iter().map(|m| m.found).sum::<f64>() as u64),
            ..self.template.clone()
        };
        self.since_sample = 0.0;
        if let Some(a) = self.policy.as_mut().and_then(|p| p.decide(&s)) {
            self.action = Some(a);
        }
    }

    /// The harvest that ends a round: the policy hears of it, and the
    /// migration stops if what is left fits the target or the round cap
    /// is reached.
    fn end_round(&mut self, link: f64) {
        let within = self.within;
        // What the harvest finds, and what the round had not sent yet.
        let found: f64 = self
            .vcpus
            .iter_mut()
            .map(|m| m.harvest(within))
            .sum::<f64>()
            + self.left;
        self.sample(
            found,
            Some(RoundEnd {
                dirty_bytes: found as u64,
                // What went on the link: in the pass, the data pages (the
                // engine counts a zero page's marker as nothing).
                sent_bytes: self.round_bytes as u64,
            }),
        );
        self.round += 1;
        let converges = found <= link * self.target_secs;
        if converges || self.round >= self.max_rounds || self.total > HORIZON_SECS {
            let downtime = found / link;
            self.done = Some(PolicyForecast {
                policy: self.mode,
                converges,
                rounds: self.round + 1,
                total_ms: (self.total + downtime) * 1e3,
                downtime_ms: downtime * 1e3,
                runtime_pct: 100.0 * self.ran / self.total.max(1e-9),
                throttled_ms: (self.total - self.ran) * 1e3,
            });
            return;
        }
        self.round_bytes = found;
        self.left = found;
        self.stretch = self.jitter.next();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

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
        // Its rate over the next second, from clean pages.
        m.dirty = 0.0;
        let before = m.metered;
        for _ in 0..10 {
            m.advance(0, 0.1, &limit, Some(1.0));
        }
        let eff = m.metered - before;
        assert!((eff / (32.0 * MIB as f64) - 1.0).abs() < 0.25, "{eff}");
    }

    #[test]
    fn a_throttled_vcpu_runs_slices_and_a_burst_writer_dirties_its_set_in_one() {
        let slice = ferry_vm::THROTTLE_SLICE.as_secs_f64();
        // 30 GiB/s over 64 MiB: within a slice, all of it.
        let mut burst = VcpuModel {
            rate: 30.0 * 1024.0 * MIB as f64,
            ws: 64.0 * MIB as f64,
            phase: Jitter(7),
            ..VcpuModel::default()
        };
        let auto = Some(Action::Time(99));
        let mut ran = 0.0;
        for _ in 0..20 {
            ran += burst.advance(0, 0.1, &auto, None) * 0.1;
        }
        assert_eq!(burst.dirty, burst.ws, "one slice dirties it all");
        // About one slice in each second at 99%.
        assert!((1.5 * slice..=2.5 * slice).contains(&ran), "{ran}");
        // 500 MiB/s (kvm's faults): 5 MiB a slice, 10 MiB in 2 s.
        let mut held = VcpuModel {
            rate: 500.0 * MIB as f64,
            ws: 64.0 * MIB as f64,
            phase: Jitter(7),
            ..VcpuModel::default()
        };
        for _ in 0..20 {
            held.advance(0, 0.1, &auto, None);
        }
        let mib = held.dirty / MIB as f64;
        assert!((7.5..=12.5).contains(&mib), "{mib}");
    }

    #[test]
    fn a_vcpu_that_paces_itself_catches_up_at_its_burst_after_each_sleep() {
        // Paced at 200 MiB/s, able to dirty 800 MiB/s: at 90% it sleeps
        // 90 ms a slice, falls 18 MiB behind, and runs each 10 ms slice at
        // 800 MiB/s (8 MiB), not at its pace (2 MiB).
        let paced = |burst: f64| VcpuModel {
            rate: 200.0 * MIB as f64,
            burst: burst * MIB as f64,
            ws: 1024.0 * MIB as f64,
            phase: Jitter(7),
            ..VcpuModel::default()
        };
        let time = Some(Action::Time(90));
        let per_second = |mut m: VcpuModel| {
            for _ in 0..10 {
                m.advance(0, 0.1, &time, None);
            }
            m.dirty / MIB as f64
        };
        let caught_up = per_second(paced(800.0));
        assert!((70.0..=90.0).contains(&caught_up), "{caught_up}");
        // A vCPU with no burst beyond its rate: its rate over its slices.
        let held = per_second(paced(0.0));
        assert!((17.5..=22.5).contains(&held), "{held}");
        // Unthrottled, the pace holds whatever the burst.
        let mut free = paced(800.0);
        free.advance(0, 1.0, &None, None);
        assert!((free.dirty / MIB as f64 - 200.0).abs() < 1.0, "{free:?}");
    }
}
