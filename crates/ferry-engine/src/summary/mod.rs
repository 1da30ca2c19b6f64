//! What a migration reports: serialisable for `--json`, and for the converge
//! experiment's tables.

mod converge;
mod migration;
mod postcopy;

use crate::choices::ConvergeMode;
pub use converge::{
    Escalation, EscalationKind, PolicyForecast, PredictInput, Prediction, ThrottleStep,
};
use ferry_vm::GuestCheck;
pub use migration::{
    ConvergenceReport, DeviceReport, GuestReport, LinkReport, MemoryReport, MigrationSummary,
    SwitchoverReport,
};
pub use postcopy::{BlockedThread, PostcopyReport};
use serde::Serialize;

/// How a migration ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Outcome {
    /// The guest runs on the destination, memory verified.
    Completed,
    /// The guest runs on the source.
    Failed,
    /// This side holds a paused copy whose memory was verified, and cannot
    /// tell whether the other side's copy runs: the Commit that ends a
    /// precopy was lost. The copy waits for an operator, who resumes it
    /// (QMP's `cont`) once sure the other one does not run, or discards it.
    /// Two copies are never run by ferry itself.
    Held,
}

/// Which kind of round.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RoundKind {
    /// The first pass over all memory.
    Full,
    /// Pages dirtied during the previous round, guest running.
    Dirty,
    /// The last dirty set, guest paused (stop-and-copy).
    Final,
    /// Postcopy's push of the pages the destination lacked, guest running
    /// there (pages served on request are not counted here).
    Postcopy,
}

/// One precopy round, as the source saw it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoundStats {
    /// 0 for the full pass.
    pub round: u32,
    /// Which kind.
    pub kind: RoundKind,
    /// Pages sent.
    pub pages: u64,
    /// Of those, zero pages (sent as a bit, no data).
    pub zero_pages: u64,
    /// Bytes put on the wire (after compression).
    pub bytes: u64,
    /// Page-batch bytes before compression.
    pub raw_bytes: u64,
    /// Wall time of the round.
    pub ms: f64,
    /// Pages the guest dirtied per second during the round (from the harvest
    /// that followed it; 0 for the final round).
    pub dirty_rate_pages_s: f64,
    /// Bytes per second of the round, in MB/s (10^6).
    pub bandwidth_mb_s: f64,
    /// Time spent harvesting the dirty log after the round.
    pub harvest_ms: f64,
}

/// How delta re-sends went.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeltaSummary {
    /// Bytes of the source's cache of last-sent pages.
    pub cache_bytes: u64,
    /// Dirty-round pages sent as a delta.
    pub pages: u64,
    /// Dirty-round pages sent whole (not cached, or changed too much).
    pub misses: u64,
    /// Bytes of the delta entries, against 4096 per page sent whole.
    pub bytes: u64,
}

/// How one source vCPU fared from the start of a migration until the source
/// paused it (or, when the migration failed, until it ended).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VcpuShare {
    /// Share of that time the vCPU was not asleep on a throttle, in percent:
    /// the seed's "guest runtime".
    pub runtime_pct: f64,
    /// The guest's own page-access rate over that time, as a percentage of
    /// its rate just before the migration started.
    pub progress_pct: f64,
}

/// The destination's account of a migration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReceiveSummary {
    /// "completed", "failed", or "held" (returned paused: see [`Outcome::Held`]).
    pub status: Outcome,
    /// Why this copy is held, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// Backend name.
    pub backend: String,
    /// The wire version both ends spoke (the newest both have).
    pub wire_version: u32,
    /// The guest was paused on the source before the switchover, so it
    /// arrived paused and was not started here: the VMM resumes it when it
    /// wants it to run.
    pub paused: bool,
    /// First byte to report sent.
    pub total_ms: f64,
    /// Switchover received to guest running.
    pub resume_ms: f64,
    /// Where `resume_ms` went, step by step.
    pub resume_steps: ResumeSteps,
    /// How long the guest ran with its outputs held before the Commit
    /// (capability held-outputs): what a disk request made right after the
    /// resume waited for the verdict. None where they were not held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_held_ms: Option<f64>,
    /// Data connections the source opened.
    pub connections: usize,
    /// Whether every connection ran mutual TLS.
    pub tls: bool,
    /// Page-data bytes read from the data connections.
    pub bytes_received: u64,
    /// Pages received, counting repeats.
    pub pages_received: u64,
    /// Of those, zero pages.
    pub zero_pages: u64,
    /// Page batches received.
    pub batches: u64,
    /// The memory digest of the destination.
    pub digest: u64,
    /// Whether it matched the source's.
    pub digest_match: bool,
    /// The probe's reading just before the guest resumed here (what the
    /// guest had counted on the source).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_at_resume: Option<GuestCheck>,
    /// The guest's progress after switchover, where the caller ran it and
    /// read its probe again (the engine returns as soon as it commits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passes_after: Option<u64>,
    /// Errors the guest's checks counted after switchover, likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatches_after: Option<u64>,
    /// What postcopy did, if the migration switched to it.
    pub postcopy: Option<PostcopyReport>,
}

/// The destination's steps from the Switchover to the guest running
/// (ms): the parts of its share of the downtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ResumeSteps {
    /// Waiting for the final round's pages to be placed (precopy), or for
    /// the precopy rounds before the push (postcopy).
    pub pages_ms: f64,
    /// Loading the vCPUs' state into the VM.
    pub restore_vcpus_ms: f64,
    /// Loading the devices' state sections.
    pub restore_sections_ms: f64,
    /// Reading the VMM's probe of the guest's own checks.
    pub probe_ms: f64,
    /// The VMM's start of the guest.
    pub start_ms: f64,
    /// The migrating thread's CPU time over `resume_ms`. The rest it
    /// waited: for the final pages (`pages_ms`), in the VMM's hooks, or
    /// for a CPU where the host's are crowded (the guest's vCPUs it
    /// starts run first on a host of one CPU).
    pub cpu_ms: f64,
}

/// Milliseconds of a duration, as f64.
pub(crate) fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A policy by its name, or `default` before one is chosen.
fn policy_or_default<S: serde::Serializer>(
    policy: &Option<ConvergeMode>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match policy {
        Some(p) => s.collect_str(p),
        None => s.serialize_str("default"),
    }
}
