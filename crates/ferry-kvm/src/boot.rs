//! The boot state of a guest that runs natively at CPL3: identity page
//! tables of 2 MiB pages, a GDT with ring-3 segments and a TSS whose I/O
//! bitmap opens only the ports the guest may use, and the registers that
//! enter it in 64-bit mode.
//!
//! Why CPL3: on this project's hosts KVM is `kvm_pvm` (shadow paging,
//! nested), and guest code at CPL0 is run instruction by instruction by
//! KVM's emulator, far slower (docs/svm-host.md, "What differs from
//! kvm_pvm"). At CPL3 it runs natively, and the same setup is valid on
//! ordinary VMX/SVM hosts. The register values follow
//! `shared/notes/kvm-host-probe.md` ("Register setup that runs guest code
//! natively here"): CR0 0x80050033, CR4 PAE, EFER SCE|LME|LMA|NXE, CS 0x33
//! (64-bit code, DPL3), SS/DS/ES 0x2b (data, DPL3), RFLAGS 0x3202 (IOPL 3).
//!
//! Both of ferry's guests boot this way: the memstress VM and `minivmm`.
//! Each says where the tables go; [`Cpl3Image`] writes them.

use ferry_vm::{Gpa, GuestRam, RamError};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use std::ops::Range;

/// Present, writable, user: every paging level needs U/S, or CPL3 faults.
const TABLE: u64 = 0b111;
/// A 2 MiB page.
const HUGE: u64 = 1 << 7;
const GIB: u64 = 1 << 30;
const MIB2: u64 = 2 << 20;
/// Where the I/O bitmap starts in the TSS (right after the 0x68-byte TSS).
const IOMAP_OFFSET: u64 = 0x68;
/// Selector of the TSS descriptor (GDT entries 2 and 3).
const TSS_SELECTOR: u16 = 0x10;
/// Ring-3 data selector (GDT entry 5, RPL 3).
const DATA_SELECTOR: u16 = 0x2b;
/// Ring-3 64-bit code selector (GDT entry 6, RPL 3).
pub const CODE_SELECTOR: u16 = 0x33;
const GDT_ENTRIES: u64 = 8;
/// RFLAGS at entry: IF, IOPL 3 and the reserved bit. IOPL 3 and the bitmap
/// are both set, because IOPL alone is not enough on every host.
const RFLAGS: u64 = 0x3202;

/// Where a guest's boot tables live in its memory, and what they allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cpl3Image {
    /// The PML4 page; its entry 0 points at `pdpt`.
    pub pml4: Gpa,
    /// The PDPT page, one entry per GiB mapped.
    pub pdpt: Gpa,
    /// The first page directory; one page per GiB follows it.
    pub pd: Gpa,
    /// The GDT (eight entries).
    pub gdt: Gpa,
    /// The TSS, followed by its I/O permission bitmap.
    pub tss: Gpa,
    /// Bytes identity-mapped from address 0 (rounded up to 2 MiB).
    pub mapped_bytes: u64,
    /// Ports the I/O bitmap covers, from 0; a multiple of 8. Ports past it
    /// fault.
    pub bitmap_ports: u16,
    /// The ports the guest may use from CPL3; every other port faults.
    pub open_ports: Range<u16>,
}

impl Cpl3Image {
    fn bitmap_bytes(&self) -> u64 {
        u64::from(self.bitmap_ports / 8)
    }

    /// The TSS limit: the TSS, the bitmap and its 0xff terminator byte.
    fn tss_limit(&self) -> u64 {
        IOMAP_OFFSET + self.bitmap_bytes()
    }

    /// Writes the page tables, the GDT and the TSS with its bitmap.
    pub fn write(&self, ram: &GuestRam) -> Result<(), RamError> {
        self.write_page_tables(ram)?;
        self.write_gdt_and_tss(ram)
    }

    fn write_page_tables(&self, ram: &GuestRam) -> Result<(), RamError> {
        ram.store_u64(self.pml4, self.pdpt.0 | TABLE)?;
        for g in 0..self.mapped_bytes.div_ceil(GIB) {
            let pd = self.pd.0 + g * 4096;
            ram.store_u64(self.pdpt.add(g * 8), pd | TABLE)?;
            for e in 0..512u64 {
                let addr = g * GIB + e * MIB2;
                if addr >= self.mapped_bytes {
                    break;
                }
                ram.store_u64(Gpa(pd + e * 8), addr | TABLE | HUGE)?;
            }
        }
        Ok(())
    }

    fn write_gdt_and_tss(&self, ram: &GuestRam) -> Result<(), RamError> {
        let mut gdt = [0u64; GDT_ENTRIES as usize];
        // 64-bit TSS descriptor (type 9 = available; KVM marks it busy
        // when loaded).
        let (base, limit) = (self.tss.0, self.tss_limit());
        gdt[2] = limit | ((base & 0xff_ffff) << 16) | (0x89 << 40) | (((base >> 24) & 0xff) << 56);
        gdt[3] = base >> 32;
        gdt[5] = 0x00cf_f200_0000_ffff; // data, DPL3, writable
        gdt[6] = 0x00af_fa00_0000_ffff; // code, DPL3, long mode
        for (i, e) in gdt.iter().enumerate() {
            ram.store_u64(self.gdt.add(i as u64 * 8), *e)?;
        }
        ram.store_u64(self.tss.add(0x60), IOMAP_OFFSET << 48)?;
        let mut bitmap = vec![0xffu8; self.bitmap_bytes() as usize + 1];
        for port in self.open_ports.clone() {
            let port = usize::from(port);
            if port / 8 < bitmap.len() - 1 {
                bitmap[port / 8] &= !(1 << (port % 8));
            }
        }
        ram.write_bytes(self.tss.add(IOMAP_OFFSET), &bitmap)
    }

    /// Long mode, paging, CPL3. `base` is what `KVM_GET_SREGS` returned,
    /// so fields set here leave the rest at KVM's defaults.
    pub fn sregs(&self, mut base: kvm_sregs) -> kvm_sregs {
        base.cr0 = 0x8005_0033; // PE MP ET NE WP AM PG
        base.cr3 = self.pml4.0;
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
            base: self.tss.0,
            limit: self.tss_limit() as u32,
            selector: TSS_SELECTOR,
            type_: 11,
            present: 1,
            ..Default::default()
        };
        base.gdt.base = self.gdt.0;
        base.gdt.limit = (GDT_ENTRIES * 8 - 1) as u16;
        base.idt.base = 0;
        base.idt.limit = 0;
        base
    }

    /// The general registers entering the program at `entry`, with its one
    /// argument in `rdi`.
    pub fn regs(entry: Gpa, rdi: u64) -> kvm_regs {
        kvm_regs {
            rip: entry.0,
            rdi,
            rflags: RFLAGS,
            ..Default::default()
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_vm::Backing;

    fn image(mapped_bytes: u64) -> Cpl3Image {
        Cpl3Image {
            pml4: Gpa(0x1000),
            pdpt: Gpa(0x2000),
            pd: Gpa(0x4000),
            gdt: Gpa(0x8000),
            tss: Gpa(0x9000),
            mapped_bytes,
            bitmap_ports: 0x400,
            open_ports: 0x3f8..0x400,
        }
    }

    #[test]
    fn maps_every_page_onto_itself_with_the_user_bit() {
        let ram = GuestRam::new(&[8 << 20], Backing::Anonymous).unwrap();
        let img = image(6 << 20);
        img.write(&ram).unwrap();
        assert_eq!(ram.load_u64(img.pml4).unwrap(), 0x2000 | TABLE);
        let pd = ram.load_u64(img.pdpt).unwrap() & !0xfff;
        for e in 0..3u64 {
            let pde = ram.load_u64(Gpa(pd + e * 8)).unwrap();
            assert_eq!(pde, (e * MIB2) | 0x87);
        }
        // Nothing past the mapped bytes.
        assert_eq!(ram.load_u64(Gpa(pd + 3 * 8)).unwrap(), 0);
    }

    #[test]
    fn the_bitmap_opens_only_the_named_ports() {
        let ram = GuestRam::new(&[8 << 20], Backing::Anonymous).unwrap();
        let img = image(2 << 20);
        img.write(&ram).unwrap();
        let mut page = vec![0u8; 4096];
        ram.read_pages(img.tss.gfn(), &mut page).unwrap();
        let bitmap = &page[IOMAP_OFFSET as usize..][..0x81];
        assert_eq!(bitmap[0x3f8 / 8], 0, "the eight serial ports are open");
        assert!(bitmap[..0x3f8 / 8].iter().all(|b| *b == 0xff));
        assert_eq!(bitmap[0x80], 0xff, "the terminator");
        let sregs = img.sregs(kvm_sregs::default());
        assert_eq!(sregs.tr.limit, 0x68 + 0x80);
        assert_eq!(sregs.cs.dpl, 3);
    }
}
