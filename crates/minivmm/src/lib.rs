//! minivmm: a small VMM built from rust-vmm crates that migrates through
//! ferry's engine contract (`ferry_engine::vmm`) and nothing else of ferry's
//! but the ready-made pieces that contract offers a KVM VMM: KVM's dirty
//! log over its own `VmFd` and the x86 vCPU state library.
//!
//! ```text
//!   kvm-ioctls      the VM, its vCPUs, ioeventfds        vm.rs, vcpu.rs
//!   vm-memory       two regions around a hole, with      memory.rs
//!                   the AtomicBitmap of device writes
//!   vm-superio      a 16550 per vCPU, COM1..COM4         serial.rs  (section "serial", one instance each)
//!   virtio-queue    a virtio-blk per vCPU, virtio-mmio   blk.rs     (section "virtio-blk", one instance each)
//!   vmm-sys-util    eventfds, signals                    iothread.rs, vcpu.rs
//!   iced-x86        the guest program, CPL3              guest.rs, boot.rs
//!   linux-loader,   or a Linux guest: bzImage, zero      linux/
//!   acpi_tables     page, ACPI tables
//!   ferry-engine    migrate / receive_as                 vm.rs (impl Vm), probe.rs
//! ```
//!
//! Threads: one per vCPU, and one I/O thread per disk that serves its
//! queue when its eventfd fires (see [`blk::Notify`] for the three ways a
//! notification can reach it).
//!
//! The guest checks itself three ways (console line numbers, disk blocks
//! read back, and the digest ferry takes anyway); [`checks`] reads the
//! console and disk streams of both ends of a migration.

#![warn(missing_docs)]

pub mod bare;
pub mod blk;
pub mod boot;
pub mod checks;
pub mod fill;
pub mod guest;
pub mod iothread;
pub mod irq_delivery;
pub mod layout;
pub mod linux;
pub mod memory;
pub mod notify_cost;
pub mod probe;
pub mod serial;
mod vcpu;
pub mod virtio_mmio;
pub mod vm;

pub use vcpu::{RunProbe, RunStats};
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

/// The VM's devices, one of each per vCPU, shared by the vCPU threads
/// (which serve their register exits), the I/O thread (which serves the
/// disks' queues) and the VMM (which saves and loads them while both are
/// stopped).
pub struct Devices {
    /// The serial ports, vCPU i's on [`layout::serial_port`]`(i)`.
    pub consoles: Vec<std::sync::Mutex<serial::Console>>,
    /// The block devices, vCPU i's at [`layout::mmio_base`]`(i)`.
    pub blks: Vec<std::sync::Mutex<blk::Blk>>,
    /// Where each block device's rings are (readable while it serves).
    pub rings: Vec<std::sync::Arc<blk::Rings>>,
    /// The vhost-user fill device, driven by vCPU 0, if the VM has one.
    pub fill: Option<std::sync::Mutex<fill::device::FillDevice>>,
    /// What a Linux guest last asked of its sleep control register.
    pub power: std::sync::Mutex<Option<linux::PowerRequest>>,
}

impl Devices {
    /// The console on `port`, and the register it names.
    pub fn console_at(&self, port: u16) -> Option<(&std::sync::Mutex<serial::Console>, u8)> {
        self.consoles.iter().enumerate().find_map(|(i, c)| {
            let offset = port.checked_sub(layout::serial_port(i as u32))?;
            (offset < 8).then_some((c, offset as u8))
        })
    }

    /// A guest write of `value` to the sleep control register: true when
    /// it ends the guest (the vCPU then stops).
    pub fn sleep_write(&self, value: u8) -> bool {
        match linux::power_request(value) {
            Some(request) => {
                *lock(&self.power) = Some(request);
                true
            }
            None => false,
        }
    }

    /// A guest write of the virtio-mmio registers `offset` from the first
    /// device's: a disk's, or the fill device's.
    pub fn mmio_write(&self, offset: u64, data: &[u8]) {
        match self.mmio_device(offset) {
            Some((MmioDevice::Blk(blk), reg)) => lock(blk).write(reg, data),
            Some((MmioDevice::Fill(fill), reg)) => lock(fill).write(reg, data),
            None => {}
        }
    }

    /// A guest read of those registers.
    pub fn mmio_read(&self, offset: u64, data: &mut [u8]) {
        match self.mmio_device(offset) {
            Some((MmioDevice::Blk(blk), reg)) => lock(blk).read(reg, data),
            Some((MmioDevice::Fill(fill), reg)) => lock(fill).read(reg, data),
            None => {}
        }
    }

    /// The device whose registers hold `offset`, and the register.
    fn mmio_device(&self, offset: u64) -> Option<(MmioDevice<'_>, u64)> {
        let (i, reg) = (offset / layout::MMIO_SIZE, offset % layout::MMIO_SIZE);
        if let Some(blk) = usize::try_from(i).ok().and_then(|i| self.blks.get(i)) {
            return Some((MmioDevice::Blk(blk), reg));
        }
        let fill = self
            .fill
            .as_ref()
            .filter(|_| i == u64::from(fill::MMIO_INDEX))?;
        Some((MmioDevice::Fill(fill), reg))
    }
}

/// A device on the virtio-mmio window.
enum MmioDevice<'a> {
    Blk(&'a std::sync::Mutex<blk::Blk>),
    Fill(&'a std::sync::Mutex<fill::device::FillDevice>),
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
