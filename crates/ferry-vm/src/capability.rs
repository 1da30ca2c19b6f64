//! What a VM can do beyond the minimum, each a small trait a VMM implements
//! only where it has the capability, and hands the engine through an
//! accessor on [`crate::Vm`] (`Some(self)`). The engine reads the accessor,
//! never a probe by side effect: a VM without a time throttle is never
//! throttled, and a policy it cannot serve is refused before anything moves.
//!
//! | capability | accessor | what the engine does with it |
//! |---|---|---|
//! | [`DirtyLog`] | [`crate::Vm::dirty_log`] | harvests what the vCPUs wrote behind [`crate::GuestRam`]'s back |
//! | [`TimeThrottle`] | [`crate::Vm::time_throttle`] | auto-converge: slows every vCPU |
//! | [`DirtyMeter`] | [`crate::Vm::dirty_meter`] | the seed's per-vCPU quota, and QEMU's dirty limit |
//! | [`VcpuState`] | [`crate::Vm::vcpu_state`] | saves the vCPUs at the pause, loads them before the start |
//! | [`MemoryFaults`] | [`crate::Vm::memory_faults`] | postcopy with annotated memory-fault exits |
//! | [`AccessLog`] | [`crate::Vm::access_log`] | a snapshot's working set: the pages the guest read, not only wrote |
//!
//! A VM without [`DirtyLog`] is one whose every guest write goes through
//! `GuestRam` (or a [`crate::DirtySource`]); the digest at the switchover
//! catches one that is not, and the source runs on.

use crate::bitmap::DirtyPages;
use crate::error::VmError;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

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

/// Brings frame `gfn` into guest memory and returns once it is present,
/// or says why it cannot: what a vCPU's fault exit and a device's
/// userfaultfd ([`crate::uffd::DeviceFaults`]) both call.
pub type FetchPage = Arc<dyn Fn(crate::Gfn) -> Result<(), FetchError> + Send + Sync>;

/// What a vCPU needs to resolve its own memory faults (see
/// [`MemoryFaults::set_fault_exits`]).
#[derive(Clone)]
pub struct FaultExits {
    /// Pages present in guest memory; a page is added after its contents
    /// are in place.
    pub present: Arc<crate::PageBits>,
    /// Brings frame `gfn` in and returns once it is present, or says why
    /// it cannot (the migration failed: the vCPU then stops).
    pub fetch: FetchPage,
}

/// Why [`FaultExits::fetch`] could not bring a page in.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Postcopy ended (the migration failed) before the page arrived.
    #[error("postcopy ended before page {:#x} arrived", .0 .0)]
    Ended(crate::Gfn),
    /// The page could not be placed in guest memory.
    #[error("cannot place page {:#x}: {cause}", .gfn.0)]
    Place {
        /// The page.
        gfn: crate::Gfn,
        /// Why, as the placing side said.
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl std::fmt::Debug for FaultExits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultExits").finish_non_exhaustive()
    }
}

/// How a VM tracks the guest's writes, for reports: its
/// [`DirtyLog::method`], or [`DirtyLogMethod::VmmWrites`] where it has no
/// log. `Display` gives the name the summary and the stream's header carry.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DirtyLogMethod {
    /// No log: every guest write goes through [`crate::GuestRam`]
    /// (`vmm-writes`).
    VmmWrites,
    /// KVM's `KVM_GET_DIRTY_LOG` (`bitmap`).
    KvmBitmap,
    /// KVM's `KVM_CLEAR_DIRTY_LOG`, in chunks (`clear`).
    KvmClear,
    /// KVM's per-vCPU dirty ring (`ring`).
    KvmRing,
    /// The soft MMU's write-protection faults, with the mechanisms it
    /// runs (`soft (MECHANISMS)`).
    Soft(String),
    /// Another VMM's log, by its own name.
    Other(std::borrow::Cow<'static, str>),
}

impl std::fmt::Display for DirtyLogMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirtyLogMethod::VmmWrites => f.write_str("vmm-writes"),
            DirtyLogMethod::KvmBitmap => f.write_str("bitmap"),
            DirtyLogMethod::KvmClear => f.write_str("clear"),
            DirtyLogMethod::KvmRing => f.write_str("ring"),
            DirtyLogMethod::Soft(mechanisms) => write!(f, "soft ({mechanisms})"),
            DirtyLogMethod::Other(name) => f.write_str(name),
        }
    }
}

impl Serialize for DirtyLogMethod {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The VM's own log of guest writes: KVM's dirty log or ring, the soft
/// MMU's. Pages written before [`DirtyLog::start_dirty_log`] are not
/// reported.
///
/// # Example
///
/// A VM whose guest writes memory behind [`crate::GuestRam`]'s back (as a
/// vCPU does) logs them in a [`crate::SharedDirtyBitmap`], and hands the
/// log to the engine through its accessor:
///
/// ```
/// # use ferry_vm::{Backing, GuestRam, Vm, VmError};
/// # use std::sync::Arc;
/// # fn ram() -> Arc<GuestRam> {
/// #     Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap())
/// # }
/// use ferry_vm::{DirtyLog, DirtyLogMethod, DirtyPages, Gfn, HarvestStats, SharedDirtyBitmap};
///
/// struct LoggedVm { ram: Arc<GuestRam>, log: SharedDirtyBitmap, on: bool }
///
/// impl DirtyLog for LoggedVm {
///     fn method(&self) -> DirtyLogMethod { DirtyLogMethod::Other("my-log".into()) }
///     fn start_dirty_log(&mut self) -> Result<(), VmError> { self.on = true; Ok(()) }
///     fn harvest_dirty(&mut self, into: &mut DirtyPages) -> Result<HarvestStats, VmError> {
///         let pages = self.log.harvest_into(into);
///         Ok(HarvestStats { pages, ..HarvestStats::default() })
///     }
///     fn stop_dirty_log(&mut self) -> Result<(), VmError> { self.on = false; Ok(()) }
/// }
/// impl Vm for LoggedVm {
/// #   fn vmm_id(&self) -> &str { "example" }
/// #   fn ram(&self) -> &Arc<GuestRam> { &self.ram }
/// #   fn start(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn pause(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn is_running(&self) -> bool { true }
///     // vmm_id, ram, start, pause and is_running as for any VM, and:
///     fn dirty_log(&mut self) -> Option<&mut dyn DirtyLog> { Some(self) }
/// }
///
/// let ram = ram();
/// let mut vm = LoggedVm { log: SharedDirtyBitmap::new(ram.pages()), ram, on: false };
/// assert_eq!(ferry_vm::dirty_tracking(&mut vm).to_string(), "my-log");
/// let log = vm.dirty_log().expect("the VM says it has a log");
/// log.start_dirty_log().unwrap();
/// // The "vCPU" writes pages 3 and 7.
/// vm.log.mark(Gfn(3));
/// vm.log.mark(Gfn(7));
/// let mut dirty = DirtyPages::new(vm.ram.pages());
/// let stats = vm.dirty_log().unwrap().harvest_dirty(&mut dirty).unwrap();
/// assert_eq!((stats.pages, dirty.iter().collect::<Vec<_>>()), (2, vec![Gfn(3), Gfn(7)]));
/// ```
pub trait DirtyLog {
    /// The method in use, for reports.
    fn method(&self) -> DirtyLogMethod;
    /// Starts logging guest writes.
    fn start_dirty_log(&mut self) -> Result<(), VmError>;
    /// Adds every page the guest wrote since the last harvest (or since
    /// the start) to `into`, and re-arms tracking for those pages.
    fn harvest_dirty(&mut self, into: &mut DirtyPages) -> Result<HarvestStats, VmError>;
    /// Stops logging.
    fn stop_dirty_log(&mut self) -> Result<(), VmError>;
}

/// Which pages the vCPUs touched, reads included: what a [`DirtyLog`]
/// cannot see. A snapshot records the pages its guest touched in its last
/// seconds as the working set a lazy restore brings in first; with the
/// dirty logs alone that is the pages it wrote, and a guest that reads
/// more than it writes (a cache, its own code) faults on the rest.
///
/// Like the accessed bits KVM ages for the host's page reclaim, it is a
/// hint: a touch the log misses costs a fault at the restore, never data,
/// so the engine goes on without it when a harvest fails.
///
/// # Example
///
/// ```
/// # use ferry_vm::{Backing, GuestRam, Vm, VmError};
/// # use std::sync::Arc;
/// # fn ram() -> Arc<GuestRam> {
/// #     Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap())
/// # }
/// use ferry_vm::{AccessLog, DirtyPages, Gfn, SharedDirtyBitmap};
///
/// struct TrackedVm { ram: Arc<GuestRam>, touched: SharedDirtyBitmap }
///
/// impl AccessLog for TrackedVm {
///     fn start_access_log(&mut self) -> Result<(), VmError> { self.touched.clear(); Ok(()) }
///     fn harvest_accessed(&mut self, into: &mut DirtyPages) -> Result<u64, VmError> {
///         Ok(self.touched.harvest_into(into))
///     }
///     fn stop_access_log(&mut self) -> Result<(), VmError> { Ok(()) }
/// }
/// impl Vm for TrackedVm {
/// #   fn vmm_id(&self) -> &str { "example" }
/// #   fn ram(&self) -> &Arc<GuestRam> { &self.ram }
/// #   fn start(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn pause(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn is_running(&self) -> bool { true }
///     // vmm_id, ram, start, pause and is_running as for any VM, and:
///     fn access_log(&mut self) -> Option<&mut dyn AccessLog> { Some(self) }
/// }
///
/// let ram = ram();
/// let mut vm = TrackedVm { touched: SharedDirtyBitmap::new(ram.pages()), ram };
/// vm.access_log().expect("the VM tracks accesses").start_access_log().unwrap();
/// // The "vCPU" reads page 5.
/// vm.touched.mark(Gfn(5));
/// let mut touched = DirtyPages::new(vm.ram.pages());
/// assert_eq!(vm.access_log().unwrap().harvest_accessed(&mut touched).unwrap(), 1);
/// assert_eq!(touched.iter().collect::<Vec<_>>(), vec![Gfn(5)]);
/// ```
pub trait AccessLog {
    /// Starts tracking the vCPUs' accesses, forgetting any before.
    fn start_access_log(&mut self) -> Result<(), VmError>;
    /// Adds every page a vCPU read or wrote since the last harvest (or
    /// since the start) to `into` (sized to [`crate::Vm::ram`]'s pages, as
    /// a dirty log's harvest is), re-arms tracking for them, and returns
    /// how many pages it added. Called from the engine's thread, never a
    /// vCPU's.
    fn harvest_accessed(&mut self, into: &mut DirtyPages) -> Result<u64, VmError>;
    /// Stops tracking.
    fn stop_access_log(&mut self) -> Result<(), VmError>;
}

/// Holds back what the guest does outside itself (disk writes, console
/// bytes, packets) while the guest runs, until released: Remus's output
/// commit. A destination whose VM has one runs the guest as soon as its
/// state is in, before the source's digest proves the memory, where it
/// would otherwise wait for the verdict with the guest paused: nothing
/// the guest did can have reached the world if the digest then fails and
/// the source runs on.
///
/// # Example
///
/// A console that queues what the guest prints while held:
///
/// ```
/// # use ferry_vm::{Backing, GuestRam, Vm, VmError};
/// # use std::sync::Arc;
/// # fn ram() -> Arc<GuestRam> {
/// #     Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap())
/// # }
/// use ferry_vm::OutputGate;
///
/// struct ConsoleVm { ram: Arc<GuestRam>, held: Option<Vec<u8>>, out: Vec<u8> }
///
/// impl ConsoleVm {
///     /// The guest prints a byte.
///     fn emit(&mut self, b: u8) {
///         match &mut self.held { Some(queue) => queue.push(b), None => self.out.push(b) }
///     }
/// }
///
/// impl OutputGate for ConsoleVm {
///     fn hold(&mut self) -> Result<(), VmError> { self.held.get_or_insert_with(Vec::new); Ok(()) }
///     fn release(&mut self) -> Result<(), VmError> {
///         self.out.extend(self.held.take().unwrap_or_default());
///         Ok(())
///     }
/// }
/// impl Vm for ConsoleVm {
/// #   fn vmm_id(&self) -> &str { "example" }
/// #   fn ram(&self) -> &Arc<GuestRam> { &self.ram }
/// #   fn start(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn pause(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn is_running(&self) -> bool { true }
///     // vmm_id, ram, start, pause and is_running as for any VM, and:
///     fn output_gate(&mut self) -> Option<&mut dyn OutputGate> { Some(self) }
/// }
///
/// let mut vm = ConsoleVm { ram: ram(), held: None, out: Vec::new() };
/// vm.output_gate().unwrap().hold().unwrap();
/// vm.emit(b'a');
/// assert!(vm.out.is_empty(), "held output must not reach the world");
/// vm.output_gate().unwrap().release().unwrap();
/// assert_eq!(vm.out, b"a");
/// ```
pub trait OutputGate {
    /// From now on, the guest's outputs wait (the guest itself runs on:
    /// a disk request is in flight until released). An error when the VM
    /// cannot hold some output (a device served on the vCPU's own exit):
    /// the engine then keeps the guest paused until the verdict.
    fn hold(&mut self) -> Result<(), VmError>;
    /// Lets every held output go, in order, and stops holding. The engine
    /// calls it at the Commit. A VM handed back `Held` (the link failed
    /// after the verdict, so the source may still run) keeps its outputs
    /// held: an operator who resumes that copy releases them too.
    fn release(&mut self) -> Result<(), VmError>;
}

/// Slows every vCPU to a share of its time, as QEMU's auto-converge does:
/// after each [`THROTTLE_SLICE`] it runs, a vCPU sleeps
/// [`throttle_sleep`]`(percent)`.
///
/// # Example
///
/// A vCPU loop that sleeps [`throttle_sleep`] after each slice it runs:
///
/// ```
/// # use ferry_vm::{Backing, GuestRam, Vm, VmError};
/// # use std::sync::Arc;
/// # fn ram() -> Arc<GuestRam> {
/// #     Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap())
/// # }
/// use ferry_vm::{throttle_sleep, TimeThrottle, THROTTLE_SLICE};
/// use std::sync::atomic::{AtomicU8, Ordering};
///
/// struct ThrottledVm { ram: Arc<GuestRam>, percent: Arc<AtomicU8> }
///
/// impl TimeThrottle for ThrottledVm {
///     fn set_time_throttle(&mut self, percent: u8) -> Result<(), VmError> {
///         self.percent.store(percent, Ordering::Relaxed); // each vCPU thread reads it
///         Ok(())
///     }
/// }
/// impl Vm for ThrottledVm {
/// #   fn vmm_id(&self) -> &str { "example" }
/// #   fn ram(&self) -> &Arc<GuestRam> { &self.ram }
/// #   fn start(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn pause(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn is_running(&self) -> bool { true }
///     // vmm_id, ram, start, pause and is_running as for any VM, and:
///     fn time_throttle(&mut self) -> Option<&mut dyn TimeThrottle> { Some(self) }
/// }
///
/// let mut vm = ThrottledVm { ram: ram(), percent: Arc::new(AtomicU8::new(0)) };
/// vm.time_throttle().unwrap().set_time_throttle(75).unwrap();
/// // What a vCPU thread sleeps after each THROTTLE_SLICE it ran: 3 slices.
/// let sleep = throttle_sleep(vm.percent.load(Ordering::Relaxed));
/// assert_eq!(sleep, THROTTLE_SLICE * 3);
/// ```
pub trait TimeThrottle {
    /// Throttles every vCPU to `percent` (0 = none, at most 99).
    fn set_time_throttle(&mut self, percent: u8) -> Result<(), VmError>;
    /// Time each vCPU has spent asleep on a throttle so far (this one and
    /// a dirty quota alike; not the guest's own idle sleeps): what its
    /// runtime share during a migration is computed from. Empty where the
    /// VM does not count it.
    fn throttled(&self) -> Vec<Duration> {
        Vec::new()
    }
}

/// A per-vCPU dirty meter, and the throttles it makes possible: the seed's
/// dirty quota and QEMU 8.1's dirty limit. Both slow only the vCPUs that
/// write.
///
/// # Example
///
/// A meter that counts each vCPU's newly dirtied pages, and keeps the
/// quota its vCPU threads enforce:
///
/// ```
/// # use ferry_vm::{Backing, GuestRam, Vm, VmError};
/// # use std::sync::Arc;
/// # fn ram() -> Arc<GuestRam> {
/// #     Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap())
/// # }
/// use ferry_vm::{DirtyMeter, Quota};
/// use std::time::Duration;
///
/// struct MeteredVm { ram: Arc<GuestRam>, dirtied: Vec<u64>, quota: Option<Quota> }
///
/// impl DirtyMeter for MeteredVm {
///     fn dirtied(&self) -> Vec<u64> { self.dirtied.clone() }
///     fn set_dirty_quota(&mut self, quota: Option<&Quota>) -> Result<(), VmError> {
///         self.quota = quota.cloned();
///         Ok(())
///     }
///     fn set_dirty_limit(&mut self, _: Option<u64>) -> Result<(), VmError> {
///         Err(VmError::Guest("no dirty limit here".into()))
///     }
/// }
/// impl Vm for MeteredVm {
/// #   fn vmm_id(&self) -> &str { "example" }
/// #   fn ram(&self) -> &Arc<GuestRam> { &self.ram }
/// #   fn start(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn pause(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn is_running(&self) -> bool { true }
///     // vmm_id, ram, start, pause and is_running as for any VM, and:
///     fn dirty_meter(&mut self) -> Option<&mut dyn DirtyMeter> { Some(self) }
/// }
///
/// let mut vm = MeteredVm { ram: ram(), dirtied: vec![10, 0], quota: None };
/// let quota = Quota::new(vec![8 << 20, 4096], Duration::from_millis(100));
/// let meter = vm.dirty_meter().unwrap();
/// meter.set_dirty_quota(Some(&quota)).unwrap();
/// assert_eq!(meter.dirtied(), [10, 0]);
/// assert!(meter.set_dirty_limit(Some(1 << 20)).is_err());
/// assert_eq!(vm.quota.unwrap().of(1), 4096);
/// ```
pub trait DirtyMeter {
    /// Pages each vCPU has newly dirtied since the VM was built: a write
    /// that finds its page already dirty since the last harvest is not
    /// counted again. A convergence policy reads it once per interval.
    fn dirtied(&self) -> Vec<u64>;
    /// Gives each vCPU its dirty quota of `quota.of(vcpu)` bytes per
    /// `quota.interval` (`None`: no quota): a vCPU that dirties its quota
    /// sleeps until the next interval.
    fn set_dirty_quota(&mut self, quota: Option<&Quota>) -> Result<(), VmError>;
    /// Limits every vCPU's dirty rate to `bytes_per_sec` (`None`: no
    /// limit), with the feedback loop of
    /// [`crate::dirty_limit::DirtyLimiter`].
    fn set_dirty_limit(&mut self, bytes_per_sec: Option<u64>) -> Result<(), VmError>;
    /// How often each vCPU has entered the guest so far, and whether it
    /// is in it now (`None`, the default: the VM does not count). Before a
    /// switchover the engine lifts the quota or limit that holds the guest
    /// and waits until each vCPU it kept out has run again, so that the
    /// guest does not see a throttle's sleep and the pause as one gap.
    fn guest_entries(&self) -> Option<Vec<GuestEntries>> {
        None
    }
}

/// One vCPU's passes into the guest ([`DirtyMeter::guest_entries`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestEntries {
    /// Entries so far (KVM_RUN calls, say).
    pub entered: u64,
    /// In the guest now.
    pub inside: bool,
}

impl GuestEntries {
    /// Whether the vCPU has run since `before` was read: it entered the
    /// guest again, or is in it.
    pub fn ran_since(&self, before: &GuestEntries) -> bool {
        self.inside || self.entered > before.entered
    }
}

/// The vCPUs' state as one blob, in the format the VM's `vmm_id` names. A
/// VMM that keeps vCPU state in a section instead has no need of it.
///
/// # Example
///
/// Registers kept as a serde type, saved as JSON; a VM that restores
/// refuses a blob it cannot read:
///
/// ```
/// # use ferry_vm::{Backing, GuestRam, Vm, VmError};
/// # use std::sync::Arc;
/// # fn ram() -> Arc<GuestRam> {
/// #     Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap())
/// # }
/// use ferry_vm::VcpuState;
///
/// #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
/// struct Regs { rip: u64, rsp: u64 }
///
/// struct RegsVm { ram: Arc<GuestRam>, vcpus: Vec<Regs> }
///
/// impl VcpuState for RegsVm {
///     fn save_vcpus(&mut self) -> Result<Vec<u8>, VmError> {
///         serde_json::to_vec(&self.vcpus).map_err(|e| VmError::Guest(e.to_string()))
///     }
///     fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), VmError> {
///         self.vcpus = serde_json::from_slice(state)
///             .map_err(|e| VmError::BadVcpuState(e.to_string()))?;
///         Ok(())
///     }
/// }
/// impl Vm for RegsVm {
/// #   fn vmm_id(&self) -> &str { "example" }
/// #   fn ram(&self) -> &Arc<GuestRam> { &self.ram }
/// #   fn start(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn pause(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn is_running(&self) -> bool { true }
///     // vmm_id, ram, start, pause and is_running as for any VM, and:
///     fn vcpu_state(&mut self) -> Option<&mut dyn VcpuState> { Some(self) }
/// }
///
/// let mut source = RegsVm { ram: ram(), vcpus: vec![Regs { rip: 0x1000, rsp: 0x8000 }] };
/// let blob = ferry_vm::save_vcpu_state_for(&mut source, true).unwrap(); // JSON: no compact form
/// let mut dest = RegsVm { ram: ram(), vcpus: Vec::new() };
/// dest.vcpu_state().unwrap().restore_vcpus(&blob).unwrap();
/// assert_eq!(dest.vcpus, source.vcpus);
/// assert!(dest.vcpu_state().unwrap().restore_vcpus(b"garbled").is_err());
/// ```
pub trait VcpuState {
    /// Serializes the state of every vCPU. The VM is paused.
    fn save_vcpus(&mut self) -> Result<Vec<u8>, VmError>;
    /// Loads vCPU state saved by the same kind of VM, before the vCPUs
    /// first run; refuses what it cannot load
    /// ([`VmError::BadVcpuState`]). A VM that [`saves_compact`] loads
    /// both forms.
    ///
    /// [`saves_compact`]: VcpuState::saves_compact
    fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), VmError>;
    /// Whether this VM also writes its state in a compact form, quicker
    /// to write and to parse while the guest is paused, and loads it. The
    /// engine asks for it only where the destination's VM says so too
    /// (capability `compact-vcpu-state`); elsewhere it calls
    /// [`save_vcpus`](VcpuState::save_vcpus), so an older destination
    /// still loads what it is sent.
    fn saves_compact(&self) -> bool {
        false
    }
    /// The state in the compact form (see
    /// [`saves_compact`](VcpuState::saves_compact)).
    fn save_vcpus_compact(&mut self) -> Result<Vec<u8>, VmError> {
        self.save_vcpus()
    }
}

/// Postcopy with annotated memory-fault exits (the seed): a vCPU whose
/// access needs a page not yet present leaves guest mode and fetches it on
/// its own thread. Without it, a postcopy destination relies on
/// userfaultfd.
///
/// # Example
///
/// A vCPU's fault path: a page not yet present is fetched on the vCPU's
/// own thread, then the access is retried:
///
/// ```
/// # use ferry_vm::{Backing, GuestRam, Vm, VmError};
/// # use std::sync::Arc;
/// # fn ram() -> Arc<GuestRam> {
/// #     Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap())
/// # }
/// use ferry_vm::{FaultExits, Gfn, MemoryFaults, PageBits};
///
/// struct FaultingVm { ram: Arc<GuestRam>, exits: Option<FaultExits> }
///
/// impl FaultingVm {
///     /// What a vCPU does when the guest touches `gfn`.
///     fn touch(&self, gfn: Gfn) -> Result<(), String> {
///         let exits = self.exits.as_ref().expect("set before the vCPUs run");
///         if !exits.present.contains(gfn) {
///             (exits.fetch)(gfn).map_err(|e| e.to_string())?;
///         }
///         Ok(())
///     }
/// }
///
/// impl MemoryFaults for FaultingVm {
///     fn set_fault_exits(&mut self, exits: FaultExits) -> Result<(), VmError> {
///         self.exits = Some(exits);
///         Ok(())
///     }
/// }
/// impl Vm for FaultingVm {
/// #   fn vmm_id(&self) -> &str { "example" }
/// #   fn ram(&self) -> &Arc<GuestRam> { &self.ram }
/// #   fn start(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn pause(&mut self) -> Result<(), VmError> { Ok(()) }
/// #   fn is_running(&self) -> bool { true }
///     // vmm_id, ram, start, pause and is_running as for any VM, and:
///     fn memory_faults(&mut self) -> Option<&mut dyn MemoryFaults> { Some(self) }
/// }
///
/// let mut vm = FaultingVm { ram: ram(), exits: None };
/// // The engine's side: pages arrive from the source; here, page 5 only.
/// let present = Arc::new(PageBits::new(vm.ram.pages()));
/// let marks = Arc::clone(&present);
/// let fetch = move |gfn: Gfn| {
///     if gfn == Gfn(5) { marks.insert(gfn); Ok(()) } else { Err(ferry_vm::FetchError::Ended(gfn)) }
/// };
/// let exits = FaultExits { present: Arc::clone(&present), fetch: Arc::new(fetch) };
/// vm.memory_faults().unwrap().set_fault_exits(exits).unwrap();
/// vm.touch(Gfn(5)).unwrap();
/// assert!(present.contains(Gfn(5)));
/// assert!(vm.touch(Gfn(6)).unwrap_err().contains("postcopy ended"));
/// ```
pub trait MemoryFaults {
    /// From now on a vCPU whose access needs a page not in
    /// `exits.present` calls `exits.fetch` and retries. Set before the
    /// vCPUs first run.
    fn set_fault_exits(&mut self, exits: FaultExits) -> Result<(), VmError>;
}

/// The default refill interval of the per-vCPU dirty quota.
pub const QUOTA_INTERVAL: Duration = Duration::from_millis(100);
/// The shortest and longest quota intervals a [`Quota`] takes: below 10 ms
/// the kvm meter (a 5 ms tick) cannot tell intervals apart; above 10 s a
/// writer would stall visibly.
pub const QUOTA_INTERVALS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(10);

/// The longest single sleep a [`Quota`] may hold a vCPU to, from its
/// first (where every quota starts) to its last (where a policy that
/// finds the guest still outrunning the link may take it). A vCPU whose
/// debt one sleep does not repay runs a short slice and sleeps again; so
/// the longer the sleep, the harder a writer can be held, and the longer
/// a guest's task waits. Measured on a Linux guest: docs/svm-host-runs.md,
/// "The quota's hold".
pub const QUOTA_LONGEST_SLEEPS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(50)..=Duration::from_millis(200);

/// Per-vCPU dirty quotas: vCPU `i` may dirty `bytes[i]` per `interval`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Bytes each vCPU may dirty per interval (each at least one page). A
    /// vCPU past the end of the list gets the last entry.
    pub bytes: Vec<u64>,
    /// How often the quotas are refilled, within [`QUOTA_INTERVALS`].
    pub interval: Duration,
    /// The longest single sleep it may hold a vCPU to, within
    /// [`QUOTA_LONGEST_SLEEPS`] (a VM whose meter sleeps otherwise may
    /// ignore it).
    pub longest_sleep: Duration,
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
            longest_sleep: *QUOTA_LONGEST_SLEEPS.start(),
        }
    }

    /// The same quotas, holding a vCPU asleep at most `longest` at once
    /// (brought within [`QUOTA_LONGEST_SLEEPS`]).
    pub fn with_longest_sleep(mut self, longest: Duration) -> Self {
        self.longest_sleep =
            longest.clamp(*QUOTA_LONGEST_SLEEPS.start(), *QUOTA_LONGEST_SLEEPS.end());
        self
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
        .with_longest_sleep(self.longest_sleep)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_fetch_names_the_page() {
        let ended = FetchError::Ended(crate::Gfn(0x1f));
        assert_eq!(ended.to_string(), "postcopy ended before page 0x1f arrived");
        let place = FetchError::Place {
            gfn: crate::Gfn(0x20),
            cause: "guest memory is gone".into(),
        };
        assert_eq!(
            place.to_string(),
            "cannot place page 0x20: guest memory is gone"
        );
    }

    #[test]
    fn every_dirty_log_method_has_the_name_reports_always_had() {
        let cases = [
            (DirtyLogMethod::VmmWrites, "vmm-writes"),
            (DirtyLogMethod::KvmBitmap, "bitmap"),
            (DirtyLogMethod::KvmClear, "clear"),
            (DirtyLogMethod::KvmRing, "ring"),
            (
                DirtyLogMethod::Soft("split Eager".into()),
                "soft (split Eager)",
            ),
            (DirtyLogMethod::Other("toy".into()), "toy"),
        ];
        for (method, name) in cases {
            assert_eq!(method.to_string(), name);
            assert_eq!(serde_json::to_string(&method).unwrap(), format!("{name:?}"));
        }
    }
}
