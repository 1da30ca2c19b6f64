//! What the convergence machinery did, for the summary: each change of the
//! throttle, and each escalation when precopy stopped converging.

use serde::Serialize;

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
    /// What was done, in words.
    pub what: String,
}
