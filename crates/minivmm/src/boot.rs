//! The machine state the guest starts in: 64-bit mode at CPL3 with the
//! low 4 GiB identity-mapped by 2 MiB pages (user-accessible, so the MMIO
//! device is reachable too), a GDT with ring-3 segments, and a TSS whose
//! I/O bitmap opens the serial port's eight ports and nothing else.

use crate::guest::{self, GuestParams};
use crate::layout::*;
use ferry_engine::vmm::{Gpa, GuestRam};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

/// Present, writable, user: every level needs the user bit for CPL3.
const TABLE: u64 = 0b111;
/// A 2 MiB page.
const HUGE: u64 = 1 << 7;
/// The I/O bitmap covers ports 0..=0x3ff.
const IOMAP_BYTES: u64 = 0x400 / 8;
/// Where the bitmap starts in the TSS (right after the 0x68-byte TSS).
const IOMAP_OFFSET: u64 = 0x68;
const TSS_SELECTOR: u16 = 0x10;
const DATA_SELECTOR: u16 = 0x2b;
const CODE_SELECTOR: u16 = 0x33;
const GDT_ENTRIES: u64 = 8;

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
    let store = |gpa: u64, v: u64| ram.store_u64(Gpa(gpa), v).map_err(mem);
    store(PML4, PDPT | TABLE)?;
    for gib in 0..4u64 {
        let pd = PD + gib * 0x1000;
        store(PDPT + gib * 8, pd | TABLE)?;
        for e in 0..512u64 {
            store(pd + e * 8, ((gib << 30) + (e << 21)) | TABLE | HUGE)?;
        }
    }
    let base = TSS;
    let limit = IOMAP_OFFSET + IOMAP_BYTES;
    let mut gdt = [0u64; GDT_ENTRIES as usize];
    gdt[2] = limit | ((base & 0xff_ffff) << 16) | (0x89 << 40) | (((base >> 24) & 0xff) << 56);
    gdt[3] = base >> 32;
    gdt[5] = 0x00cf_f200_0000_ffff; // data, DPL3
    gdt[6] = 0x00af_fa00_0000_ffff; // code, DPL3, 64-bit
    for (i, e) in gdt.iter().enumerate() {
        store(GDT + i as u64 * 8, *e)?;
    }
    // The I/O bitmap: every port closed but the serial port's eight.
    store(TSS + 0x60, IOMAP_OFFSET << 48)?;
    let mut bitmap = vec![0xffu8; IOMAP_BYTES as usize + 1];
    bitmap[usize::from(SERIAL_PORT / 8)] = 0;
    ram.write_bytes(Gpa(TSS + IOMAP_OFFSET), &bitmap)
        .map_err(mem)?;
    let code = guest::program(params)?;
    ram.write_bytes(Gpa(CODE), &code).map_err(mem)?;
    Ok(())
}

fn segment(selector: u16, type_: u8, long: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 3,
        db: u8::from(!long),
        s: 1,
        l: u8::from(long),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Long mode, paging, CPL3 (`base` is what KVM_GET_SREGS gave, so the
/// rest keeps KVM's defaults).
pub fn sregs(mut base: kvm_sregs) -> kvm_sregs {
    base.cr0 = 0x8005_0033; // PE MP ET NE WP AM PG
    base.cr3 = PML4;
    base.cr4 = 0x20; // PAE
    base.efer = 0xd01; // SCE LME LMA NXE
    base.cs = segment(CODE_SELECTOR, 11, true);
    let data = segment(DATA_SELECTOR, 3, false);
    (base.ss, base.ds, base.es) = (data, data, data);
    let null = kvm_segment {
        selector: 0,
        ..data
    };
    (base.fs, base.gs) = (null, null);
    base.tr = kvm_segment {
        base: TSS,
        limit: (IOMAP_OFFSET + IOMAP_BYTES) as u32,
        selector: TSS_SELECTOR,
        type_: 11,
        present: 1,
        ..Default::default()
    };
    base.gdt.base = GDT;
    base.gdt.limit = (GDT_ENTRIES * 8 - 1) as u16;
    base.idt.base = 0;
    base.idt.limit = 0;
    base
}

/// The program's entry; IOPL 3 as well as the bitmap, as this host wants.
pub fn regs() -> kvm_regs {
    kvm_regs {
        rip: CODE,
        rflags: 0x3202,
        ..Default::default()
    }
}
