//! The ACPI tables a Linux guest finds its machine in, built with rust-vmm's
//! `acpi_tables`: RSDP → XSDT → {FADT → DSDT, MADT}, in the legacy BIOS
//! area below 1 MiB (reserved in the e820 map; the zero page points at the
//! RSDP as well).
//!
//! - The FADT declares a hardware-reduced platform: no PM timer, no SCI,
//!   no 8042, no VGA and no CMOS clock (kvmclock gives the time), and a
//!   sleep control register at [`super::SLEEP_PORT`], the one way the
//!   guest powers off.
//! - The MADT lists one LAPIC per vCPU and KVM's IOAPIC; ISA IRQs map to
//!   IOAPIC pins one to one (no overrides), as KVM routes them.
//! - The DSDT names COM1 (`PNP0501`, IRQ 4): with no legacy PIC, Linux
//!   maps an ISA interrupt only where ACPI describes its device.
//! - The DSDT names each virtio-mmio disk as an `LNRO0005` device with its
//!   registers and edge-triggered GSI (Debian's kernel builds virtio-mmio
//!   without command-line devices, so ACPI is how it finds them), and `_S5`.

use acpi_tables::aml;
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::{Aml, AmlSink};

/// Where the RSDP goes; the other tables follow it.
pub const RSDP_GPA: u64 = 0xe_0000;
/// The end of the area the tables may fill.
pub const TABLES_END: u64 = 0x10_0000;
/// COM1's ports.
const COM1_PORT: u16 = 0x3f8;
/// The local APICs' base.
const LAPIC_GPA: u32 = 0xfee0_0000;
/// KVM's IOAPIC.
const IOAPIC_GPA: u32 = 0xfec0_0000;
const OEM_ID: [u8; 6] = *b"FERRY ";
const OEM_TABLE: [u8; 8] = *b"MINIVMM ";
/// IAPC_BOOT_ARCH: VGA not present (bit 2), CMOS RTC not present (bit 5);
/// the 8042 bit (1) stays clear, so Linux probes no keyboard controller.
const BOOT_ARCH: u16 = 1 << 2 | 1 << 5;
/// MADT flags: PCAT_COMPAT, dual 8259s present (KVM's PIC).
const PCAT_COMPAT: u32 = 1;

/// A virtio-mmio device as the DSDT describes it.
#[derive(Clone, Copy, Debug)]
pub struct MmioDevice {
    /// Its registers (4 KiB).
    pub base: u64,
    /// Its GSI.
    pub gsi: u32,
}

/// The tables for `vcpus` vCPUs and these devices: each `(gpa, bytes)`,
/// the RSDP first.
pub fn tables(vcpus: u32, devices: &[MmioDevice]) -> Vec<(u64, Vec<u8>)> {
    let dsdt = dsdt(devices);
    let madt = madt(vcpus);
    let mut at = align(RSDP_GPA + Rsdp::len() as u64);
    let mut place = |len: usize| {
        let here = at;
        at = align(at + len as u64);
        here
    };
    let dsdt_gpa = place(dsdt.len());
    let madt_gpa = place(madt.len());
    let fadt = fadt(dsdt_gpa);
    let fadt_gpa = place(fadt.len());
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE, 1);
    xsdt.add_entry(fadt_gpa);
    xsdt.add_entry(madt_gpa);
    let xsdt = bytes(&xsdt);
    let xsdt_gpa = place(xsdt.len());
    let rsdp = bytes(&Rsdp::new(OEM_ID, xsdt_gpa));
    vec![
        (RSDP_GPA, rsdp),
        (dsdt_gpa, dsdt),
        (madt_gpa, madt),
        (fadt_gpa, fadt),
        (xsdt_gpa, xsdt),
    ]
}

fn align(gpa: u64) -> u64 {
    gpa.next_multiple_of(16)
}

/// Any table or AML object as bytes.
fn bytes(aml: &dyn Aml) -> Vec<u8> {
    struct Sink(Vec<u8>);
    impl AmlSink for Sink {
        fn byte(&mut self, byte: u8) {
            self.0.push(byte);
        }
    }
    let mut sink = Sink(Vec::new());
    aml.to_aml_bytes(&mut sink);
    sink.0
}

/// Sets a table's checksum byte (offset 9) so its bytes sum to 0.
fn fix_checksum(table: &mut [u8]) {
    table[9] = 0;
    let sum = table.iter().fold(0u8, |a, b| a.wrapping_add(*b));
    table[9] = 0u8.wrapping_sub(sum);
}

fn fadt(dsdt_gpa: u64) -> Vec<u8> {
    let io_byte = GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        u64::from(super::SLEEP_PORT),
    );
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE, 1)
        .dsdt_64(dsdt_gpa)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    fadt.iapc_boot_arch = BOOT_ARCH.into();
    fadt.sleep_control_reg = io_byte;
    fadt.sleep_status_reg = io_byte;
    bytes(&fadt.finalize())
}

fn madt(vcpus: u32) -> Vec<u8> {
    let mut madt = MADT::new(
        OEM_ID,
        OEM_TABLE,
        1,
        LocalInterruptController::Address(LAPIC_GPA),
    );
    for i in 0..vcpus {
        let id = i as u8;
        madt.add_structure(ProcessorLocalApic::new(id, id, EnabledStatus::Enabled));
    }
    madt.add_structure(IoApic::new(vcpus as u8, IOAPIC_GPA, 0));
    let mut table = bytes(&madt);
    // The crate leaves the flags 0; Linux wants PCAT_COMPAT with KVM's PIC.
    table[40..44].copy_from_slice(&PCAT_COMPAT.to_le_bytes());
    fix_checksum(&mut table);
    table
}

fn dsdt(devices: &[MmioDevice]) -> Vec<u8> {
    let mut body = Vec::new();
    // COM1, so that Linux maps its IRQ: a hardware-reduced platform has no
    // legacy PIC, so ISA IRQs exist only where ACPI names them.
    let io = aml::IO::new(COM1_PORT, COM1_PORT, 1, 8);
    let irq = aml::Interrupt::new(true, true, false, false, super::COM1_GSI);
    let crs = aml::ResourceTemplate::new(vec![&io, &irq]);
    let hid = aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0501"));
    let uid = aml::Name::new("_UID".into(), &0u32);
    let crs = aml::Name::new("_CRS".into(), &crs);
    body.extend(bytes(&aml::Device::new(
        "_SB_.COM1".into(),
        vec![&hid, &uid, &crs],
    )));
    for (i, d) in devices.iter().enumerate() {
        let name = format!("_SB_.VR{i:02X}");
        let mem = aml::Memory32Fixed::new(true, d.base as u32, 0x1000);
        let irq = aml::Interrupt::new(true, true, false, false, d.gsi);
        let crs = aml::ResourceTemplate::new(vec![&mem, &irq]);
        let hid = aml::Name::new("_HID".into(), &"LNRO0005");
        let uid = aml::Name::new("_UID".into(), &(i as u32));
        let crs = aml::Name::new("_CRS".into(), &crs);
        let device = aml::Device::new(name.as_str().into(), vec![&hid, &uid, &crs]);
        body.extend(bytes(&device));
    }
    // \_S5: the value the guest writes as SLP_TYP to power off.
    let five = 5u8;
    let s5 = aml::Package::new(vec![&five]);
    body.extend(bytes(&aml::Name::new("_S5_".into(), &s5)));
    let mut dsdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE, 1);
    dsdt.append_slice(&body);
    dsdt.as_slice().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums_to_zero(b: &[u8]) -> bool {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x)) == 0
    }

    #[test]
    fn every_table_checks_and_the_rsdp_leads_to_the_others() {
        let devs = [MmioDevice {
            base: 0xd000_0000,
            gsi: 16,
        }];
        let t = tables(2, &devs);
        assert_eq!(t[0].0, RSDP_GPA);
        assert_eq!(&t[0].1[..8], b"RSD PTR ");
        assert!(sums_to_zero(&t[0].1[..20]) && sums_to_zero(&t[0].1));
        for (gpa, b) in &t[1..] {
            assert!(sums_to_zero(b), "table at {gpa:#x}");
            let len = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
            assert_eq!(len, b.len(), "{:?}", std::str::from_utf8(&b[..4]));
            assert!(gpa + b.len() as u64 <= TABLES_END);
        }
        let sig = |s: &[u8]| t.iter().find(|(_, b)| &b[..4] == s).unwrap();
        let xsdt_gpa = u64::from_le_bytes(t[0].1[24..32].try_into().unwrap());
        assert_eq!(sig(b"XSDT").0, xsdt_gpa);
        // The MADT: 2 LAPICs (8 bytes each) and an IOAPIC (12) after 44.
        assert_eq!(sig(b"APIC").1.len(), 44 + 2 * 8 + 12);
        // The DSDT names the device.
        let dsdt = &sig(b"DSDT").1;
        assert!(dsdt.windows(8).any(|w| w == b"LNRO0005"));
        assert!(dsdt.windows(4).any(|w| w == b"_S5_"));
        assert!(dsdt.windows(4).any(|w| w == b"COM1"));
    }
}
