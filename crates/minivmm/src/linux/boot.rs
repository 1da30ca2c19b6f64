//! Loading a bzImage and its initramfs, and the state vCPU 0 starts in
//! (the 64-bit boot protocol, Documentation/arch/x86/boot.rst): long mode,
//! the low 4 GiB identity-mapped, a flat GDT, interrupts off, `rsi` at
//! the zero page, `rip` at the kernel's 64-bit entry (its load address
//! plus 0x200).
//!
//! ```text
//!   0x0500       GDT: null, code64 (0x08), data (0x10)
//!   0x7000       zero page (struct boot_params)
//!   0x9000       PML4, 0xa000 PDPT, 0xb000-0xe000 four PDs of 2 MiB pages
//!   0x2_0000     command line
//!   0xe_0000     ACPI tables (acpi.rs), reserved in the e820 map
//!   32 MiB       the kernel (the start of minivmm's data region: the
//!                decompressor runs it from there, or moves it by KASLR)
//!   top of RAM   the initramfs
//! ```
//! The hole between minivmm's two regions is a hole in the e820 map too.

use super::{acpi, LinuxError, LinuxGuest};
use ferry_engine::vmm::{Gpa, GuestRam};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use linux_loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::bzimage::BzImage;
use linux_loader::loader::KernelLoader;
use vm_memory::{ByteValued, Bytes, GuestAddress};

const GDT: u64 = 0x500;
const ZERO_PAGE: u64 = 0x7000;
const PML4: u64 = 0x9000;
const PDPT: u64 = 0xa000;
const PD: u64 = 0xb000;
const CMDLINE: u64 = 0x2_0000;
const CMDLINE_MAX: usize = 4096;
/// Where conventional memory ends (the EBDA and BIOS area above it are
/// reserved, and hold the ACPI tables).
const LOW_RAM_END: u64 = 0x9_f000;
const HIGH_RAM: u64 = 0x10_0000;

const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
/// The boot loader's id: "undefined" (0xff), as the boot protocol asks of
/// loaders without an assigned one.
const LOADER_UNDEFINED: u8 = 0xff;
/// setup_header.xloadflags: the kernel has a 64-bit entry point.
const XLF_KERNEL_64: u16 = 1;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
/// Where the kernel goes: the start of minivmm's data region.
const KERNEL_GPA: u64 = crate::layout::DATA_GPA;

/// The zero page, as guest memory writes it.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
struct ZeroPage(boot_params);
// SAFETY: boot_params is plain old data (integers and arrays of them, no
// padding the kernel reads, no pointers): any byte pattern is a value.
unsafe impl ByteValued for ZeroPage {}

/// A RAM range of the guest: `(start, bytes)`.
pub type RamRange = (u64, u64);

/// Loads the kernel, the initramfs, the command line, the zero page, the
/// ACPI tables, page tables and GDT into `ram` (whose RAM is `ranges`,
/// ascending, the first from 0); returns the 64-bit entry point.
pub fn load(
    ram: &GuestRam,
    guest: &LinuxGuest,
    ranges: &[RamRange],
    vcpus: u32,
    devices: &[acpi::MmioDevice],
) -> Result<u64, LinuxError> {
    let mem = ram.memory();
    let read = |what, path: &std::path::Path| {
        std::fs::File::open(path).map_err(|source| LinuxError::Read {
            what,
            path: path.to_path_buf(),
            source,
        })
    };
    let mut kernel = read("kernel", &guest.kernel)?;
    let loaded =
        BzImage::load(mem, Some(GuestAddress(KERNEL_GPA)), &mut kernel, None).map_err(|e| {
            LinuxError::Kernel {
                path: guest.kernel.clone(),
                why: e.to_string(),
            }
        })?;
    let mut hdr = loaded.setup_header.ok_or_else(|| LinuxError::Kernel {
        path: guest.kernel.clone(),
        why: "no setup header".into(),
    })?;
    if hdr.version < 0x020c || hdr.xloadflags & XLF_KERNEL_64 == 0 {
        return Err(LinuxError::No64BitEntry(guest.kernel.clone()));
    }

    let initrd = std::fs::read(&guest.initrd).map_err(|source| LinuxError::Read {
        what: "initramfs",
        path: guest.initrd.clone(),
        source,
    })?;
    let &(top_start, top_len) = ranges.last().expect("RAM has ranges");
    let limit = (top_start + top_len).min(u64::from(hdr.initrd_addr_max) + 1);
    let initrd_gpa = limit
        .checked_sub(initrd.len() as u64)
        .map(|a| a & !0xfff)
        .filter(|&a| a >= loaded.kernel_end.max(top_start))
        .ok_or_else(|| LinuxError::Fit {
            what: "the initramfs",
            why: format!("{} bytes above the kernel, below {limit:#x}", initrd.len()),
        })?;
    write(ram, initrd_gpa, &initrd, "the initramfs")?;

    let cmdline_size = hdr.cmdline_size;
    if guest.cmdline.len() >= CMDLINE_MAX.min(cmdline_size as usize) {
        return Err(LinuxError::Cmdline(format!(
            "{} bytes, the kernel takes {cmdline_size}",
            guest.cmdline.len(),
        )));
    }
    let mut cmdline = guest.cmdline.clone().into_bytes();
    cmdline.push(0);
    write(ram, CMDLINE, &cmdline, "the command line")?;

    for (gpa, table) in acpi::tables(vcpus, devices) {
        write(ram, gpa, &table, "the ACPI tables")?;
    }

    hdr.type_of_loader = LOADER_UNDEFINED;
    hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    hdr.header = KERNEL_HDR_MAGIC;
    hdr.cmd_line_ptr = CMDLINE as u32;
    hdr.ramdisk_image = initrd_gpa as u32;
    hdr.ramdisk_size = initrd.len() as u32;
    let mut zero = ZeroPage::default();
    zero.0.hdr = hdr;
    zero.0.acpi_rsdp_addr = acpi::RSDP_GPA;
    let map = e820(ranges);
    zero.0.e820_entries = map.len() as u8;
    zero.0.e820_table[..map.len()].copy_from_slice(&map);
    mem.write_obj(zero, GuestAddress(ZERO_PAGE))
        .map_err(|e| LinuxError::Memory {
            what: "the zero page",
            why: e.to_string(),
        })?;

    write_page_tables(ram)?;
    let gdt: [u64; 3] = [0, CODE64, DATA];
    let gdt: Vec<u8> = gdt.iter().flat_map(|d| d.to_le_bytes()).collect();
    write(ram, GDT, &gdt, "the GDT")?;
    Ok(loaded.kernel_load.0 + 0x200)
}

/// The e820 map: conventional memory, the reserved BIOS area, then each
/// RAM range from 1 MiB up.
fn e820(ranges: &[RamRange]) -> Vec<boot_e820_entry> {
    let entry = |addr, size, r#type| boot_e820_entry { addr, size, r#type };
    let mut map = vec![
        entry(0, LOW_RAM_END, E820_RAM),
        entry(LOW_RAM_END, HIGH_RAM - LOW_RAM_END, E820_RESERVED),
    ];
    for &(start, len) in ranges {
        let start_at = start.max(HIGH_RAM);
        let end = start + len;
        if end > start_at {
            map.push(entry(start_at, end - start_at, E820_RAM));
        }
    }
    map
}

fn write(ram: &GuestRam, gpa: u64, data: &[u8], what: &'static str) -> Result<(), LinuxError> {
    ram.write_bytes(Gpa(gpa), data)
        .map_err(|e| LinuxError::Memory {
            what,
            why: e.to_string(),
        })
}

/// Present, writable; a 2 MiB page at the PD level.
const PRESENT_RW: u64 = 0x3;
const PAGE_2M: u64 = 0x80;

/// Identity-maps the low 4 GiB with 2 MiB pages.
fn write_page_tables(ram: &GuestRam) -> Result<(), LinuxError> {
    let mut tables = vec![0u8; (PD + 4 * 0x1000 - PML4) as usize];
    let mut put = |gpa: u64, value: u64| {
        let at = (gpa - PML4) as usize;
        tables[at..at + 8].copy_from_slice(&value.to_le_bytes());
    };
    put(PML4, PDPT | PRESENT_RW);
    for g in 0..4u64 {
        put(PDPT + g * 8, (PD + g * 0x1000) | PRESENT_RW);
        for i in 0..512u64 {
            let page = (g << 30) | (i << 21);
            put(PD + g * 0x1000 + i * 8, page | PRESENT_RW | PAGE_2M);
        }
    }
    write(ram, PML4, &tables, "the page tables")
}

/// A 64-bit code segment: present, DPL 0, execute/read, L.
const CODE64: u64 = 0x00af_9b00_0000_ffff;
/// A data segment: present, DPL 0, read/write, 4 GiB.
const DATA: u64 = 0x00cf_9300_0000_ffff;

fn segment(selector: u16, descriptor: u64) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: ((descriptor >> 40) & 0xf) as u8,
        present: 1,
        dpl: 0,
        db: ((descriptor >> 54) & 1) as u8,
        s: 1,
        l: ((descriptor >> 53) & 1) as u8,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// vCPU 0's system registers at the 64-bit entry (`base` from
/// KVM_GET_SREGS, so the rest keeps KVM's reset values).
pub fn sregs(mut s: kvm_sregs) -> kvm_sregs {
    s.cs = segment(0x08, CODE64);
    let data = segment(0x10, DATA);
    (s.ds, s.es, s.fs, s.gs, s.ss) = (data, data, data, data, data);
    s.gdt.base = GDT;
    s.gdt.limit = 3 * 8 - 1;
    s.idt.base = 0;
    s.idt.limit = 0;
    s.cr3 = PML4;
    s.cr4 |= CR4_PAE;
    s.cr0 |= CR0_PE | CR0_PG | CR0_ET;
    s.efer |= EFER_LME | EFER_LMA;
    s
}

/// vCPU 0's registers at the 64-bit entry `entry`: the zero page in
/// `rsi`, interrupts off.
pub fn regs(entry: u64) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsi: ZERO_PAGE,
        rflags: 0x2,
        rsp: 0x8000 - 0x10,
        ..Default::default()
    }
}

/// The LAPIC's LVT LINT0 and LINT1 registers.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const DELIVERY_EXTINT: u32 = 7 << 8;
const DELIVERY_NMI: u32 = 4 << 8;

/// Wires LINT0 to the PIC (ExtINT) and LINT1 to NMI, as firmware leaves a
/// PC's local APICs (the "virtual wire" mode Linux starts from).
pub fn set_lints(fd: &kvm_ioctls::VcpuFd) -> Result<(), kvm_ioctls::Error> {
    let mut lapic = fd.get_lapic()?;
    for (reg, mode) in [(APIC_LVT0, DELIVERY_EXTINT), (APIC_LVT1, DELIVERY_NMI)] {
        let bytes: [u8; 4] = std::array::from_fn(|i| lapic.regs[reg + i] as u8);
        let value = (u32::from_le_bytes(bytes) & !0x700) | mode;
        for (i, b) in value.to_le_bytes().into_iter().enumerate() {
            lapic.regs[reg + i] = b as _;
        }
    }
    fd.set_lapic(&lapic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_e820_map_keeps_the_bios_area_and_the_hole_out() {
        let map = e820(&[(0, 16 << 20), (32 << 20, 256 << 20)]);
        let got: Vec<_> = map.iter().map(|e| (e.addr, e.size, e.r#type)).collect();
        assert_eq!(
            got,
            [
                (0, LOW_RAM_END, E820_RAM),
                (LOW_RAM_END, HIGH_RAM - LOW_RAM_END, E820_RESERVED),
                (HIGH_RAM, (16 << 20) - HIGH_RAM, E820_RAM),
                (32 << 20, 256 << 20, E820_RAM),
            ]
        );
    }
}
