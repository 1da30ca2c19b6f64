//! The contract between ferry's migration engine and a VMM: the `Vm` trait
//! and its capabilities, guest RAM, dirty pages, device sections.
//!
//! The migration engine drives a VM only through what this crate defines, so it
//! does not know (or care) whether the VM runs on `/dev/kvm`, on the software
//! MMU of the soft backend, or in another VMM:
//!
//! ```text
//!   engine ──► Vm trait ──► kvm backend  (real vCPUs, KVM dirty log / ring)
//!                      └──► soft backend (software stage-2 MMU, all seed mechanisms)
//!   both:  GuestRam (vm-memory mmap + VMM-write bitmap), DirtyPages
//! ```
//!
//! * [`types`]: frame and address newtypes, so units never get mixed up.
//! * [`ram`]: guest RAM in one or more slots, with selectable backing.
//! * [`bitmap`]: dirty-page sets and the shared atomic bitmap harvested by exchange.
//! * [`vm`]: the `Vm` trait: what the engine asks of any VM it migrates.
//! * [`capability`]: what a VM can do beyond that, a small trait each.
//! * [`probe`]: a guest's own checks, which a VMM may hand the engine.
//! * [`section`]: device state as named, versioned sections.
//! * [`thp`]: whether guest RAM can be on transparent huge pages.
//! * [`dirty_source`]: writers of guest memory that keep their own dirty log.
//! * `synthetic` (feature `synthetic`): a device with large, changing state,
//!   for tests and benchmarks.
//!
//! Nothing here knows the guest program: ferry's own VMs run memstress
//! (`ferry-memstress`), and other VMMs run whatever they run.

#![warn(missing_docs)]

pub mod admission;
pub mod affinity;
pub mod bitmap;
pub mod capability;
pub mod device_faults;
pub mod dirty_limit;
pub mod dirty_source;
pub mod error;
pub mod panic;
pub mod probe;
pub mod ram;
pub mod ram_share;
pub mod section;
pub mod skip;
#[cfg(feature = "synthetic")]
pub mod synthetic;
pub mod thp;
pub mod types;
pub mod uffd;
pub mod vm;

pub use bitmap::{DirtyPages, PageBits, SharedDirtyBitmap};
pub use capability::{
    throttle_sleep, AccessLog, DirtyLog, DirtyLogMethod, DirtyMeter, FaultExits, FetchError,
    FetchPage, GuestEntries, HarvestStats, MemoryFaults, OutputGate, Quota, TimeThrottle,
    VcpuState, MAX_THROTTLE_PERCENT, QUOTA_INTERVAL, QUOTA_INTERVALS, QUOTA_LONGEST_SLEEPS,
    THROTTLE_SLICE,
};
pub use device_faults::{DeviceRegion, DeviceUserfaultfd};
pub use dirty_source::{DirtySource, DirtySourceError};
pub use error::{error_chain, VmError};
pub use panic::catch_panic;
pub use probe::{GuestCheck, GuestProbe, ProbeError};
pub use ram::{Backing, GuestRam, Memslot, RamError, RamSlot};
pub use ram_share::SharedRegion;
pub use section::{LiveState, Section, SectionId, SectionSpec, Subsection};
pub use types::{is_zero_page, Gfn, Gpa, PAGE_SHIFT, PAGE_SIZE};
pub use vm::{
    current_thread_id, dirty_tracking, restore_vcpu_state, save_vcpu_state, save_vcpu_state_for,
    saves_compact_vcpu_state, BlockScope, Blocker, Lifecycle, Vm,
};
