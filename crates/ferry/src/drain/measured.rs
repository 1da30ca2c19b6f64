//! One VM's migration in a real drain, as it went: what the drain
//! (`exec`) records when a migration ends, and what a re-plan (`replan`)
//! measures the NIC and the schedule from.

use serde::Serialize;

/// One VM's migration as it went.
#[derive(Clone, Debug, Serialize)]
pub struct MeasuredVm {
    /// The VM.
    pub vm: String,
    /// From and to (host names).
    pub from: String,
    /// To.
    pub to: String,
    /// Its convergence policy.
    pub policy: String,
    /// Seconds since the drain began: when it was started, when it ended.
    pub start_s: f64,
    /// When it ended.
    pub end_s: f64,
    /// The engine's outcome (`completed`, `failed`, `cancelled`, ...).
    pub status: String,
    /// Downtime, ms (0 when it did not switch over).
    pub downtime_ms: f64,
    /// Its target, ms.
    pub downtime_target_ms: f64,
    /// Bytes the source sent.
    pub bytes_sent: u64,
    /// Whether the memory digest matched at the switchover.
    pub digest_match: bool,
    /// The guest's own stamp mismatches, before and after the switchover.
    pub guest_mismatches: Option<u64>,
    /// Passes each vCPU completed on the destination before it reported
    /// (the least of them): its checks cover at least one whole pass.
    pub dest_passes_after: Option<u64>,
    /// Why it failed.
    pub error: Option<String>,
}

impl MeasuredVm {
    /// Whether the VM moved.
    pub fn completed(&self) -> bool {
        self.status == "completed"
    }
}
