//! ferry's own VM on `/dev/kvm`: real vCPUs running the memstress guest.
//!
//! ```text
//!   KvmVm ── GuestRam (2 slots: system, data) ── KVM memslots
//!     ├── vCPU threads (vcpu.rs): KVM_RUN loop, paused by signal
//!     ├── ferry_kvm::throttle: the percent throttle, dirty limit and quota
//!     └── guest/: memstress x86-64 code, booted at CPL3
//! ```
//!
//! Every KVM piece a VMM could reuse (vCPU state, dirty logs, slots, the
//! CPL3 boot image) lives in `ferry-kvm`; this crate is the VM ferry's demo
//! and benchmarks run. Mechanisms the kernel lacks live in the soft backend.

#![warn(missing_docs)]

pub mod error;
pub mod guest;
mod vcpu;
pub mod vm;

pub use error::KvmVmError;
pub use guest::boot::Program;
pub use vm::{KvmVm, Role, VMM_ID};
