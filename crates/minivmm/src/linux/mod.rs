//! A Linux guest: a bzImage (Debian's kernel) booted directly through the
//! 64-bit boot protocol, with an initramfs, on the same memory, devices
//! and migration contract as minivmm's own guest.
//!
//! ```text
//!   boot.rs    the kernel and initramfs loaded (linux-loader), the zero
//!              page with its e820 map and command line, page tables, a
//!              GDT, and the registers vCPU 0 starts in
//!   acpi.rs    RSDP, XSDT, FADT (hardware-reduced, with a sleep control
//!              register to power off through), MADT (a LAPIC per vCPU,
//!              the IOAPIC) and a DSDT naming the virtio-mmio disks
//!              (LNRO0005), which Debian's kernel finds only through ACPI
//!   cpuid.rs   KVM's supported CPUID with a topology of one core per
//!              vCPU, and the hypervisor bit that turns kvmclock on
//! ```
//!
//! The kernel needs no BIOS: vCPU 0 starts in long mode at the kernel's
//! 64-bit entry, the others wait for its startup IPIs in the in-kernel
//! LAPIC, and the legacy devices Linux probes (PIC, IOAPIC, PIT) are KVM's.
//! COM1 raises IRQ 4 through an irqfd; the disks raise GSI 16 and up.
//!
//! Why ACPI and virtio-mmio, not virtio-pci: minivmm's disks are virtio-mmio
//! devices whose state already migrates; PCI would add a config space, BARs
//! and interrupt routing to the same devices and to their state. Debian's
//! kernel finds virtio-mmio devices only through ACPI (`LNRO0005`), its
//! command-line devices being compiled out, and ACPI gives the MADT for SMP
//! too. The platform is hardware-reduced, so there is no PM timer, SCI or
//! GPE block to emulate: the guest powers off through one I/O port.
//!
//! `scripts/svm-host.sh` builds the initramfs (busybox, the kernel package's
//! virtio modules, and `ferry-guest-checker` as the program that checks the
//! guest from inside); docs/svm-host.md has what it measured.

pub mod acpi;
pub mod boot;
pub mod cpuid;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The I/O port of the FADT's sleep control (and status) register: the
/// guest powers off by writing SLP_TYP 5 with SLP_EN set.
pub const SLEEP_PORT: u16 = 0x600;
/// The COM1 interrupt (ISA IRQ 4, the same GSI on the in-kernel IOAPIC).
pub const COM1_GSI: u32 = 4;

/// What the guest boots: the source reads both files; a destination
/// takes memory from the migration and reads neither.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LinuxGuest {
    /// The bzImage.
    pub kernel: PathBuf,
    /// The initramfs (a cpio archive, compressed or not).
    pub initrd: PathBuf,
    /// The kernel's command line.
    pub cmdline: String,
}

/// What a write to the sleep control register asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerRequest {
    /// S5: power off.
    Off,
    /// Another sleep state, or a reset: minivmm ends the guest either way.
    Other(u8),
}

/// Decodes a byte written to [`SLEEP_PORT`] (ACPI 6.5, 4.8.3.7): SLP_TYP
/// in bits 2-4, SLP_EN in bit 5. `None` without SLP_EN.
pub fn power_request(value: u8) -> Option<PowerRequest> {
    if value & 0x20 == 0 {
        return None;
    }
    match (value >> 2) & 7 {
        5 => Some(PowerRequest::Off),
        other => Some(PowerRequest::Other(other)),
    }
}

/// Refuses a host whose KVM runs guest code natively only at CPL3
/// (`kvm_pvm`, this project's own hosts): it emulates a kernel's every
/// instruction. The host says which it is by the KVM vendor module it
/// loaded.
pub fn check_host() -> Result<(), LinuxError> {
    let loaded = |m: &str| std::path::Path::new("/sys/module").join(m).exists();
    match loaded("kvm_pvm") && !loaded("kvm_intel") && !loaded("kvm_amd") {
        true => Err(LinuxError::Cpl3Host),
        false => Ok(()),
    }
}

/// Errors booting a Linux guest.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// The host's KVM is kvm_pvm.
    #[error("this host's KVM is kvm_pvm, which runs guest code natively only at CPL3: a Linux kernel would run in its instruction emulator. Run it on a VMX or SVM host, or inside this project's SVM host: scripts/svm-host.sh target/release/minivmm ...")]
    Cpl3Host,
    /// A file could not be read.
    #[error("cannot read the {what} {path}: {source}")]
    Read {
        /// The kernel or the initramfs.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// linux-loader refused the kernel.
    #[error("{path} is not a bzImage this VMM boots: {why}")]
    Kernel {
        /// Its path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The kernel lacks the 64-bit entry point.
    #[error("{0} has no 64-bit entry point (boot protocol 2.12 and XLF_KERNEL_64 needed)")]
    No64BitEntry(PathBuf),
    /// Memory too small for what must go in it.
    #[error("{what} does not fit in the guest's memory: {why}")]
    Fit {
        /// What.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// The command line.
    #[error("the kernel command line: {0}")]
    Cmdline(String),
    /// Guest memory refused a write.
    #[error("cannot write {what} into guest memory: {why}")]
    Memory {
        /// What.
        what: &'static str,
        /// Why.
        why: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_slp_en_with_s5_is_a_power_off() {
        assert_eq!(power_request(5 << 2 | 0x20), Some(PowerRequest::Off));
        assert_eq!(power_request(5 << 2), None);
        assert_eq!(power_request(3 << 2 | 0x20), Some(PowerRequest::Other(3)));
        assert_eq!(power_request(0), None);
    }
}
