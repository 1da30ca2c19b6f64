//! Boot state for the memstress guest: where its page tables, GDT and TSS
//! go, written by ferry-kvm's [`Cpl3Image`], and the code and parameters
//! each vCPU starts with.

use ferry_kvm::boot::Cpl3Image;
use ferry_memstress::{self as memstress, MemoryLayout, Workload, SLEEP_PORT};
use ferry_vm::{Gpa, GuestRam, RamError};
use kvm_bindings::{kvm_regs, kvm_sregs};

/// Guest-physical address of the TSS (the page between the PDPT and the params).
pub const TSS_GPA: Gpa = Gpa(0x3000);
/// The I/O bitmap covers ports 0..=255, which holds SLEEP_PORT.
const BITMAP_PORTS: u16 = 256;

/// The boot tables of a guest of `bytes` bytes: every port closed but
/// SLEEP_PORT, the guest's one sleep request.
fn image(bytes: u64) -> Cpl3Image {
    Cpl3Image {
        pml4: memstress::PML4_GPA,
        pdpt: memstress::PDPT_GPA,
        pd: memstress::PD_GPA,
        gdt: memstress::GDT_GPA,
        tss: TSS_GPA,
        mapped_bytes: bytes,
        bitmap_ports: BITMAP_PORTS,
        open_ports: SLEEP_PORT..SLEEP_PORT + 1,
    }
}

/// Which guest program the vCPUs run.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Program {
    /// The memstress workload with its stamp checks.
    #[default]
    Memstress,
    /// The probe's bare write loop, for calibrating fault costs.
    RawWrites,
    /// The write-list program (`ferry_memstress::write_list`): writes the
    /// pages the host lists, for the engine's conformance kit.
    WriteList,
}

/// Writes page tables, GDT, TSS, code and parameters for `workload` into `ram`.
pub fn load_guest(
    ram: &GuestRam,
    workload: &Workload,
    tsc_khz: u64,
    program: Program,
) -> Result<(), BootError> {
    let layout = MemoryLayout::for_workload(workload);
    image(layout.total_bytes()).write(ram)?;
    let code = match program {
        Program::Memstress => super::code::memstress(memstress::CODE_GPA.0)?,
        Program::RawWrites => super::code::raw_writes(memstress::CODE_GPA.0)?,
        Program::WriteList => super::code::write_list(memstress::CODE_GPA.0)?,
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

/// The special registers of a vCPU entering the memstress loop at CPL3.
/// `base` is what `KVM_GET_SREGS` returned, so fields ferry does not set keep
/// KVM's defaults. The PML4 does not depend on the guest's size.
pub fn initial_sregs(base: kvm_sregs) -> kvm_sregs {
    image(0).sregs(base)
}

/// The general registers of vCPU `vcpu` at entry: the loop, with the
/// vCPU's parameter block as its argument.
pub fn initial_regs(vcpu: u32) -> kvm_regs {
    Cpl3Image::regs(memstress::CODE_GPA, MemoryLayout::params_gpa(vcpu).0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_vm::Backing;

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
        let pde = ram.load_u64(Gpa(pd + (region / (2 << 20)) * 8)).unwrap();
        assert_eq!(pde & !0xfff, region);
        assert_eq!(pde & 0x87, 0x87);
    }
}
