#![doc = include_str!("../../../docs/embedding.md")]

pub use crate::precopy::{receive_as, CreateVm};
pub use crate::wire::{Region, StreamHeader};
pub use ferry_backend::{
    catch_panic, error_chain, throttle_sleep, BackendError, Backing, BlockScope, Blocker,
    DirtyPages, DirtySource, FaultExits, Gfn, Gpa, GuestCheck, GuestProbe, GuestRam, HarvestStats,
    Lifecycle, LiveState, Quota, RamError, Section, SectionId, SectionSpec, Subsection, Vm,
    PAGE_SIZE, THROTTLE_SLICE,
};
