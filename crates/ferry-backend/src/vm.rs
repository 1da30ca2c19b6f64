//! The `Vm` trait: everything the migration engine needs from a backend.
//!
//! ```text
//!  source:       start ─► start_dirty_log ─► (harvest_dirty)* ─► pause ─► harvest_dirty
//!                ─► save_vcpus ─► [switchover] ─► stop_dirty_log / or start again on failure
//!  destination:  (RAM filled by the stream) ─► restore_vcpus ─► start
//! ```
//!
//! The engine merges what `harvest_dirty` returns with the pages the VMM wrote
//! itself ([`crate::GuestRam::take_vmm_dirty`]).

use crate::bitmap::DirtyPages;
pub use crate::error::BackendError;
use crate::ram::GuestRam;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// What a vCPU needs to resolve its own memory faults (see
/// [`Vm::set_fault_exits`]).
#[derive(Clone)]
pub struct FaultExits {
    /// Pages present in guest memory; a page is added after its contents
    /// are in place.
    pub present: Arc<crate::PageBits>,
    /// Brings frame `gfn` in and returns once it is present, or says why
    /// it cannot (the migration failed: the vCPU then stops).
    pub fetch: Arc<dyn Fn(crate::Gfn) -> Result<(), String> + Send + Sync>,
}

impl std::fmt::Debug for FaultExits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultExits").finish_non_exhaustive()
    }
}

/// A reason a VM cannot migrate, or cannot use postcopy; see
/// [`Vm::blockers`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// What it blocks.
    pub scope: BlockScope,
    /// Why, in words an operator acts on.
    pub reason: String,
}

/// What a [`Blocker`] blocks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BlockScope {
    /// Any migration.
    Migration,
    /// Only the switch to postcopy; precopy may run.
    Postcopy,
}

impl Blocker {
    /// Blocks any migration, for `reason`.
    pub fn migration(reason: impl Into<String>) -> Self {
        Blocker {
            scope: BlockScope::Migration,
            reason: reason.into(),
        }
    }

    /// Blocks postcopy only, for `reason`.
    pub fn postcopy(reason: impl Into<String>) -> Self {
        Blocker {
            scope: BlockScope::Postcopy,
            reason: reason.into(),
        }
    }
}

/// The default refill interval of the per-vCPU dirty quota.
pub const QUOTA_INTERVAL: Duration = Duration::from_millis(100);
/// The shortest and longest quota intervals a [`Quota`] takes: below 10 ms
/// the kvm meter (a 5 ms tick) cannot tell intervals apart; above 10 s a
/// writer would stall visibly.
pub const QUOTA_INTERVALS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(10);

/// Per-vCPU dirty quotas: vCPU `i` may dirty `bytes[i]` per `interval`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Bytes each vCPU may dirty per interval (each at least one page). A
    /// vCPU past the end of the list gets the last entry.
    pub bytes: Vec<u64>,
    /// How often the quotas are refilled, within [`QUOTA_INTERVALS`].
    pub interval: Duration,
}

impl Quota {
    /// `bytes[i]` for vCPU `i` per `interval`, all brought into range.
    pub fn new(bytes: Vec<u64>, interval: Duration) -> Self {
        Quota {
            bytes: bytes
                .into_iter()
                .map(|b| b.max(crate::PAGE_SIZE as u64))
                .collect(),
            interval: interval.clamp(*QUOTA_INTERVALS.start(), *QUOTA_INTERVALS.end()),
        }
    }

    /// The same `bytes` per `interval` for each of `vcpus` vCPUs.
    pub fn uniform(bytes: u64, vcpus: usize, interval: Duration) -> Self {
        Quota::new(vec![bytes; vcpus.max(1)], interval)
    }

    /// vCPU `vcpu`'s quota in bytes per interval.
    pub fn of(&self, vcpu: usize) -> u64 {
        let last = self
            .bytes
            .last()
            .copied()
            .unwrap_or(crate::PAGE_SIZE as u64);
        self.bytes.get(vcpu).copied().unwrap_or(last)
    }

    /// The largest quota of any vCPU, in bytes per interval.
    pub fn largest(&self) -> u64 {
        self.bytes.iter().copied().max().unwrap_or(0)
    }

    /// The rate vCPU `vcpu`'s quota allows, in bytes per second.
    pub fn bytes_per_sec(&self, vcpu: usize) -> f64 {
        self.of(vcpu) as f64 / self.interval.as_secs_f64()
    }

    /// The same rates per `interval`.
    pub fn per(&self, interval: Duration) -> Self {
        let scale = interval.as_secs_f64() / self.interval.as_secs_f64();
        Quota::new(
            self.bytes
                .iter()
                .map(|&b| (b as f64 * scale) as u64)
                .collect(),
            interval,
        )
    }
}

/// The time a time-throttled vCPU runs between two sleeps.
pub const THROTTLE_SLICE: Duration = Duration::from_millis(10);
/// The highest time throttle: a vCPU always runs a little.
pub const MAX_THROTTLE_PERCENT: u8 = 99;

/// How long a vCPU throttled to `percent` sleeps after each
/// [`THROTTLE_SLICE`] it runs: `percent / (100 − percent)` slices, so it
/// runs `100 − percent`% of the time (1 s of sleep per 10 ms at 99%).
pub fn throttle_sleep(percent: u8) -> Duration {
    let p = u32::from(percent.min(MAX_THROTTLE_PERCENT));
    THROTTLE_SLICE * p / (100 - p)
}

/// Timing of one harvest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarvestStats {
    /// Pages found dirty.
    pub pages: u64,
    /// Nanoseconds spent getting the log (GET_DIRTY_LOG, ring walk, exchange).
    pub get_ns: u64,
    /// Nanoseconds spent re-protecting (CLEAR_DIRTY_LOG, RESET_DIRTY_RINGS).
    pub clear_ns: u64,
}

/// Where a migration of a VM stands, as the engine tells the VM's VMM
/// ([`Vm::migration_event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle<'a> {
    /// A migration starts: on the source before anything is sent, on the
    /// destination once its factory built the VM and it matched the stream
    /// header, before memory arrives.
    Started,
    /// It committed: the source's VM stays paused for good (the guest is
    /// the destination's), the destination's runs.
    Completed,
    /// It failed or was cancelled, for this reason. A precopy source runs
    /// its guest again; a failed postcopy's source stays paused with every
    /// page; a destination's VM is dropped.
    Aborted(&'a str),
}

/// A running (or ready-to-run) VM as the engine sees it.
///
/// Pausing a VM stops its vCPUs, then its devices: once
/// [`Vm::pause`] returns, nothing of the VM writes guest memory.
///
/// `Any` lets a destination get back its own type from the engine's
/// `receive_as`.
pub trait Vm: Send + std::any::Any {
    /// The VMM's name for its kind of VM (`ferry-kvm`, `minivmm`, ...):
    /// the stream header carries it, and a destination VM of another kind
    /// refuses the stream before any memory arrives. Free-form; it names the
    /// format of the VM's vCPU state, so both ends must agree on it.
    fn vmm_id(&self) -> &str;
    /// How many vCPUs the VM has.
    fn vcpus(&self) -> u32;
    /// What the destination's VM factory needs to build this VM before any
    /// memory arrives: the VMM's own configuration, which the engine
    /// carries in the stream header without reading it (`null`: nothing).
    fn vmm_config(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Guest RAM, shareable with engine threads.
    fn ram(&self) -> &Arc<GuestRam>;
    /// Starts the vCPUs, or resumes them after `pause`.
    fn start(&mut self) -> Result<(), BackendError>;
    /// Stops every vCPU and returns once none is running guest code.
    fn pause(&mut self) -> Result<(), BackendError>;
    /// Whether the vCPUs are running.
    fn is_running(&self) -> bool;
    /// Fails if any vCPU has stopped on its own (guest crash, host error).
    fn check_health(&self) -> Result<(), BackendError>;
    /// Name of the dirty-tracking method in use, for reports.
    fn dirty_tracking(&self) -> String;
    /// What stops this VM from migrating now, or from using postcopy (a
    /// device without migration support, a backend that cannot fault
    /// pages in): QEMU's migration blockers. The engine reads them before
    /// anything moves, on the source before it connects and on the
    /// destination once the VM is built, and refuses with the reason.
    /// None by default.
    fn blockers(&self) -> Vec<Blocker> {
        Vec::new()
    }
    /// The fds a same-host upgrade hands the new process besides memory,
    /// each by name (a disk, a tap, eventfds, vhost-user sockets), so that
    /// it adopts them instead of reopening them; the destination takes
    /// them by name (`ferry_engine::local::LocalIncoming::take_handed_fds`).
    /// Valid while the VM lives. None by default.
    fn handover_fds(&self) -> Vec<(String, std::os::fd::RawFd)> {
        Vec::new()
    }
    /// What the guest was given of its host's CPU, in this VMM's own terms
    /// (a KVM VMM: `ferry_kvm::cpu_check::CpuProfile` as JSON). The stream
    /// header carries it to the destination's [`Vm::check_cpu`]. `None`:
    /// nothing to check (the default).
    fn cpu_profile(&self) -> Option<serde_json::Value> {
        None
    }
    /// Refuses a guest that was given `profile` on its source if this host
    /// cannot give it the same, naming what it lacks
    /// ([`BackendError::Cpu`]). The engine calls it on the destination VM
    /// once built, before any memory moves; a VMM with CPU models of its
    /// own decides as they say. Takes anything by default.
    fn check_cpu(&self, profile: &serde_json::Value) -> Result<(), BackendError> {
        let _ = profile;
        Ok(())
    }
    /// Starts logging guest writes. Pages written before this call are not reported.
    fn start_dirty_log(&mut self) -> Result<(), BackendError>;
    /// Adds every page the guest wrote since the last harvest (or since
    /// `start_dirty_log`) to `into`, and re-arms tracking for those pages.
    fn harvest_dirty(&mut self, into: &mut DirtyPages) -> Result<HarvestStats, BackendError>;
    /// Stops logging.
    fn stop_dirty_log(&mut self) -> Result<(), BackendError>;
    /// Writers of guest memory that keep their own dirty log (devices doing
    /// DMA through their own mappings; see [`crate::dirty_source`]). The
    /// engine starts, collects and stops them with the VM's own log. None
    /// by default: every write goes through the vCPUs or [`GuestRam`].
    fn dirty_sources(&mut self) -> &mut [Box<dyn crate::DirtySource>] {
        &mut []
    }
    /// Slows every vCPU live to `percent` (0 = none, at most 99) as QEMU's
    /// auto-converge does: after each [`THROTTLE_SLICE`] it runs, a vCPU
    /// sleeps [`throttle_sleep`]`(percent)`. The hook a convergence policy
    /// turns while a migration runs.
    fn set_time_throttle(&mut self, percent: u8) -> Result<(), BackendError>;
    /// Gives each vCPU its dirty quota of `quota.of(vcpu)` bytes per
    /// `quota.interval` (`None`: no quota): a vCPU that dirties its quota
    /// sleeps until the next interval; one that does not write is never
    /// slowed. The seed's
    /// per-vCPU dirty-quota throttle. Backends without a per-vCPU dirty meter
    /// say so.
    fn set_dirty_quota(&mut self, quota: Option<&Quota>) -> Result<(), BackendError> {
        let _ = quota;
        Err(BackendError::Operation {
            backend: self.vmm_id().to_string(),
            what: "set a per-vCPU dirty quota: this backend has no per-vCPU dirty meter yet".into(),
            source: None,
        })
    }
    /// Limits every vCPU's dirty rate to `bytes_per_sec` (`None`: no limit)
    /// with QEMU 8.1's dirty-limit feedback loop
    /// ([`crate::dirty_limit::DirtyLimiter`]): each writer's own time
    /// throttle follows its measured rate; a reader is never slowed.
    /// Backends without a per-vCPU dirty meter say so.
    fn set_dirty_limit(&mut self, bytes_per_sec: Option<u64>) -> Result<(), BackendError> {
        let _ = bytes_per_sec;
        Err(BackendError::Operation {
            backend: self.vmm_id().to_string(),
            what: "set a per-vCPU dirty limit: this backend has no per-vCPU dirty meter".into(),
            source: None,
        })
    }
    /// Pages each vCPU has newly dirtied since its VM was built: a write
    /// that finds its page already dirty since the last harvest is not
    /// counted again. The per-vCPU dirty count a convergence policy reads
    /// once per interval. Empty where the backend counts dirtying per VM
    /// only (the kvm bitmap modes).
    fn dirtied(&self) -> Vec<u64> {
        Vec::new()
    }
    /// Time each vCPU has spent asleep on a throttle so far (time throttle
    /// and dirty quota alike; not the guest's own idle sleeps): what its
    /// runtime share during a migration is computed from. Empty where the
    /// backend does not count it.
    fn throttled(&self) -> Vec<Duration> {
        Vec::new()
    }
    /// Postcopy with annotated memory-fault exits: from now on a vCPU
    /// whose access needs a page not in `exits.present` leaves guest mode
    /// and calls `exits.fetch` on its own thread, then retries (the
    /// annotated-memory-faults seed). Set before the vCPUs first run.
    /// Backends without such exits say so, and the caller relies on
    /// userfaultfd (kvm here: the host has no KVM_EXIT_MEMORY_FAULT).
    fn set_fault_exits(&mut self, exits: FaultExits) -> Result<(), BackendError> {
        let _ = exits;
        Err(BackendError::Operation {
            backend: self.vmm_id().to_string(),
            what: "deliver memory faults as vCPU exits: this backend has none".into(),
            source: None,
        })
    }
    /// Device state this VM sends while the guest runs ([`crate::LiveState`]),
    /// if it has any. None by default: every section goes at the pause.
    fn live_state(&mut self) -> Option<&mut dyn crate::LiveState> {
        None
    }
    /// The device state this VM migrates, as sections (see
    /// [`crate::section`]): the source announces them in the stream
    /// header, and a destination refuses a name or version it cannot load
    /// before any memory moves. None by default.
    fn state_sections(&self) -> Vec<crate::SectionSpec> {
        Vec::new()
    }
    /// Saves every section [`Vm::state_sections`] names, once the VM is
    /// paused (vCPUs and devices). Saving may write guest memory (a device
    /// flushing what it holds): the engine collects the dirty log after
    /// this, so those pages go too.
    fn save_sections(&mut self) -> Result<Vec<crate::Section>, BackendError> {
        Ok(Vec::new())
    }
    /// Loads sections the engine has checked against
    /// [`Vm::state_sections`] (known names, versions in range, known
    /// subsections), before the vCPUs first run. A section this VM has but
    /// the stream lacks is not passed: the device keeps its fresh state.
    fn restore_sections(&mut self, sections: &[crate::Section]) -> Result<(), BackendError> {
        match sections.first() {
            None => Ok(()),
            Some(s) => Err(BackendError::BadSection {
                section: s.id.to_string(),
                reason: "this VM has no such device".into(),
            }),
        }
    }
    /// Where a migration of this VM stands: the VMM's hook for start,
    /// complete and abort (quiesce a backend, release a lock on shared
    /// storage, log). Nothing by default.
    fn migration_event(&mut self, event: Lifecycle<'_>) {
        let _ = event;
    }
    /// Serializes the state of every vCPU. The VM must be paused.
    fn save_vcpus(&mut self) -> Result<Vec<u8>, BackendError>;
    /// Loads vCPU state saved by the same backend. The VM must not be running.
    fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), BackendError>;
}
