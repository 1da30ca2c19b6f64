//! The source's account of a migration, as a tree: the verdict at the top,
//! then one part per concern (the link, the switchover, the device state,
//! the memory, convergence, the guest's own checks, postcopy).
//!
//! Why the JSON stays flat: every part but `postcopy` is flattened into the
//! top-level object, so the keys that scripts, CI and the fleet's tooling
//! read (`status`, `downtime_ms`, `bytes_sent`, `throttle_timeline`, ...)
//! are where they were. The tree is for the code that builds and reads the
//! summary; the JSON is a promise to the people who parse it.

use super::{
    policy_or_default, DeltaSummary, Escalation, Outcome, PostcopyReport, Prediction, RoundStats,
    ThrottleStep, VcpuShare,
};
use crate::choices::{Compression, ConvergeMode, Mode};
use ferry_vm::GuestCheck;
use serde::Serialize;

/// The source's account of a migration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MigrationSummary {
    /// "completed", "failed", or "held" (the Commit was lost: see
    /// [`Outcome::Held`]; `error` says why).
    pub status: Outcome,
    /// The VMM that ran the source (its [`ferry_vm::Vm::vmm_id`]): a
    /// name each VMM gives itself, so a string, not an enum.
    pub backend: String,
    /// precopy, postcopy or hybrid (what was asked; `postcopy` says
    /// whether a hybrid switched).
    pub mode: Mode,
    /// Start of `migrate` to the commit (digest verified), or to the failure.
    /// The destination's guest report after the commit is not included.
    pub total_ms: f64,
    /// Source pause to the receipt of the destination's Resumed frame.
    pub downtime_ms: f64,
    /// Precopy converged: what was left at the end fitted the downtime
    /// target. False when the round cap forced the stop-and-copy (or the
    /// migration failed before).
    pub converged: bool,
    /// Whether source and destination memory digests matched.
    pub digest_match: bool,
    /// Whether the digests were compared at all (a migration that failed
    /// earlier never got that far).
    pub digest_checked: bool,
    /// Why the migration failed, or a problem after it committed.
    pub error: Option<String>,
    /// The connections and what went over them.
    #[serde(flatten)]
    pub link: LinkReport,
    /// Where the downtime went.
    #[serde(flatten)]
    pub switchover: SwitchoverReport,
    /// The VMM's device state.
    #[serde(flatten)]
    pub devices: DeviceReport,
    /// The guest's memory: how it was tracked, and every round.
    #[serde(flatten)]
    pub memory: MemoryReport,
    /// The convergence policy and what it did.
    #[serde(flatten)]
    pub convergence: ConvergenceReport,
    /// The guest's own checks, as the source's probe read them.
    #[serde(flatten)]
    pub guest: GuestReport,
    /// What postcopy did, once the migration switched to it (`None`: it
    /// did not): the destination's report, with the pages this source
    /// counted missing at the switchover and the recoveries it made.
    pub postcopy: Option<PostcopyReport>,
}

/// The connections of a migration and what went over them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkReport {
    /// Wire format version spoken.
    pub wire_version: u32,
    /// Data connections used.
    pub connections: usize,
    /// Whether every connection ran mutual TLS.
    pub tls: bool,
    /// Bytes written to all connections (page data and control).
    pub bytes_sent: u64,
    /// The compression setting: none, lz4, zstd or auto.
    pub compression: Compression,
    /// Page batches sent raw, with lz4, and with zstd (what `auto` chose).
    pub batches_by_codec: [u64; 3],
    /// Delta re-sends (`--delta`), if on.
    pub delta: Option<DeltaSummary>,
}

/// Where the downtime went, and what was predicted for it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SwitchoverReport {
    /// The downtime precopy predicted at its last switchover decision (see
    /// `precopy::downtime`): the final round's, when it `converged`; 0
    /// where precopy never decided (a plain postcopy).
    pub predicted_downtime_ms: f64,
    /// Destination time from Switchover received to guest running.
    pub dest_resume_ms: f64,
    /// Part of the downtime spent stopping the source's vCPUs. The rest:
    /// the final round (`rounds.last()`: its `harvest_ms` and `ms`),
    /// `save_vcpus_ms`, `dest_resume_ms`, and the network.
    pub pause_ms: f64,
    /// The source's migrating thread's CPU time over the downtime: the
    /// pause, saving, the final round's harvest and sends. The rest it
    /// waited: on its data senders, the destination, the network, or a
    /// CPU where the host's are crowded.
    pub downtime_cpu_ms: f64,
    /// Part of the downtime spent in `Vm::save_vcpus`.
    pub save_vcpus_ms: f64,
    /// Part of the downtime spent saving and encoding the sections.
    pub save_sections_ms: f64,
    /// Time the source spent hashing its memory for the digest.
    pub digest_ms: f64,
    /// How long the source waited before hashing, the destination's guest
    /// running, because both ends share this host's CPUs
    /// ([`crate::precopy::SHARED_HOST_YIELD`]); 0 across hosts.
    pub digest_yield_ms: f64,
    /// Whether the destination was asked to verify before resuming.
    pub verify_before_resume: bool,
    /// How long a guest a policy held ran free before the pause, in ms
    /// (0: nothing held it; `converge::settle`).
    pub settle_ms: f64,
    /// Pages the guest dirtied while it settled (sent in the final round).
    pub settle_pages: u64,
    /// Every vCPU had entered the guest again before the pause (where the
    /// VM counts entries; `converge::settle`).
    pub settle_all_ran: bool,
}

/// The VMM's device state: how much, and at what cost it was predicted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceReport {
    /// The rate (bytes per second) at which the downtime prediction counted
    /// saving and loading the device state: the one this kind of VM showed
    /// at its previous large switchover, or the calibrated default
    /// (`ferry_engine::device_cost`).
    pub device_state_bytes_per_sec: f64,
    /// Bytes of device state (the encoded sections) sent at the pause.
    pub device_bytes_at_pause: u64,
    /// Bytes of live device state sent during the rounds, while the guest
    /// ran ([`ferry_vm::LiveState`]).
    pub device_bytes_live: u64,
}

/// The guest's memory: how it was tracked, and every round that sent it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryReport {
    /// Dirty-tracking method of the source, as its VM names it.
    pub dirty_tracking: String,
    /// Guest memory the VMM had marked discarded as the migration started
    /// ([`ferry_vm::GuestRam::discard_range`]): read as zero, not
    /// sent as data.
    pub discarded_bytes: u64,
    /// Pages dirtied ahead of the send cursor that a harvest within their
    /// round caught, so that the round's own read sent them and the next
    /// round did not send them again.
    pub spared_pages: u64,
    /// Pages dirtied ahead of the send cursor in the full pass that a
    /// harvest within it caught, so that the full pass left them for the
    /// next round instead of sending them twice.
    pub deferred_pages: u64,
    /// Every round, the final one last.
    pub rounds: Vec<RoundStats>,
}

/// The convergence policy, what was predicted, and what it did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConvergenceReport {
    /// The convergence policy the migration ran (`None`, serialised as
    /// `default`: not chosen yet, the best the VM serves).
    #[serde(serialize_with = "policy_or_default")]
    pub converge: Option<ConvergeMode>,
    /// What the prediction before the migration said, if one was made.
    pub predicted: Option<Prediction>,
    /// Every change of the source's vCPU throttle.
    pub throttle_timeline: Vec<ThrottleStep>,
    /// Steps taken because precopy stopped converging.
    pub escalations: Vec<Escalation>,
    /// Changes an operator asked for while the migration ran (control
    /// socket `set`): policy switches, throttles, quota intervals.
    pub operator_changes: Vec<Escalation>,
    /// Each source vCPU's runtime and progress during the migration (filled
    /// in by whoever knows the guest program; empty when nobody measured).
    pub vcpu_shares: Vec<VcpuShare>,
}

/// The guest's own checks ([`GuestCheck`]) as the source's probe read them.
/// What the guest counted after the switchover is the destination's to say
/// (its [`super::ReceiveSummary`]); a caller that hears from both adds them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GuestReport {
    /// Errors the guest's own checks counted ([`GuestCheck::errors`]):
    /// before the switchover, plus after it where the caller heard from
    /// the destination. Absent without a [`ferry_vm::GuestProbe`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_mismatches: Option<u64>,
    /// Of those, counted on the source up to the pause (the probe's reading
    /// once the vCPUs were paused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatches_before: Option<u64>,
    /// The probe's reading once the source's vCPUs were paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_at_pause: Option<GuestCheck>,
}
