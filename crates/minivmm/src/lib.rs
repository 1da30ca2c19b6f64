//! minivmm: a small VMM built from rust-vmm crates that migrates through
//! ferry's engine contract (`ferry_engine::vmm`) and nothing else of ferry's
//! but the ready-made pieces that contract offers a KVM VMM: KVM's dirty
//! log over its own `VmFd` and the x86 vCPU state library.
//!
//! ```text
//!   kvm-ioctls      the VM and its vCPU                  vm.rs, vcpu.rs
//!   vm-memory       two regions around a hole, with      memory.rs
//!                   the AtomicBitmap of device writes
//!   vm-superio      16550 serial on 0x3f8                serial.rs  (section "serial")
//!   virtio-queue    virtio-blk over virtio-mmio          blk.rs     (section "virtio-blk")
//!   iced-x86        the guest program, CPL3              guest.rs, boot.rs
//!   ferry-engine    migrate / receive_as                 vm.rs (impl Vm), probe.rs
//! ```
//!
//! The guest checks itself three ways (console line numbers, disk blocks
//! read back, and the digest ferry takes anyway); [`checks`] reads the
//! console and disk streams of both ends of a migration.

#![warn(missing_docs)]

pub mod blk;
pub mod boot;
pub mod checks;
pub mod guest;
pub mod layout;
pub mod memory;
pub mod probe;
pub mod serial;
mod vcpu;
pub mod vm;

pub use vm::{MiniConfig, MiniVm, VMM_ID};

/// A device's state could not be saved or loaded, or its backing failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A section's bytes did not load.
    #[error("the {section} section does not load: {why}")]
    State {
        /// Which section.
        section: &'static str,
        /// Why.
        why: String,
    },
    /// The disk image.
    #[error("the disk image")]
    Disk(#[source] std::io::Error),
}

/// The VM's devices, shared by the vCPU thread (which serves their exits)
/// and the VMM (which saves and loads them while the vCPU is parked).
pub struct Devices {
    /// The serial port.
    pub console: serial::Console,
    /// The block device.
    pub blk: blk::Blk,
}
