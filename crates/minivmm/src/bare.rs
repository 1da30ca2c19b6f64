//! A one-vCPU VM running a program of one's own at CPL3, in minivmm's
//! system region with its boot image: what the host probes
//! ([`crate::notify_cost`], [`crate::irq_delivery`]) measure on.

use crate::layout::{CODE, SYSTEM_BYTES};
use crate::vm::{MiniVmError, TSS_ADDRESS};
use ferry_engine::vmm::{Backing, Gpa, GuestRam};
use kvm_bindings::{kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};

/// The VM. Fields drop in order: the vCPU, the VM, then the memory the VM
/// maps.
pub struct BareVm {
    /// The vCPU, at the program's entry.
    pub vcpu: VcpuFd,
    /// The VM.
    pub vm: VmFd,
    /// Its memory: the system region.
    pub ram: GuestRam,
}

pub(crate) fn kvm(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> MiniVmError {
    move |e| MiniVmError::Kvm(op, e)
}

/// A VM whose vCPU starts `code` (assembled for [`CODE`]) at CPL3, with
/// an in-kernel irqchip if asked.
pub fn bare_vm(code: &[u8], irqchip: bool) -> Result<BareVm, MiniVmError> {
    let config = MiniVmError::Config;
    let ram = GuestRam::with_regions(&[(Gpa(0), SYSTEM_BYTES)], Backing::Anonymous)
        .map_err(|e| config(e.to_string()))?;
    crate::boot::write_image(&ram)?;
    ram.write_bytes(Gpa(CODE), code)
        .map_err(|e| config(e.to_string()))?;
    let kvm_fd = Kvm::new().map_err(kvm("open /dev/kvm"))?;
    let vm = kvm_fd.create_vm().map_err(kvm("KVM_CREATE_VM"))?;
    vm.set_tss_address(TSS_ADDRESS)
        .map_err(kvm("KVM_SET_TSS_ADDR"))?;
    if irqchip {
        vm.create_irq_chip().map_err(kvm("KVM_CREATE_IRQCHIP"))?;
    }
    let slot = &ram.slots()[0];
    let region = kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: slot.size,
        userspace_addr: ram.host_address(slot) as u64,
    };
    // SAFETY: the mapping belongs to `ram`, which the returned BareVm
    // drops after the VM fd.
    unsafe { vm.set_user_memory_region(region) }.map_err(kvm("KVM_SET_USER_MEMORY_REGION"))?;
    let vcpu = vm.create_vcpu(0).map_err(kvm("KVM_CREATE_VCPU"))?;
    let cpuid = kvm_fd
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm("KVM_GET_SUPPORTED_CPUID"))?;
    vcpu.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
    let sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    vcpu.set_sregs(&crate::boot::sregs(sregs))
        .map_err(kvm("KVM_SET_SREGS"))?;
    vcpu.set_regs(&crate::boot::regs(0))
        .map_err(kvm("KVM_SET_REGS"))?;
    Ok(BareVm { vcpu, vm, ram })
}
