//! The `Vm` trait: what the migration engine needs from any VM, and no more.
//!
//! ```text
//!  source:       start ─► dirty logs start ─► (harvest)* ─► pause ─► save sections
//!                ─► harvest ─► save vCPUs ─► [switchover] ─► logs stop / or start again on failure
//!  destination:  (RAM filled by the stream) ─► restore vCPUs, sections ─► start
//! ```
//!
//! The engine merges what the VM's [`DirtyLog`] and dirty sources return with
//! the pages the VMM wrote itself ([`crate::GuestRam::take_vmm_dirty`]).

pub use crate::capability::{
    AccessLog, DirtyLog, DirtyMeter, MemoryFaults, TimeThrottle, VcpuState,
};
pub use crate::error::VmError;
use crate::ram::GuestRam;
use std::sync::Arc;

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
#[non_exhaustive]
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

/// Where a migration of a VM stands, as the engine tells the VM's VMM
/// ([`Vm::migration_event`]).
#[non_exhaustive]
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

/// The calling thread's kernel id (`gettid`): what a VMM's vCPU thread
/// records for [`Vm::vcpu_threads`].
pub fn current_thread_id() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// A running (or ready-to-run) VM as the engine sees it.
///
/// The minimum a VMM writes is five methods: what kind of VM it is, its
/// memory, and pause/start. Everything else has a default, and each further
/// capability is a small trait of [`crate::capability`] handed over by an
/// accessor here (`fn dirty_log(&mut self) -> Option<&mut dyn DirtyLog> {
/// Some(self) }`). Device state is [`Vm::state_sections`] and its pair.
///
/// Pausing a VM stops its vCPUs, then its devices: once
/// [`Vm::pause`] returns, nothing of the VM writes guest memory.
///
/// `Any` lets a destination get back its own type from the engine's
/// `receive_as`.
pub trait Vm: Send + std::any::Any {
    // ── What it is, and its memory ──────────────────────────────────────

    /// The VMM's name for its kind of VM (`ferry-kvm`, `minivmm`, ...):
    /// the stream header carries it, and a destination VM of another kind
    /// refuses the stream before any memory arrives. Free-form; it names the
    /// format of the VM's state, so both ends must agree on it.
    fn vmm_id(&self) -> &str;
    /// Guest RAM, shareable with engine threads.
    fn ram(&self) -> &Arc<GuestRam>;
    /// How many vCPUs the VM has, for the header and reports (1 by default).
    fn vcpus(&self) -> u32 {
        1
    }
    /// The kernel thread id (`gettid`) of each vCPU's thread, in vCPU
    /// order, once they run: a postcopy destination names the vCPU that
    /// waited for each page by it (a userfaultfd fault names its thread).
    /// Empty by default: waits are then reported by thread id alone.
    fn vcpu_threads(&self) -> Vec<u32> {
        Vec::new()
    }
    /// What the destination's VM factory needs to build this VM before any
    /// memory arrives: the VMM's own configuration, which the engine
    /// carries in the stream header without reading it (`null`: nothing).
    fn vmm_config(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    // ── Lifecycle ────────────────────────────────────────────────────────

    /// Starts the vCPUs, or resumes them after `pause`.
    fn start(&mut self) -> Result<(), VmError>;
    /// Stops every vCPU and device, and returns once none runs.
    fn pause(&mut self) -> Result<(), VmError>;
    /// Whether the vCPUs are running.
    fn is_running(&self) -> bool;
    /// Fails if any vCPU has stopped on its own (guest crash, host error).
    /// Healthy by default.
    fn check_health(&self) -> Result<(), VmError> {
        Ok(())
    }
    /// Where a migration of this VM stands: the VMM's hook for start,
    /// complete and abort (quiesce a backend, release a lock on shared
    /// storage, log). Nothing by default.
    fn migration_event(&mut self, event: Lifecycle<'_>) {
        let _ = event;
    }
    /// What stops this VM from migrating now, or from using postcopy (a
    /// device without migration support, a backend that cannot fault
    /// pages in): QEMU's migration blockers. The engine reads them before
    /// anything moves, on the source before it connects and on the
    /// destination once the VM is built, and refuses with the reason.
    /// None by default.
    fn blockers(&self) -> Vec<Blocker> {
        Vec::new()
    }
    /// On a postcopy destination or in a lazy restore from a snapshot,
    /// after the sections are restored and before the VM starts (its
    /// memory is then still mostly missing): the userfaultfds of devices
    /// in other processes that will touch guest memory (a vhost-user
    /// backend after `VHOST_USER_POSTCOPY_ADVISE` and `_LISTEN`), each with
    /// where the device maps guest memory. The engine serves their faults
    /// from the pages it receives or reads, and wakes the device as each
    /// arrives; [`Lifecycle::Completed`] says every page is in. None by
    /// default.
    fn device_userfaultfds(&mut self) -> Result<Vec<crate::DeviceUserfaultfd>, VmError> {
        Ok(Vec::new())
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
    /// ([`VmError::Cpu`]). The engine calls it on the destination VM
    /// once built, before any memory moves. Takes anything by default.
    fn check_cpu(&self, profile: &serde_json::Value) -> Result<(), VmError> {
        let _ = profile;
        Ok(())
    }

    // ── Device state ─────────────────────────────────────────────────────

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
    /// this, so those pages go too. A section's version is its spec's
    /// (leave it 0 in [`crate::Section::new`]).
    fn save_sections(&mut self) -> Result<Vec<crate::Section>, VmError> {
        Ok(Vec::new())
    }
    /// Loads sections the engine has checked against
    /// [`Vm::state_sections`] (known names, versions in range, known
    /// subsections), before the vCPUs first run. A section this VM has but
    /// the stream lacks is not passed: the device keeps its fresh state.
    fn restore_sections(&mut self, sections: &[crate::Section]) -> Result<(), VmError> {
        match sections.first() {
            None => Ok(()),
            Some(s) => Err(VmError::BadSection {
                section: s.id.to_string(),
                reason: "this VM has no such device".into(),
            }),
        }
    }
    /// Device state this VM sends while the guest runs ([`crate::LiveState`]),
    /// if it has any. None by default: every section goes at the pause.
    fn live_state(&mut self) -> Option<&mut dyn crate::LiveState> {
        None
    }

    // ── Capabilities (see crate::capability) ─────────────────────────────

    /// The VM's own log of guest writes, if its vCPUs write memory behind
    /// [`GuestRam`]'s back (KVM, the soft MMU). None by default: every
    /// write goes through `GuestRam` or a dirty source.
    fn dirty_log(&mut self) -> Option<&mut dyn DirtyLog> {
        None
    }
    /// Writers of guest memory that keep their own dirty log (KVM's log
    /// over your own `VmFd`, devices doing DMA through their own mappings;
    /// see [`crate::dirty_source`]). The engine starts, collects and stops
    /// them with the VM's own log. None by default.
    fn dirty_sources(&mut self) -> &mut [Box<dyn crate::DirtySource>] {
        &mut []
    }
    /// The time throttle auto-converge turns, if the VM has one.
    fn time_throttle(&mut self) -> Option<&mut dyn TimeThrottle> {
        None
    }
    /// Its output gate, if the VM can hold its guest's outputs while the
    /// guest runs ([`crate::OutputGate`]). None by default: a strict
    /// destination keeps the guest paused until the digest's verdict.
    fn output_gate(&mut self) -> Option<&mut dyn crate::OutputGate> {
        None
    }
    /// The per-vCPU dirty meter the quota and dirty-limit policies need, if
    /// the VM has one.
    fn dirty_meter(&mut self) -> Option<&mut dyn DirtyMeter> {
        None
    }
    /// The vCPUs' state as one blob, if the VM keeps it outside its
    /// sections.
    fn vcpu_state(&mut self) -> Option<&mut dyn VcpuState> {
        None
    }
    /// Memory faults as vCPU exits, for postcopy, if the VM has them.
    fn memory_faults(&mut self) -> Option<&mut dyn MemoryFaults> {
        None
    }
    /// Its log of the pages the vCPUs touched, reads included, if it
    /// keeps one. None by default: a snapshot's working set is then what
    /// the dirty logs saw written.
    fn access_log(&mut self) -> Option<&mut dyn AccessLog> {
        None
    }
}

/// `vm`'s dirty tracking, for reports: its log's method, or
/// [`crate::DirtyLogMethod::VmmWrites`] where every write goes through `GuestRam`.
pub fn dirty_tracking(vm: &mut dyn Vm) -> crate::DirtyLogMethod {
    match vm.dirty_log() {
        Some(log) => log.method(),
        None => crate::DirtyLogMethod::VmmWrites,
    }
}

/// Saves `vm`'s vCPU state ([`VcpuState`]), or nothing where it keeps none
/// outside its sections.
pub fn save_vcpu_state(vm: &mut dyn Vm) -> Result<Vec<u8>, VmError> {
    vm.vcpu_state().map_or(Ok(Vec::new()), |v| v.save_vcpus())
}

/// [`save_vcpu_state`] in the VM's compact form where `compact` (the
/// destination's VM loads it) and the VM has one.
pub fn save_vcpu_state_for(vm: &mut dyn Vm, compact: bool) -> Result<Vec<u8>, VmError> {
    match vm.vcpu_state() {
        Some(v) if compact && v.saves_compact() => v.save_vcpus_compact(),
        Some(v) => v.save_vcpus(),
        None => Ok(Vec::new()),
    }
}

/// Whether `vm` writes and loads a compact vCPU state
/// ([`VcpuState::saves_compact`]).
pub fn saves_compact_vcpu_state(vm: &mut dyn Vm) -> bool {
    vm.vcpu_state().is_some_and(|v| v.saves_compact())
}

/// Loads vCPU state into `vm`, refusing state it has no [`VcpuState`] to
/// take.
pub fn restore_vcpu_state(vm: &mut dyn Vm, state: &[u8]) -> Result<(), VmError> {
    match vm.vcpu_state() {
        Some(v) => v.restore_vcpus(state),
        None if state.is_empty() => Ok(()),
        None => Err(VmError::BadVcpuState(format!(
            "the stream carries {} bytes of vCPU state, and this VM keeps none",
            state.len()
        ))),
    }
}
