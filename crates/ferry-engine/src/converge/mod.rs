//! Convergence: what the source does when the guest dirties memory faster
//! than precopy can send it.
//!
//! ```text
//!   every policy interval (100 ms unless set) while a round is sent, and
//!   at every harvest (the end of a round):
//!     Sample ──► Policy::decide ──► Action: time throttle p% for every vCPU (auto),
//!            │                      a dirty quota per vCPU per interval (quota),
//!            │                      or a dirty-rate limit per vCPU (dirty-limit)
//!            └─► Stall (harvests only) ──► remaining bytes stopped shrinking for K rounds:
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
//! quota between rounds on its own clock (`DirtyMeter::set_dirty_quota`); the soft
//! backend meters it at write-fault time, the kvm backend with each vCPU's
//! dirty ring. QEMU 8.1's dirty-limit comes next behind the same seam.
//!
//! Before a migration, [`predict`] runs the same policies over a model of
//! the rounds, fed with the guest's measured dirty rates and the link.
//!
//! What the source believes its link moves (`link`: learned from the
//! transfers it measured) lives here too, since the policies plan with
//! it: a migration's link is its connections, a snapshot's the file.

mod auto;
mod limit;
mod link;
pub mod model;
mod predict;
mod quota;
mod sample;
mod sample_vm;
mod settle;
mod share;
mod stall;

pub use auto::AutoConverge;
pub use limit::DirtyLimitPolicy;
pub(crate) use link::{LinkEstimate, Transfer};
pub use predict::predict;
pub use quota::QuotaPolicy;
pub use sample::{RoundEnd, Sample};
pub use sample_vm::{data_bytes, predict_vm, sample_dirtying, DirtySample, PredictSettings};
pub use settle::{allowance as settle_allowance, Settled, SETTLE_MAX};
pub use stall::Stall;

pub(crate) use crate::choices::ConvergeMode;

use crate::error::MigrationError;
use crate::summary::{Escalation, EscalationKind, ThrottleStep};
use crate::tunables::Tunables;
use ferry_vm::{Quota, Vm};
use sample::Meter;
use std::time::{Duration, Instant};

/// What a policy asks of the source VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Every vCPU sleeps this share of its time (percent).
    Time(u8),
    /// Each vCPU may dirty its own quota (`None`: no quota).
    Quota(Option<Quota>),
    /// Every vCPU's dirty rate is limited to this many bytes per second
    /// (`None`: no limit).
    Limit(Option<u64>),
}

/// A convergence policy: told what the engine measured, once per policy
/// interval and at each harvest, it answers with what the source VM should
/// do.
pub trait Policy: Send {
    /// Name for the summary.
    fn name(&self) -> &'static str;
    /// What to apply now, or `None` to leave things as they are.
    fn decide(&mut self, sample: &Sample) -> Option<Action>;
    /// Engages the policy at once (the stall detector asks): what to apply,
    /// or `None` if it is already engaged.
    fn engage(&mut self, sample: &Sample) -> Option<Action>;
}

/// The policy a migration of `vm` runs: `requested`, if the VM declares
/// the mechanism it turns ([`serves`]), or by default the best it serves:
/// the seed's quota where the VM meters each vCPU's writes, else
/// auto-converge where it has a time throttle, else none.
pub fn choose(
    requested: Option<ConvergeMode>,
    vm: &mut dyn Vm,
) -> Result<ConvergeMode, MigrationError> {
    match requested {
        Some(mode) => serves(vm, mode)
            .map(|()| mode)
            .map_err(|why| MigrationError::Refused(why.to_string())),
        None if vm.dirty_meter().is_some() => Ok(ConvergeMode::Quota),
        None if vm.time_throttle().is_some() => Ok(ConvergeMode::Auto),
        None => Ok(ConvergeMode::None),
    }
}

/// Why a VM cannot run a convergence policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvergeError {
    /// The VM declares none of the mechanism the policy turns.
    #[error(
        "the {policy} policy needs {needs}, and this {vmm} VM declares none \
         (choose another --converge, or none)"
    )]
    Unserved {
        /// The policy asked for.
        policy: ConvergeMode,
        /// The mechanism it turns, in words.
        needs: &'static str,
        /// The VM's [`Vm::vmm_id`].
        vmm: String,
    },
}

/// Whether `vm` declares the mechanism `mode` turns (a time throttle for
/// auto-converge, a per-vCPU dirty meter for the quota and the dirty
/// limit), or why not, in words for the operator.
pub fn serves(vm: &mut dyn Vm, mode: ConvergeMode) -> Result<(), ConvergeError> {
    let (declared, what) = match mode {
        ConvergeMode::None => return Ok(()),
        ConvergeMode::Auto => (vm.time_throttle().is_some(), "a time throttle"),
        ConvergeMode::Quota | ConvergeMode::DirtyLimit => {
            (vm.dirty_meter().is_some(), "a per-vCPU dirty meter")
        }
    };
    if declared {
        return Ok(());
    }
    Err(ConvergeError::Unserved {
        policy: mode,
        needs: what,
        vmm: vm.vmm_id().to_string(),
    })
}

/// Each vCPU's pages dirtied so far, where `vm` meters them (else empty).
pub(crate) fn dirtied(vm: &mut dyn Vm) -> Vec<u64> {
    vm.dirty_meter().map_or_else(Vec::new, |m| m.dirtied())
}

/// Applies `action` through the mechanism `vm` declares for it.
fn set(vm: &mut dyn Vm, action: &Action) -> Result<(), ferry_vm::VmError> {
    let undeclared = |vm: &dyn Vm, what: &str| ferry_vm::VmError::undeclared(vm.vmm_id(), what);
    match action {
        Action::Time(pct) => match vm.time_throttle() {
            Some(t) => t.set_time_throttle(*pct),
            None => Err(undeclared(vm, "time throttle")),
        },
        Action::Quota(quota) => match vm.dirty_meter() {
            Some(m) => m.set_dirty_quota(quota.as_ref()),
            None => Err(undeclared(vm, "per-vCPU dirty meter")),
        },
        Action::Limit(limit) => match vm.dirty_meter() {
            Some(m) => m.set_dirty_limit(*limit),
            None => Err(undeclared(vm, "per-vCPU dirty meter")),
        },
    }
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

/// A new quota or limit within 1/8 (12.5%) of the one in force is not applied.
const SAME_WITHIN: u64 = 8;

/// The source's convergence state during one migration.
pub(crate) struct Converger {
    mode: ConvergeMode,
    policy: Option<Box<dyn Policy>>,
    stall: Stall,
    max_downtime: Duration,
    started: Instant,
    throttle: u8,
    quota: Option<Quota>,
    limit: Option<u64>,
    /// The latest sample, so a policy switched to mid-round can engage at
    /// once.
    last: Option<Sample>,
    /// The interval clock and the per-vCPU dirty count's last reading.
    meter: Meter,
    /// Every throttle change.
    pub timeline: Vec<ThrottleStep>,
    /// Timeline steps already shown to the progress display.
    reported: usize,
    /// Every escalation after a stall.
    pub escalations: Vec<Escalation>,
    /// Every change an operator asked for while the migration ran.
    pub operator_changes: Vec<Escalation>,
    /// A stall asks for postcopy instead of escalating (hybrid, on stall).
    switch_on_stall: bool,
    /// Set when a stall asked for postcopy.
    pub switch_requested: bool,
}

impl Converger {
    /// State for a migration under `mode`, whose downtime target may be
    /// raised up to `max_downtime` when precopy stalls.
    pub fn new(mode: ConvergeMode, max_downtime: Duration) -> Self {
        Converger {
            mode,
            policy: policy(mode),
            stall: Stall::default(),
            max_downtime,
            started: Instant::now(),
            throttle: 0,
            quota: None,
            limit: None,
            last: None,
            meter: Meter::new(),
            timeline: Vec::new(),
            reported: 0,
            escalations: Vec::new(),
            operator_changes: Vec::new(),
            switch_on_stall: false,
            switch_requested: false,
        }
    }

    /// This state, where a stall asks for postcopy (`switch_requested`)
    /// instead of escalating, if `yes`.
    pub fn switching_on_stall(self, yes: bool) -> Self {
        Converger {
            switch_on_stall: yes,
            ..self
        }
    }

    /// The policy in force now (an operator may have switched it).
    pub fn mode(&self) -> ConvergeMode {
        self.mode
    }

    /// Timeline steps taken since the last call.
    pub fn unreported(&mut self) -> &[ThrottleStep] {
        let from = std::mem::replace(&mut self.reported, self.timeline.len());
        &self.timeline[from..]
    }

    /// Whether a policy interval has passed since the last sample.
    pub fn interval_due(&self, tunables: &Tunables) -> bool {
        self.meter.due(tunables.quota_interval())
    }

    /// Time since the last sample and each vCPU's bytes dirtied since,
    /// read off `vm`; starts the next interval.
    pub fn read_meter(&mut self, vm: &mut dyn Vm) -> (Duration, Vec<u64>) {
        self.meter.read(vm)
    }

    /// Starts the per-vCPU meter (as dirty logging starts).
    pub fn start_meter(&mut self, vm: &mut dyn Vm) {
        self.meter.start(vm)
    }

    /// Runs the policy on an interval's sample (no harvest: the stall
    /// detector waits for the round's end).
    pub fn on_interval(
        &mut self,
        s: Sample,
        vm: &mut dyn Vm,
        tunables: &Tunables,
    ) -> Result<(), MigrationError> {
        let want = self.consult(&s, vm, tunables)?;
        self.apply_new(vm, s.round, want)
    }

    /// Runs the policy and the stall detector on what a round measured.
    pub fn after_round(
        &mut self,
        s: Sample,
        vm: &mut dyn Vm,
        tunables: &Tunables,
    ) -> Result<(), MigrationError> {
        let mut want = self.consult(&s, vm, tunables)?;
        if self.stall.observe(s.remaining_bytes) {
            if self.switch_on_stall {
                self.record(s.round, EscalationKind::StallPostcopy);
                self.switch_requested = true;
                return Ok(());
            }
            want = want.or(self.escalate(&s, tunables));
        }
        self.apply_new(vm, s.round, want)
    }

    /// Serves operator requests, then asks the policy about `s` (kept as
    /// the latest sample).
    fn consult(
        &mut self,
        s: &Sample,
        vm: &mut dyn Vm,
        tunables: &Tunables,
    ) -> Result<Option<Action>, MigrationError> {
        self.live_requests(vm, tunables, s.round)?;
        let want = self.policy.as_mut().and_then(|p| p.decide(s));
        self.last = Some(s.clone());
        Ok(want)
    }

    /// Applies `want` unless it is in force already.
    fn apply_new(
        &mut self,
        vm: &mut dyn Vm,
        round: u32,
        want: Option<Action>,
    ) -> Result<(), MigrationError> {
        match want {
            Some(action) if !self.in_force(&action) => self.apply(vm, round, action),
            _ => Ok(()),
        }
    }

    /// Serves what an operator asked for since the last call (the control
    /// socket): a policy switch, a time throttle, a new quota interval.
    /// Cheap enough to run at every batch, so a request lands within one.
    pub fn live_requests(
        &mut self,
        vm: &mut dyn Vm,
        tunables: &Tunables,
        round: u32,
    ) -> Result<(), MigrationError> {
        if let Some(mode) = tunables.take_policy_request() {
            self.switch(vm, tunables, round, mode)?;
        }
        if let Some(pct) = tunables.take_throttle_request() {
            self.note(round, EscalationKind::OperatorThrottle(pct));
            if !self.in_force(&Action::Time(pct)) {
                self.apply(vm, round, Action::Time(pct))?;
            }
        }
        let interval = tunables.quota_interval();
        match self.quota.clone() {
            Some(q) if q.interval != interval => {
                self.note(
                    round,
                    EscalationKind::OperatorQuotaInterval {
                        from: q.interval,
                        to: interval,
                    },
                );
                self.apply(vm, round, Action::Quota(Some(q.per(interval))))
            }
            _ => Ok(()),
        }
    }

    /// Switches to `mode`'s policy: the old one's throttle is lifted, and
    /// the new one engages at once on the latest round's figures. A policy
    /// the backend cannot serve is refused (and noted), the old one stays.
    fn switch(
        &mut self,
        vm: &mut dyn Vm,
        tunables: &Tunables,
        round: u32,
        mode: ConvergeMode,
    ) -> Result<(), MigrationError> {
        if mode == self.mode {
            return Ok(());
        }
        if let Err(why) = serves(vm, mode) {
            let why = why.to_string();
            self.note(
                round,
                EscalationKind::OperatorPolicyRefused { policy: mode, why },
            );
            return Ok(());
        }
        let from = std::mem::replace(&mut self.mode, mode);
        self.note(round, EscalationKind::OperatorPolicy { from, to: mode });
        self.lift(vm, round)?;
        self.policy = policy(mode);
        self.stall = Stall::default();
        let engaged = match (self.policy.as_mut(), self.last.clone()) {
            (Some(p), Some(mut s)) => {
                s.quota_interval = tunables.quota_interval();
                p.engage(&s)
            }
            _ => None,
        };
        match engaged {
            Some(action) => self.apply(vm, round, action),
            None => Ok(()),
        }
    }

    /// One escalation step; returns what to apply if the step was to engage
    /// the policy.
    fn escalate(&mut self, s: &Sample, tunables: &Tunables) -> Option<Action> {
        if let Some(action) = self.policy.as_mut().and_then(|p| p.engage(s)) {
            // A policy runs only under a mode that has one: `policy(mode)`.
            self.record(s.round, EscalationKind::Engaged(self.mode));
            return Some(action);
        }
        let now = tunables.downtime_target();
        if now < self.max_downtime {
            let next = (now + now / 2).min(self.max_downtime);
            tunables.set_downtime_target(next);
            self.record(
                s.round,
                EscalationKind::DowntimeRaised {
                    from: now,
                    to: next,
                },
            );
        }
        None
    }

    /// Logs an escalation and keeps it for the summary.
    fn record(&mut self, round: u32, what: EscalationKind) {
        tracing::info!("round {round}: {what}");
        let at_ms = self.elapsed_ms();
        self.escalations.push(Escalation { at_ms, round, what });
    }

    /// Logs an operator's change and keeps it for the summary.
    pub(crate) fn note(&mut self, round: u32, what: EscalationKind) {
        tracing::info!("round {round}: {what}");
        let at_ms = self.elapsed_ms();
        self.operator_changes
            .push(Escalation { at_ms, round, what });
    }

    fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1e3
    }

    /// Whether `action` is what the VM runs under already. A quota or a
    /// limit within [`SAME_WITHIN`] of the one in force counts as the same
    /// (for quotas: no vCPU's moves by more than that share of the largest,
    /// and the interval and the longest sleep are the same), so that one
    /// following the measured link does not change (and fill the timeline)
    /// at every interval.
    fn in_force(&self, action: &Action) -> bool {
        let near = |a: u64, b: u64| a.abs_diff(b) <= b / SAME_WITHIN;
        match (action, &self.quota, self.limit) {
            (Action::Time(pct), ..) => *pct == self.throttle,
            (Action::Quota(Some(q)), Some(now), _) => {
                let slack = now.largest() / SAME_WITHIN;
                q.interval == now.interval
                    && q.longest_sleep == now.longest_sleep
                    && q.bytes.len() == now.bytes.len()
                    && q.bytes
                        .iter()
                        .zip(&now.bytes)
                        .all(|(&a, &b)| a.abs_diff(b) <= slack)
            }
            (Action::Quota(q), now, _) => q == now,
            (Action::Limit(Some(l)), _, Some(now)) => near(*l, now),
            (Action::Limit(l), _, now) => *l == now,
        }
    }

    /// Applies `action` to the VM and keeps it in the timeline.
    fn apply(&mut self, vm: &mut dyn Vm, round: u32, action: Action) -> Result<(), MigrationError> {
        tracing::info!("round {round}: {action:?}");
        let what = match action {
            Action::Time(_) => "throttle the source's vCPUs",
            Action::Quota(_) => "set the vCPUs' dirty quota",
            Action::Limit(_) => "set the vCPUs' dirty limit",
        };
        set(vm, &action).map_err(MigrationError::backend(what))?;
        match action {
            Action::Time(pct) => self.throttle = pct,
            Action::Quota(quota) => self.quota = quota,
            Action::Limit(bytes_per_sec) => self.limit = bytes_per_sec,
        }
        self.push_step(round);
        Ok(())
    }

    /// Keeps what is in force now in the timeline.
    fn push_step(&mut self, round: u32) {
        self.timeline.push(ThrottleStep {
            at_ms: self.elapsed_ms(),
            round,
            percent: self.throttle,
            quota_bytes: self.quota.as_ref().map(Quota::largest),
            vcpu_quota_bytes: self
                .quota
                .as_ref()
                .map_or_else(Vec::new, |q| q.bytes.clone()),
            quota_interval_ms: self.quota.as_ref().map(|q| q.interval.as_secs_f64() * 1e3),
            quota_longest_sleep_ms: self
                .quota
                .as_ref()
                .map(|q| q.longest_sleep.as_secs_f64() * 1e3),
            limit_bytes_per_sec: self.limit,
        });
    }

    /// Lifts everything in force, as a timeline step.
    fn lift(&mut self, vm: &mut dyn Vm, round: u32) -> Result<(), MigrationError> {
        if self.throttle == 0 && self.quota.is_none() && self.limit.is_none() {
            return Ok(());
        }
        if self.throttle > 0 {
            set(vm, &Action::Time(0))
                .map_err(MigrationError::backend("lift the source's throttle"))?;
            self.throttle = 0;
        }
        if self.quota.take().is_some() {
            set(vm, &Action::Quota(None))
                .map_err(MigrationError::backend("lift the vCPUs' dirty quota"))?;
        }
        if self.limit.take().is_some() {
            set(vm, &Action::Limit(None))
                .map_err(MigrationError::backend("lift the vCPUs' dirty limit"))?;
        }
        self.push_step(round);
        Ok(())
    }

    /// Lifts the throttle and the quota (a failed migration leaves the
    /// source as it was).
    pub fn release(&mut self, vm: &mut dyn Vm) {
        if self.throttle > 0 {
            if let Err(e) = set(vm, &Action::Time(0)) {
                tracing::warn!("cannot lift the source's throttle: {e}");
            }
            self.throttle = 0;
        }
        if self.quota.take().is_some() {
            if let Err(e) = set(vm, &Action::Quota(None)) {
                tracing::warn!("cannot lift the source's dirty quota: {e}");
            }
        }
        if self.limit.take().is_some() {
            if let Err(e) = set(vm, &Action::Limit(None)) {
                tracing::warn!("cannot lift the source's dirty limit: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_that_only_holds_longer_is_a_new_quota() {
        let mut c = Converger::new(ConvergeMode::Quota, Duration::from_millis(300));
        let q = Quota::uniform(1 << 20, 2, Duration::from_millis(100));
        c.quota = Some(q.clone());
        let nearly = Quota::uniform((1 << 20) + 4096, 2, Duration::from_millis(100));
        assert!(c.in_force(&Action::Quota(Some(nearly))));
        let longer = q.with_longest_sleep(Duration::from_millis(100));
        assert!(!c.in_force(&Action::Quota(Some(longer))));
    }

    #[test]
    fn an_unserved_policy_names_what_it_needs_and_the_vm() {
        let why = ConvergeError::Unserved {
            policy: ConvergeMode::Quota,
            needs: "a per-vCPU dirty meter",
            vmm: "kvm".into(),
        };
        assert_eq!(
            why.to_string(),
            "the quota policy needs a per-vCPU dirty meter, and this kvm VM declares none \
             (choose another --converge, or none)"
        );
    }
}
