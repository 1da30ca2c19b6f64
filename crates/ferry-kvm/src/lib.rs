//! The kvm backend of ferry: real vCPUs on `/dev/kvm`.
//!
//! ```text
//!   KvmVm ── GuestRam (2 slots: system, data) ── KVM memslots
//!     ├── vCPU threads (vcpu.rs): KVM_RUN loop, paused by signal
//!     ├── guest/: memstress x86-64 code + CPL3 boot state
//!     ├── dirty/: bitmap | clear (MANUAL_PROTECT2, paced chunks) | ring
//!     └── cpu_state/: every vCPU's state (regs, XSAVE, all MSRs, LAPIC, MP
//!         state, events...) and the VM's (kvmclock, irqchip, PIT) in one
//!         checksummed blob
//! ```
//!
//! It uses what the host kernel offers; mechanisms the kernel lacks live in the
//! soft backend.

#![warn(missing_docs)]

pub mod cpu_state;
pub mod dirty;
pub mod error;
pub mod guest;
pub mod host;
pub mod ioctls;
pub mod memory;
mod throttle;
mod vcpu;
pub mod vm;

pub use error::KvmError;
pub use guest::boot::Program;
pub use host::{kvm_available, require_kvm};
pub use vm::{KvmVm, Role};
