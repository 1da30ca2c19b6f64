//! The machine state the guest starts in: 64-bit mode at CPL3 with the low
//! 4 GiB identity-mapped by 2 MiB pages (user-accessible, so the MMIO device
//! is reachable too), a GDT with ring-3 segments, and a TSS whose I/O
//! bitmap opens the serial ports (COM4 to COM1) and nothing else.
//! ferry-kvm's [`Cpl3Image`] writes them; this file says where they go,
//! and tells each vCPU, in its lane, which port, device and data slice are
//! its own.

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
    open_ports: SERIAL_PORTS,
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
    /// More vCPUs than lanes, or fewer data pages than vCPUs.
    #[error("{vcpus} vCPUs over {data_pages} data pages: minivmm runs 1 to {MAX_VCPUS} vCPUs, each sweeping at least one page")]
    Shape {
        /// vCPUs asked for.
        vcpus: u32,
        /// Pages of the data region.
        data_pages: u64,
    },
}

/// Writes the page tables, GDT and TSS into `ram`, for a program of one's
/// own.
pub fn write_image(ram: &GuestRam) -> Result<(), BootError> {
    IMAGE
        .write(ram)
        .map_err(|e| BootError::Memory(e.to_string()))
}

/// Writes page tables, GDT, TSS and the program into `ram`, and each of
/// `vcpus` lanes what its vCPU drives: its port, its device, and an equal
/// slice of the `data_pages`; vCPU 0 drives the fill device too, if `fill`.
pub fn load(
    ram: &GuestRam,
    params: GuestParams,
    vcpus: u32,
    data_pages: u64,
    fill: bool,
) -> Result<(), BootError> {
    if !(1..=MAX_VCPUS).contains(&vcpus) || data_pages < u64::from(vcpus) {
        return Err(BootError::Shape { vcpus, data_pages });
    }
    let mem = |e: ferry_engine::vmm::RamError| BootError::Memory(e.to_string());
    write_image(ram)?;
    let code = guest::program(params)?;
    ram.write_bytes(Gpa(CODE), &code).map_err(mem)?;
    let slice = data_pages / u64::from(vcpus);
    for i in 0..vcpus {
        let vars = lane(i) + VARS;
        for (off, value) in [
            (var::PORT, u64::from(serial_port(i))),
            (var::MMIO, mmio_base(i)),
            (var::SWEEP_BASE, u64::from(i) * slice),
            (var::SWEEP_PAGES, slice),
        ] {
            ram.store_u64(Gpa(vars + off), value).map_err(mem)?;
        }
    }
    if fill {
        let at = Gpa(lane(0) + VARS + var::FILL_MMIO);
        ram.store_u64(at, mmio_base(crate::fill::MMIO_INDEX))
            .map_err(mem)?;
    }
    Ok(())
}

/// Long mode, paging, CPL3 (`base` is what KVM_GET_SREGS gave, so the
/// rest keeps KVM's defaults).
pub fn sregs(base: kvm_sregs) -> kvm_sregs {
    IMAGE.sregs(base)
}

/// vCPU `i` at the program's entry, its lane in `rdi`; IOPL 3 as well as
/// the bitmap, as this host wants.
pub fn regs(i: u32) -> kvm_regs {
    Cpl3Image::regs(Gpa(CODE), lane(i))
}
