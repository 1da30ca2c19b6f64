//! Same-host live upgrade: the VM moves to a new VMM process on this host
//! without its memory being copied. The source hands the guest memory's
//! files (memfd, hugetlbfs) to the destination over a UNIX socket
//! (`SCM_RIGHTS`); the destination maps the same pages, and only the
//! vCPU and device state travel at the switchover. Downtime is the state
//! transfer and its load, and does not grow with memory: the mapping is
//! made, and memory hashed, while the guest still runs (see [`digest`]).
//!
//! Cloud Hypervisor's local migration and QEMU's `cpr-transfer` pass
//! memory the same way.
//!
//! - **Fd-backed memory only.** Anonymous memory belongs to one process;
//!   it is refused before anything starts, naming `--backing memfd`.
//! - **Failure.** Until the destination says it is ready, the source can
//!   resume: the destination never ran the guest. Once the source says Go
//!   it never resumes, since both would run on the same memory; if the
//!   destination then vanishes before saying it resumed, the source holds
//!   its paused copy ([`Outcome::Held`]) for an operator.
//! - **Proof.** Both ends hash the memory they map; the digests at the
//!   pause must match before the destination resumes.
//!
//! The messages are in [`message`].

mod destination;
pub mod digest;
pub mod fds;
pub mod message;
mod source;

pub use destination::{
    await_local, listen_local, receive_local, receive_local_as, CreateLocalVm, HandedFds,
    LocalIncoming,
};
pub use source::migrate_local;

use crate::summary::Outcome;
use ferry_vm::{GuestCheck, GuestProbe};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

use crate::error::LocalError;

/// Options of either end.
///
/// Non-exhaustive, so that a new option does not break an embedder: start
/// from `Default::default()` and set the fields you want.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// The guest's own checks, read at the pause and before the resume.
    pub probe: Option<Arc<dyn GuestProbe>>,
    /// How long to wait for the other end's next message.
    pub timeout: Duration,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            probe: None,
            timeout: Duration::from_secs(60),
        }
    }
}

/// How a same-host migration went, as one end saw it.
#[derive(Clone, Debug, Serialize)]
pub struct LocalSummary {
    /// completed, failed, or held (see [`LocalError::Unconfirmed`]).
    pub status: Outcome,
    /// The VMM.
    pub vmm: String,
    /// The same-host protocol version both ends spoke.
    pub version: u32,
    /// Bytes of guest memory (mapped, not copied).
    pub memory_bytes: u64,
    /// Memory regions handed over.
    pub regions: usize,
    /// Hashing memory while the guest ran, in ms.
    pub hash_ms: f64,
    /// Pages rehashed at the pause (dirtied since the last rehash).
    pub dirty_pages: u64,
    /// Rounds of rehashing a busy guest's dirty pages before the pause.
    pub rehash_rounds: u32,
    /// The guest's pause: source, from the pause to the destination's
    /// word that it runs; destination, from the state's arrival to its
    /// resume.
    pub downtime_ms: f64,
    /// Where the pause went, on the source of a move that reached it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause: Option<PausePhases>,
    /// From the start to the end, in ms.
    pub total_ms: f64,
    /// Bytes of vCPU and device state sent.
    pub state_bytes: u64,
    /// Whether the digests matched.
    pub digest_match: bool,
    /// The guest's own checks at the pause (source) or resume (destination).
    pub guest: Option<GuestCheck>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// Where a same-host pause's time went, as the source saw it, in ms. What
/// grows with memory shows here (the goal: nothing does).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PausePhases {
    /// Stopping the vCPUs, and reading the guest's own checks.
    pub stop_ms: f64,
    /// Saving the devices and the vCPUs.
    pub save_ms: f64,
    /// Reading the dirty logs one last time.
    pub harvest_ms: f64,
    /// Rehashing the pages dirtied since the last rehash.
    pub rehash_ms: f64,
    /// From sending the state to the destination's word that it is ready:
    /// its rehash, load and digest check.
    pub destination_ms: f64,
    /// From Go to the destination's word that the guest runs there.
    pub resume_ms: f64,
}

impl LocalSummary {
    /// A failed move of a `vmm` VM with `memory_bytes` in `regions`, to be
    /// filled in as it goes.
    fn new(vmm: &str, memory_bytes: u64, regions: usize) -> Self {
        LocalSummary {
            status: Outcome::Failed,
            vmm: vmm.into(),
            version: message::MIN_VERSION,
            memory_bytes,
            regions,
            hash_ms: 0.0,
            dirty_pages: 0,
            rehash_rounds: 0,
            downtime_ms: 0.0,
            pause: None,
            total_ms: 0.0,
            state_bytes: 0,
            digest_match: false,
            guest: None,
            error: None,
        }
    }
}
