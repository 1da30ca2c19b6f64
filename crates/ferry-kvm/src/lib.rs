//! KVM pieces any VMM reuses, on `/dev/kvm`:
//!
//! ```text
//!   cpu_check:  whether this host can give a guest the CPU it was given
//!               elsewhere (CPUID features, MSRs), named feature by feature
//!   cpu_state/: every vCPU's state (regs, XSAVE, all MSRs, LAPIC, MP state,
//!               events...) and the VM's (kvmclock, irqchip, PIT) in one
//!               checksummed blob
//!   dirty/:     KVM's three dirty logs (bitmap | clear in paced chunks |
//!               ring) as a DirtySource the engine harvests
//!   memory:     registering guest RAM slots, with or without dirty logging
//!   boot:       the CPL3 long-mode boot state this project's hosts run
//!               guest code natively in
//!   host:       whether /dev/kvm is here, for a VMM's tests
//!   stats:      what KVM counts for a vCPU inside KVM_RUN (exits, page
//!               faults fixed, signal exits), from KVM_GET_STATS_FD
//!   stopped:    where a vCPU was when it stopped on its own, in one line
//!   throttle:   the one vCPU throttle (time, dirty quota, dirty limit):
//!               a thread that kicks vCPUs out with a sleep to take
//! ```
//!
//! Nothing here knows a guest program: ferry's own memstress VM
//! (`ferry-kvm-memstress`) and `minivmm` are both built on it.

#![warn(missing_docs)]

pub mod boot;
pub mod cpu_check;
pub mod cpu_state;
pub mod dirty;
pub mod error;
pub mod host;
pub mod ioctls;
pub mod memory;
pub mod stats;
pub mod stopped;
pub mod throttle;

pub use dirty::DirtyTracking;
pub use error::KvmError;
pub use host::{check_api, kvm_available, kvm_usable, require_kvm};
