//! The soft backend of ferry: a software second-level (TDP / stage-2) MMU.
//!
//! Four of the five seed mechanisms live inside KVM's MMU, and a stock host
//! kernel lacks most of them. This crate implements each in a real,
//! concurrent MMU next to its baseline, so their effect is measured side by
//! side in one run, anywhere, without `/dev/kvm`:
//!
//! ```text
//!  SoftVm (vm.rs, the Vm trait) ── vCPU threads (vcpu.rs: memstress loop)
//!        │                               │ per-vCPU TLB (tlb.rs)
//!        ▼                               ▼
//!  Mmu (mmu.rs faults, ops.rs zap/split/write-protect, iter.rs iterator)
//!        │  lock with per-vCPU reader slots (mmu_lock.rs), sharded counters (counter.rs)
//!        │  tables in an arena (table.rs), entries as AtomicU64 (pte.rs)
//!        ▼
//!  GuestRam (ferry-vm)      or sparse memory (sparse.rs): tables real, contents implied
//! ```
//!
//! Mechanism switches are in [`config`]; the dirty quota and the annotated
//! fault exits are in [`quota`] and [`fault_exit`], and the hardware costs the
//! experiments (crate `ferry-experiments`) may model are in [`hw_cost`].

#![warn(missing_docs)]

pub mod config;
pub mod counter;
pub mod error;
pub mod fault;
pub mod fault_exit;
pub mod guest_mem;
pub mod hw_cost;
pub mod iter;
pub mod mmu;
pub mod mmu_lock;
pub mod ops;
pub mod pte;
pub mod quota;
pub mod sparse;
mod spin;
pub mod table;
pub mod tlb;
pub mod vcpu;
pub mod vm;

pub use config::{Iteration, LeafSize, Mechanisms, SplitMode, WriteProtect};
pub use error::SoftError;
pub use mmu::{Mmu, MmuStats, Translation};
pub use ops::{Census, HarvestTiming, WalkStats};
pub use vcpu::Program;
pub use vm::{SoftVm, VMM_ID};
