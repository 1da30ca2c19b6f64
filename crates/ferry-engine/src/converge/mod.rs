//! Convergence: what the source does when the guest dirties memory faster
//! than precopy can send it.
//!
//! ```text
//!   every harvest (the end of a round):
//!     RoundSample ──► Policy::decide ──► throttle every vCPU to p% of each 10 ms slice
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
//! Policies ([`ConvergeMode`]): `none`, and `auto` (QEMU's auto-converge, the
//! baseline: it slows every vCPU, readers too). The seed's per-vCPU dirty
//! quota and QEMU 8.1's dirty-limit need per-vCPU meters from the backends,
//! and come next behind the same [`Policy`] seam.

mod auto;
mod stall;

pub use auto::AutoConverge;
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
}

impl std::str::FromStr for ConvergeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(ConvergeMode::None),
            "auto" => Ok(ConvergeMode::Auto),
            "quota" | "dirty-limit" => Err(format!(
                "--converge {s} is not available yet (it needs per-vCPU dirty meters); use auto or none"
            )),
            _ => Err(format!("unknown convergence policy {s:?} (none, auto)")),
        }
    }
}

impl std::fmt::Display for ConvergeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConvergeMode::None => "none",
            ConvergeMode::Auto => "auto",
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
}

/// A convergence policy: told what each round measured, it answers with
/// the time throttle every vCPU should get.
pub trait Policy: Send {
    /// Name for the summary.
    fn name(&self) -> &'static str;
    /// The throttle (percent of each 10 ms slice spent asleep) to apply now,
    /// or `None` to leave it as it is.
    fn decide(&mut self, sample: &RoundSample) -> Option<u8>;
    /// Engages the policy at once (the stall detector asks): the throttle to
    /// apply, or `None` if it is already engaged.
    fn engage(&mut self) -> Option<u8>;
}

/// The policy of `mode`.
pub fn policy(mode: ConvergeMode) -> Option<Box<dyn Policy>> {
    match mode {
        ConvergeMode::None => None,
        ConvergeMode::Auto => Some(Box::new(AutoConverge::default())),
    }
}

/// The source's convergence state during one migration.
pub(crate) struct Converger {
    policy: Option<Box<dyn Policy>>,
    stall: Stall,
    max_downtime: Duration,
    started: Instant,
    throttle: u8,
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
        if let Some(pct) = want.filter(|&p| p != self.throttle) {
            self.set_throttle(vm, s.round, pct)?;
        }
        Ok(())
    }

    /// One escalation step; returns a throttle to apply if the step was to
    /// engage the policy.
    fn escalate(&mut self, s: &RoundSample, tunables: &Tunables) -> Option<u8> {
        let at_ms = self.started.elapsed().as_secs_f64() * 1e3;
        if let Some(pct) = self.policy.as_mut().and_then(|p| p.engage()) {
            let what = format!(
                "remaining bytes stopped shrinking: {} engaged",
                self.policy.as_ref().map_or("policy", |p| p.name())
            );
            tracing::info!("round {}: {what}", s.round);
            self.escalations.push(Escalation {
                at_ms,
                round: s.round,
                what,
            });
            return Some(pct);
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
            tracing::info!("round {}: {what}", s.round);
            self.escalations.push(Escalation {
                at_ms,
                round: s.round,
                what,
            });
        }
        None
    }

    fn set_throttle(&mut self, vm: &mut dyn Vm, round: u32, pct: u8) -> Result<(), MigrationError> {
        vm.set_time_throttle(pct)
            .map_err(MigrationError::backend("throttle the source's vCPUs"))?;
        tracing::info!("round {round}: vCPUs throttled to {pct}%");
        self.throttle = pct;
        self.timeline.push(ThrottleStep {
            at_ms: self.started.elapsed().as_secs_f64() * 1e3,
            round,
            percent: pct,
        });
        Ok(())
    }

    /// Lifts the throttle (a failed migration leaves the source as it was).
    pub fn release(&mut self, vm: &mut dyn Vm) {
        if self.throttle > 0 {
            if let Err(e) = vm.set_time_throttle(0) {
                tracing::warn!("cannot lift the source's throttle: {e}");
            }
            self.throttle = 0;
        }
    }
}
