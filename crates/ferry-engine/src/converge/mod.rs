//! Convergence: what the source does when the guest dirties memory faster
//! than precopy can send it.
//!
//! ```text
//!   every harvest (the end of a round):
//!     RoundSample ──► Policy::decide ──► Action: time throttle p% for every vCPU (auto),
//!                 │                      or a dirty quota per vCPU per 100 ms (quota)
//!                 └─► Stall          ──► remaining bytes stopped shrinking for K rounds:
//!                                          1. engage the policy now (if it is not on yet)
//!                                          2. raise the downtime target step by step,
//!                                             up to --max-downtime-ms
//! ```
//!
//! Every throttle change and escalation is kept with its time and round,
//! and lands in the summary (`throttle_timeline`, `escalations`). A
//! migration that fails leaves the source unthrottled.
//!
//! Policies ([`ConvergeMode`]): `none`; `auto` (QEMU's auto-converge, the
//! baseline: it slows every vCPU, readers too); `quota` (the seed's: each
//! vCPU may dirty a quota derived from the link per interval, and only a
//! vCPU that uses it up sleeps, so readers run on). The backend applies the
//! quota between rounds on its own clock (`Vm::set_dirty_quota`); the soft
//! backend meters it at write-fault time, the kvm backend with each vCPU's
//! dirty ring. QEMU 8.1's dirty-limit comes next behind the same seam.
//!
//! Before a migration, [`predict`] runs the same policies over a model of
//! the rounds, fed with the guest's measured dirty rates and the link.

mod auto;
mod limit;
mod predict;
mod quota;
mod share;
mod stall;

pub use auto::AutoConverge;
pub use limit::DirtyLimitPolicy;
pub use predict::{predict, PolicyForecast, PredictInput, Prediction};
pub use quota::QuotaPolicy;
pub use stall::Stall;

use crate::error::MigrationError;
use crate::summary::{Escalation, ThrottleStep};
use crate::tunables::Tunables;
use ferry_backend::Vm;
use std::time::{Duration, Instant};

/// Which convergence policy the source runs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum ConvergeMode {
    /// Never slow the guest; a stall can still raise the downtime target.
    None,
    /// QEMU's auto-converge: every vCPU sleeps a growing share of its time.
    #[default]
    Auto,
    /// The seed's per-vCPU dirty quota: only writers are slowed.
    Quota,
    /// QEMU 8.1's dirty-limit: each writer's throttle follows its rate.
    DirtyLimit,
}

impl std::str::FromStr for ConvergeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(ConvergeMode::None),
            "auto" => Ok(ConvergeMode::Auto),
            "quota" => Ok(ConvergeMode::Quota),
            "dirty-limit" => Ok(ConvergeMode::DirtyLimit),
            _ => Err(format!(
                "unknown convergence policy {s:?} (none, auto, quota, dirty-limit)"
            )),
        }
    }
}

impl std::fmt::Display for ConvergeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConvergeMode::None => "none",
            ConvergeMode::Auto => "auto",
            ConvergeMode::Quota => "quota",
            ConvergeMode::DirtyLimit => "dirty-limit",
        })
    }
}

/// What the engine measured over the round that just ended.
#[derive(Clone, Copy, Debug)]
pub struct RoundSample {
    /// The round whose dirty pages were just harvested.
    pub round: u32,
    /// Guest bytes dirtied while that round was sent.
    pub dirty_bytes: u64,
    /// Guest bytes that round sent.
    pub sent_bytes: u64,
    /// Bytes precopy still has to send.
    pub remaining_bytes: u64,
    /// Guest bytes per second the link moves.
    pub link_bytes_per_sec: f64,
    /// The downtime target now.
    pub downtime_target: Duration,
    /// vCPUs of the guest.
    pub vcpus: u32,
}

/// What a policy asks of the source VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Every vCPU sleeps this share of its time (percent).
    Time(u8),
    /// Every vCPU may dirty this many bytes per `QUOTA_INTERVAL` (`None`:
    /// no quota).
    Quota(Option<u64>),
    /// Every vCPU's dirty rate is limited to this many bytes per second
    /// (`None`: no limit).
    Limit(Option<u64>),
}

/// A convergence policy: told what each round measured, it answers with
/// what the source VM should do.
pub trait Policy: Send {
    /// Name for the summary.
    fn name(&self) -> &'static str;
    /// What to apply now, or `None` to leave things as they are.
    fn decide(&mut self, sample: &RoundSample) -> Option<Action>;
    /// Engages the policy at once (the stall detector asks): what to apply,
    /// or `None` if it is already engaged.
    fn engage(&mut self, sample: &RoundSample) -> Option<Action>;
}

/// The policy of `mode`.
pub fn policy(mode: ConvergeMode) -> Option<Box<dyn Policy>> {
    match mode {
        ConvergeMode::None => None,
        ConvergeMode::Auto => Some(Box::new(AutoConverge::default())),
        ConvergeMode::Quota => Some(Box::new(QuotaPolicy::default())),
        ConvergeMode::DirtyLimit => Some(Box::new(DirtyLimitPolicy::default())),
    }
}

/// The source's convergence state during one migration.
pub(crate) struct Converger {
    policy: Option<Box<dyn Policy>>,
    stall: Stall,
    max_downtime: Duration,
    started: Instant,
    throttle: u8,
    quota: Option<u64>,
    limit: Option<u64>,
    /// Every throttle change.
    pub timeline: Vec<ThrottleStep>,
    /// Every escalation after a stall.
    pub escalations: Vec<Escalation>,
}

impl Converger {
    /// State for a migration under `mode`, whose downtime target may be
    /// raised up to `max_downtime` when precopy stalls.
    pub fn new(mode: ConvergeMode, max_downtime: Duration) -> Self {
        Converger {
            policy: policy(mode),
            stall: Stall::default(),
            max_downtime,
            started: Instant::now(),
            throttle: 0,
            quota: None,
            limit: None,
            timeline: Vec::new(),
            escalations: Vec::new(),
        }
    }

    /// Runs the policy and the stall detector on what a round measured.
    pub fn after_round(
        &mut self,
        s: &RoundSample,
        vm: &mut dyn Vm,
        tunables: &Tunables,
    ) -> Result<(), MigrationError> {
        let mut want = self.policy.as_mut().and_then(|p| p.decide(s));
        if self.stall.observe(s.remaining_bytes) {
            want = want.or(self.escalate(s, tunables));
        }
        // An operator's throttle (control socket) wins this round.
        if let Some(pct) = tunables.take_throttle_request() {
            tracing::info!(
                "round {}: throttle {pct}% asked for by the operator",
                s.round
            );
            want = Some(Action::Time(pct));
        }
        match want {
            Some(action) if !self.in_force(action) => self.apply(vm, s.round, action),
            _ => Ok(()),
        }
    }

    /// One escalation step; returns what to apply if the step was to engage
    /// the policy.
    fn escalate(&mut self, s: &RoundSample, tunables: &Tunables) -> Option<Action> {
        if let Some(action) = self.policy.as_mut().and_then(|p| p.engage(s)) {
            let what = format!(
                "remaining bytes stopped shrinking: {} engaged",
                self.policy.as_ref().map_or("policy", |p| p.name())
            );
            self.record(s.round, what);
            return Some(action);
        }
        let now = tunables.downtime_target();
        if now < self.max_downtime {
            let next = (now + now / 2).min(self.max_downtime);
            tunables.set_downtime_target(next);
            let what = format!(
                "remaining bytes stopped shrinking: downtime target raised from {} to {} ms",
                now.as_millis(),
                next.as_millis()
            );
            self.record(s.round, what);
        }
        None
    }

    /// Logs an escalation and keeps it for the summary.
    fn record(&mut self, round: u32, what: String) {
        tracing::info!("round {round}: {what}");
        self.escalations.push(Escalation {
            at_ms: self.started.elapsed().as_secs_f64() * 1e3,
            round,
            what,
        });
    }

    /// Whether `action` is what the VM runs under already.
    fn in_force(&self, action: Action) -> bool {
        match action {
            Action::Time(pct) => pct == self.throttle,
            Action::Quota(q) => q == self.quota,
            Action::Limit(l) => l == self.limit,
        }
    }

    /// Applies `action` to the VM and keeps it in the timeline.
    fn apply(&mut self, vm: &mut dyn Vm, round: u32, action: Action) -> Result<(), MigrationError> {
        let mut step = ThrottleStep {
            at_ms: self.started.elapsed().as_secs_f64() * 1e3,
            round,
            percent: 0,
            quota_bytes: None,
            limit_bytes_per_sec: None,
        };
        match action {
            Action::Time(pct) => {
                vm.set_time_throttle(pct)
                    .map_err(MigrationError::backend("throttle the source's vCPUs"))?;
                self.throttle = pct;
                step.percent = pct;
            }
            Action::Quota(bytes) => {
                vm.set_dirty_quota(bytes)
                    .map_err(MigrationError::backend("set the vCPUs' dirty quota"))?;
                self.quota = bytes;
                step.quota_bytes = bytes;
            }
            Action::Limit(bytes_per_sec) => {
                vm.set_dirty_limit(bytes_per_sec)
                    .map_err(MigrationError::backend("set the vCPUs' dirty limit"))?;
                self.limit = bytes_per_sec;
                step.limit_bytes_per_sec = bytes_per_sec;
            }
        }
        tracing::info!("round {round}: {action:?}");
        self.timeline.push(step);
        Ok(())
    }

    /// Lifts the throttle and the quota (a failed migration leaves the
    /// source as it was).
    pub fn release(&mut self, vm: &mut dyn Vm) {
        if self.throttle > 0 {
            if let Err(e) = vm.set_time_throttle(0) {
                tracing::warn!("cannot lift the source's throttle: {e}");
            }
            self.throttle = 0;
        }
        if self.quota.take().is_some() {
            if let Err(e) = vm.set_dirty_quota(None) {
                tracing::warn!("cannot lift the source's dirty quota: {e}");
            }
        }
        if self.limit.take().is_some() {
            if let Err(e) = vm.set_dirty_limit(None) {
                tracing::warn!("cannot lift the source's dirty limit: {e}");
            }
        }
    }
}

/// A round of a 2-vCPU guest over a 1 GB/s link, for the policies' tests.
#[cfg(test)]
fn sample(round: u32, dirty: u64, sent: u64) -> RoundSample {
    RoundSample {
        round,
        dirty_bytes: dirty,
        sent_bytes: sent,
        remaining_bytes: dirty,
        link_bytes_per_sec: 1e9,
        downtime_target: Duration::from_millis(300),
        vcpus: 2,
    }
}
