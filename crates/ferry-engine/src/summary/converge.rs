//! What the convergence machinery predicted and did, as plain data for the
//! summaries: each policy's forecast, each change of the throttle, and each
//! escalation when precopy stopped converging. [`crate::converge`] makes
//! them.

use crate::choices::ConvergeMode;
use serde::{Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// A change of the source's vCPU throttle.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThrottleStep {
    /// Milliseconds since the migration started.
    pub at_ms: f64,
    /// The round whose harvest led to it.
    pub round: u32,
    /// Time throttle of every vCPU, in percent (0 under a quota).
    pub percent: u8,
    /// The largest of the vCPUs' quotas, in bytes per quota interval,
    /// under the quota policy (`None`: no quota).
    pub quota_bytes: Option<u64>,
    /// Each vCPU's quota in bytes per quota interval (empty: no quota).
    pub vcpu_quota_bytes: Vec<u64>,
    /// The quota's refill interval in milliseconds (`None`: no quota).
    pub quota_interval_ms: Option<f64>,
    /// The longest single sleep the quota may hold a vCPU to, in
    /// milliseconds (`None`: no quota).
    pub quota_longest_sleep_ms: Option<f64>,
    /// Each vCPU's dirty-rate limit in bytes per second, under the
    /// dirty-limit policy (`None`: no limit).
    pub limit_bytes_per_sec: Option<u64>,
}

/// A step the engine took because precopy stopped converging, or one an
/// operator asked for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Escalation {
    /// Milliseconds since the migration started.
    pub at_ms: f64,
    /// The round after which it happened.
    pub round: u32,
    /// What was done (serialised, and displayed, in words).
    pub what: EscalationKind,
}

/// What an [`Escalation`] did. Its `Display` is the sentence the summary
/// (and its JSON) carries.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EscalationKind {
    /// A stall engaged the policy at once.
    Engaged(ConvergeMode),
    /// A stall raised the downtime target.
    DowntimeRaised {
        /// The target before.
        from: Duration,
        /// The target after.
        to: Duration,
    },
    /// A stall switched the migration to postcopy (a hybrid that switches
    /// on a stall).
    StallPostcopy,
    /// An operator set a time throttle on every vCPU, in percent.
    OperatorThrottle(u8),
    /// An operator changed the quota interval; the quota's rate stays.
    OperatorQuotaInterval {
        /// The interval before.
        from: Duration,
        /// The interval after.
        to: Duration,
    },
    /// An operator switched the policy.
    OperatorPolicy {
        /// The policy before.
        from: ConvergeMode,
        /// The policy after.
        to: ConvergeMode,
    },
    /// An operator asked for a policy the VM cannot serve; the old one
    /// stays.
    OperatorPolicyRefused {
        /// The policy asked for.
        policy: ConvergeMode,
        /// Why the VM cannot serve it (`converge::serves`'s refusal).
        why: String,
    },
    /// An operator asked for postcopy.
    OperatorPostcopy,
}

impl fmt::Display for EscalationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const STALLED: &str = "remaining bytes stopped shrinking";
        match self {
            EscalationKind::Engaged(policy) => write!(f, "{STALLED}: {policy} engaged"),
            EscalationKind::DowntimeRaised { from, to } => write!(
                f,
                "{STALLED}: downtime target raised from {} to {} ms",
                from.as_millis(),
                to.as_millis()
            ),
            EscalationKind::StallPostcopy => write!(f, "{STALLED}: switching to postcopy"),
            EscalationKind::OperatorThrottle(pct) => write!(f, "operator: time throttle {pct}%"),
            EscalationKind::OperatorQuotaInterval { from, to } => write!(
                f,
                "operator: quota interval {} -> {} ms, same rate",
                from.as_millis(),
                to.as_millis()
            ),
            EscalationKind::OperatorPolicy { from, to } => {
                write!(f, "operator: policy {from} -> {to}")
            }
            EscalationKind::OperatorPolicyRefused { policy, why } => {
                write!(f, "operator asked for {policy}: refused: {why}")
            }
            EscalationKind::OperatorPostcopy => f.write_str("operator: switch to postcopy"),
        }
    }
}

impl Serialize for EscalationKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The outcome predicted for one policy.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PolicyForecast {
    /// The policy forecast (serialised by name: none, auto, quota,
    /// dirty-limit).
    pub policy: ConvergeMode,
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
    /// Average time a vCPU spends throttled during the migration, ms: the
    /// guest's cost of the policy, which a short migration that throttles
    /// hard can keep below a long one that throttles less.
    pub throttled_ms: f64,
}

/// The prediction: every policy asked for, and the one to pick.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Prediction {
    /// One forecast per policy.
    pub policies: Vec<PolicyForecast>,
    /// The policy to pick: among those that converge, the one that keeps
    /// the guest throttled least (then the quickest); if none converges,
    /// the one with the least downtime (none if no policy was forecast).
    pub recommended: ConvergeMode,
    /// Whether the link rate was known (else assumed; see the input).
    pub link_known: bool,
    /// What the model was given: the sampled rates, the link, the target.
    pub input: PredictInput,
}

/// What the guest and the link look like before the migration.
#[derive(Clone, Debug, Serialize, PartialEq)]
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
    /// Per vCPU: bytes it dirties per second of running while behind its
    /// own pace, as after a throttle's sleep (a guest that paces its work
    /// by the clock catches up at full speed). Empty, or a vCPU missing:
    /// its rate (a vCPU that never falls behind).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub burst_bytes_per_sec: Vec<f64>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escalation_says_what_it_did_in_the_words_the_summary_always_had() {
        let ms = Duration::from_millis;
        let cases = [
            (
                EscalationKind::Engaged(ConvergeMode::Quota),
                "remaining bytes stopped shrinking: quota engaged",
            ),
            (
                EscalationKind::DowntimeRaised {
                    from: ms(300),
                    to: ms(450),
                },
                "remaining bytes stopped shrinking: downtime target raised from 300 to 450 ms",
            ),
            (
                EscalationKind::StallPostcopy,
                "remaining bytes stopped shrinking: switching to postcopy",
            ),
            (
                EscalationKind::OperatorThrottle(40),
                "operator: time throttle 40%",
            ),
            (
                EscalationKind::OperatorQuotaInterval {
                    from: ms(100),
                    to: ms(50),
                },
                "operator: quota interval 100 -> 50 ms, same rate",
            ),
            (
                EscalationKind::OperatorPolicy {
                    from: ConvergeMode::Auto,
                    to: ConvergeMode::DirtyLimit,
                },
                "operator: policy auto -> dirty-limit",
            ),
            (
                EscalationKind::OperatorPolicyRefused {
                    policy: ConvergeMode::Quota,
                    why: "no meter".into(),
                },
                "operator asked for quota: refused: no meter",
            ),
            (
                EscalationKind::OperatorPostcopy,
                "operator: switch to postcopy",
            ),
        ];
        for (what, words) in cases {
            assert_eq!(what.to_string(), words);
            let e = Escalation {
                at_ms: 1.5,
                round: 3,
                what,
            };
            assert_eq!(
                serde_json::to_string(&e).unwrap(),
                format!(r#"{{"at_ms":1.5,"round":3,"what":"{words}"}}"#)
            );
        }
    }
}
