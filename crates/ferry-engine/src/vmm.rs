#![doc = include_str!("../../../docs/embedding.md")]

pub use crate::precopy::receive_as;
pub use crate::wire::{CreateVm, Region, StreamHeader};
pub use ferry_vm::{
    catch_panic, current_thread_id, error_chain, throttle_sleep, AccessLog, Backing, BlockScope,
    Blocker, DeviceRegion, DeviceUserfaultfd, DirtyLog, DirtyMeter, DirtyPages, DirtySource,
    DirtySourceError, FaultExits, Gfn, Gpa, GuestCheck, GuestEntries, GuestProbe, GuestRam,
    HarvestStats, Lifecycle, LiveState, MemoryFaults, OutputGate, ProbeError, Quota, RamError,
    Section, SectionId, SectionSpec, Subsection, TimeThrottle, VcpuState, Vm, VmError, PAGE_SIZE,
    THROTTLE_SLICE,
};
