#![doc = include_str!("../../../docs/embedding.md")]

pub use crate::precopy::CreateVm;
pub use crate::wire::StreamHeader;
pub use ferry_backend::{
    BackendError, Backing, DirtyPages, FaultExits, Gfn, Gpa, GuestCheck, GuestProbe, GuestRam,
    HarvestStats, Quota, Vm, PAGE_SIZE,
};
