//! The machine state the guest starts in: 64-bit mode at CPL3 with the low
//! 4 GiB identity-mapped by 2 MiB pages (user-accessible, so the MMIO device
//! is reachable too), a GDT with ring-3 segments, and a TSS whose I/O
//! bitmap opens the serial port's eight ports and nothing else. ferry-kvm's
//! [`Cpl3Image`] writes them; this file says where they go.

use crate::guest::{self, GuestParams};
use crate::layout::*;
use ferry_engine::vmm::{Gpa, GuestRam};
use ferry_kvm::boot::Cpl3Image;
use kvm_bindings::{kvm_regs, kvm_sregs};

/// The boot tables' places in region 0, and the ports they open.
const IMAGE: Cpl3Image = Cpl3Image {
    pml4: Gpa(PML4),
    pdpt: Gpa(PDPT),
    pd: Gpa(PD),
    gdt: Gpa(GDT),
    tss: Gpa(TSS),
    mapped_bytes: 4 << 30,
    bitmap_ports: 0x400,
    open_ports: SERIAL_PORT..SERIAL_PORT + 8,
};

/// Errors writing the boot image.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The program did not assemble.
    #[error(transparent)]
    Guest(#[from] guest::GuestError),
    /// Guest memory refused a write.
    #[error("cannot write the boot image into guest memory: {0}")]
    Memory(String),
}

/// Writes page tables, GDT, TSS and the program into `ram`.
pub fn load(ram: &GuestRam, params: GuestParams) -> Result<(), BootError> {
    let mem = |e: ferry_engine::vmm::RamError| BootError::Memory(e.to_string());
    IMAGE.write(ram).map_err(mem)?;
    let code = guest::program(params)?;
    ram.write_bytes(Gpa(CODE), &code).map_err(mem)?;
    Ok(())
}

/// Long mode, paging, CPL3 (`base` is what KVM_GET_SREGS gave, so the
/// rest keeps KVM's defaults).
pub fn sregs(base: kvm_sregs) -> kvm_sregs {
    IMAGE.sregs(base)
}

/// The program's entry; IOPL 3 as well as the bitmap, as this host wants.
pub fn regs() -> kvm_regs {
    Cpl3Image::regs(Gpa(CODE), 0)
}
