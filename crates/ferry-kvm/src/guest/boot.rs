//! Boot state for the memstress guest: identity page tables, a GDT with ring-3
//! segments and a TSS, and the registers each vCPU starts with.
//!
//! Register values follow `shared/notes/kvm-host-probe.md` ("Register setup that
//! runs guest code natively here"): CR0 0x80050033, CR4 PAE, EFER SCE|LME|LMA|NXE,
//! CS 0x33 (64-bit code, DPL3), SS/DS/ES 0x2b (data, DPL3), RFLAGS 0x3202 (IOPL 3).

use ferry_backend::{Gpa, GuestRam, RamError};
use ferry_memstress::{self as memstress, MemoryLayout, Workload, SLEEP_PORT};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

const PTE_PRESENT: u64 = 1 << 0;
const PTE_WRITE: u64 = 1 << 1;
/// Every level needs U/S, or CPL3 accesses fault.
const PTE_USER: u64 = 1 << 2;
const PTE_HUGE: u64 = 1 << 7;
const TABLE: u64 = PTE_PRESENT | PTE_WRITE | PTE_USER;
const GIB: u64 = 1 << 30;
const MIB2: u64 = 2 << 20;

/// Guest-physical address of the TSS (the page between the PDPT and the params).
pub const TSS_GPA: Gpa = Gpa(0x3000);
/// Offset of the I/O permission bitmap in the TSS (right after the TSS proper).
const TSS_IOMAP_OFFSET: u64 = 0x68;
/// Bitmap bytes: ports 0..=255, which covers SLEEP_PORT.
const IOMAP_BYTES: usize = 32;
/// TSS limit: the TSS, the bitmap and its 0xff terminator byte.
const TSS_LIMIT: u64 = TSS_IOMAP_OFFSET + IOMAP_BYTES as u64;
/// Selector of the TSS descriptor (GDT entries 2 and 3).
const TSS_SELECTOR: u16 = 0x10;
/// Ring-3 data selector (GDT entry 5, RPL 3).
const DATA_SELECTOR: u16 = 0x2b;
/// Ring-3 64-bit code selector (GDT entry 6, RPL 3).
const CODE_SELECTOR: u16 = 0x33;
const GDT_ENTRIES: usize = 8;

/// Which guest program the vCPUs run.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Program {
    /// The memstress workload with its stamp checks.
    #[default]
    Memstress,
    /// The probe's bare write loop, for calibrating fault costs.
    RawWrites,
}

/// Writes page tables, GDT, TSS, code and parameters for `workload` into `ram`.
pub fn load_guest(
    ram: &GuestRam,
    workload: &Workload,
    tsc_khz: u64,
    program: Program,
) -> Result<(), BootError> {
    let layout = MemoryLayout::for_workload(workload);
    write_page_tables(ram, layout.total_bytes())?;
    write_gdt_and_tss(ram)?;
    let code = match program {
        Program::Memstress => super::code::memstress(memstress::CODE_GPA.0)?,
        Program::RawWrites => super::code::raw_writes(memstress::CODE_GPA.0)?,
    };
    if code.len() > memstress::CODE_MAX {
        return Err(BootError::CodeTooLarge(code.len()));
    }
    ram.write_bytes(memstress::CODE_GPA, &code)?;
    memstress::write_params(ram, workload, tsc_khz)?;
    Ok(())
}

/// Errors building the boot state.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// Writing guest RAM failed.
    #[error("cannot write the guest image")]
    Ram(#[from] RamError),
    /// The generated code could not be assembled.
    #[error(transparent)]
    Code(#[from] super::code::CodeError),
    /// The generated code outgrew its area.
    #[error("generated guest code is {0} bytes, over the code area")]
    CodeTooLarge(usize),
}

/// Identity-maps `[0, bytes)` with 2 MiB pages: PML4[0] -> PDPT -> one PD per GiB.
fn write_page_tables(ram: &GuestRam, bytes: u64) -> Result<(), RamError> {
    let pml4e = memstress::PDPT_GPA.0 | TABLE;
    ram.store_u64(memstress::PML4_GPA, pml4e)?;
    let gibs = bytes.div_ceil(GIB);
    for g in 0..gibs {
        let pd = memstress::PD_GPA.0 + g * 4096;
        ram.store_u64(memstress::PDPT_GPA.add(g * 8), pd | TABLE)?;
        for e in 0..512u64 {
            let addr = g * GIB + e * MIB2;
            if addr >= bytes {
                break;
            }
            ram.store_u64(Gpa(pd + e * 8), addr | TABLE | PTE_HUGE)?;
        }
    }
    Ok(())
}

fn write_gdt_and_tss(ram: &GuestRam) -> Result<(), RamError> {
    let mut gdt = [0u64; GDT_ENTRIES];
    // 64-bit TSS descriptor (type 9 = available; KVM marks it busy when loaded).
    let base = TSS_GPA.0;
    let limit = TSS_LIMIT;
    gdt[2] = limit | ((base & 0xff_ffff) << 16) | (0x89 << 40) | (((base >> 24) & 0xff) << 56);
    gdt[3] = base >> 32;
    gdt[5] = 0x00cf_f200_0000_ffff; // data, DPL3, writable
    gdt[6] = 0x00af_fa00_0000_ffff; // code, DPL3, long mode
    for (i, e) in gdt.iter().enumerate() {
        ram.store_u64(memstress::GDT_GPA.add(i as u64 * 8), *e)?;
    }
    // TSS I/O permission bitmap right after the 0x68-byte TSS: every port
    // denied but SLEEP_PORT, the guest's one sleep request. IOPL 3 alone is
    // not enough on every host (see the probe note), so both are set.
    ram.store_u64(TSS_GPA.add(0x60), TSS_IOMAP_OFFSET << 48)?;
    let mut bitmap = [0xffu8; IOMAP_BYTES + 1];
    let port = usize::from(SLEEP_PORT);
    bitmap[port / 8] &= !(1 << (port % 8));
    ram.write_bytes(TSS_GPA.add(TSS_IOMAP_OFFSET), &bitmap)?;
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

/// The special registers of a vCPU entering the memstress loop at CPL3.
/// `base` is what `KVM_GET_SREGS` returned, so fields ferry does not set keep
/// KVM's defaults.
pub fn initial_sregs(mut base: kvm_sregs) -> kvm_sregs {
    base.cr0 = 0x8005_0033;
    base.cr3 = memstress::PML4_GPA.0;
    base.cr4 = 0x20;
    base.efer = 0xd01;
    base.cs = segment(CODE_SELECTOR, 11, true);
    let data = segment(DATA_SELECTOR, 3, false);
    base.ss = data;
    base.ds = data;
    base.es = data;
    base.fs = kvm_segment {
        selector: 0,
        ..data
    };
    base.gs = kvm_segment {
        selector: 0,
        ..data
    };
    base.tr = kvm_segment {
        base: TSS_GPA.0,
        limit: TSS_LIMIT as u32,
        selector: TSS_SELECTOR,
        type_: 11,
        present: 1,
        dpl: 0,
        db: 0,
        s: 0,
        l: 0,
        g: 0,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    base.gdt.base = memstress::GDT_GPA.0;
    base.gdt.limit = (GDT_ENTRIES * 8 - 1) as u16;
    base.idt.base = 0;
    base.idt.limit = 0;
    base
}

/// The general registers of vCPU `vcpu` at entry.
pub fn initial_regs(vcpu: u32) -> kvm_regs {
    kvm_regs {
        rip: memstress::CODE_GPA.0,
        rdi: MemoryLayout::params_gpa(vcpu).0,
        rflags: 0x3202,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_backend::Backing;

    #[test]
    fn page_tables_identity_map_with_user_bit() {
        let w = Workload {
            vcpus: 1,
            bytes_per_vcpu: 4 << 20,
            ..Workload::default()
        };
        let layout = MemoryLayout::for_workload(&w);
        let ram = GuestRam::new(&layout.slot_sizes(), Backing::Anonymous).unwrap();
        load_guest(&ram, &w, 1_000_000, Program::Memstress).unwrap();
        let pml4e = ram.load_u64(memstress::PML4_GPA).unwrap();
        assert_eq!(pml4e & 7, 7);
        let pdpte = ram.load_u64(Gpa(pml4e & !0xfff)).unwrap();
        let pd = pdpte & !0xfff;
        // The region of vCPU 0 is mapped onto itself.
        let region = layout.region_gpa(0).0;
        let pde = ram.load_u64(Gpa(pd + (region / MIB2) * 8)).unwrap();
        assert_eq!(pde & !0xfff, region);
        assert_eq!(pde & 0x87, 0x87);
    }
}
