//! Saving and restoring the complete state of a vCPU: everything needed to
//! resume it exactly on another host. CPUID goes first on restore, because KVM
//! checks XSAVE and MSR contents against it.

use crate::error::{ioctl, KvmError};
use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs,
    kvm_xsave, CpuId, Msrs,
};
use kvm_ioctls::{Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

/// MSRs the memstress guest's state can depend on (those this host's KVM lists).
const MSR_CANDIDATES: [u32; 12] = [
    0x10,        // IA32_TSC: keeps the guest's clock continuous across the move
    0x174,       // SYSENTER_CS
    0x175,       // SYSENTER_ESP
    0x176,       // SYSENTER_EIP
    0x1a0,       // MISC_ENABLE
    0x277,       // PAT
    0xc000_0081, // STAR
    0xc000_0082, // LSTAR
    0xc000_0083, // CSTAR
    0xc000_0084, // SYSCALL_MASK
    0xc000_0102, // KERNEL_GS_BASE
    0xc000_0103, // TSC_AUX
];

/// The MSRs to migrate: the candidates this host supports.
pub fn migratable_msrs(kvm: &Kvm) -> Result<Vec<u32>, KvmError> {
    let list = kvm
        .get_msr_index_list()
        .map_err(ioctl("KVM_GET_MSR_INDEX_LIST"))?;
    Ok(MSR_CANDIDATES
        .iter()
        .copied()
        .filter(|m| list.as_slice().contains(m))
        .collect())
}

/// One vCPU's complete state.
#[derive(Serialize, Deserialize)]
pub struct VcpuSnapshot {
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub xsave: kvm_xsave,
    pub xcrs: kvm_xcrs,
    pub msrs: Vec<kvm_msr_entry>,
    pub events: kvm_vcpu_events,
    pub debugregs: kvm_debugregs,
}

/// Reads the state of a stopped vCPU.
pub fn save(
    fd: &VcpuFd,
    msr_indices: &[u32],
    cpuid_entries: usize,
) -> Result<VcpuSnapshot, KvmError> {
    let cpuid = fd
        .get_cpuid2(cpuid_entries)
        .map_err(ioctl("KVM_GET_CPUID2"))?;
    let mut msrs = Msrs::from_entries(
        &msr_indices
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect::<Vec<_>>(),
    )
    .map_err(|e| KvmError::Config(format!("MSR list: {e:?}")))?;
    let read = fd.get_msrs(&mut msrs).map_err(ioctl("KVM_GET_MSRS"))?;
    if read != msr_indices.len() {
        return Err(KvmError::Config(format!(
            "KVM_GET_MSRS read {read} of {} MSRs",
            msr_indices.len()
        )));
    }
    Ok(VcpuSnapshot {
        cpuid: cpuid.as_slice().to_vec(),
        regs: fd.get_regs().map_err(ioctl("KVM_GET_REGS"))?,
        sregs: fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?,
        xsave: fd.get_xsave().map_err(ioctl("KVM_GET_XSAVE"))?,
        xcrs: fd.get_xcrs().map_err(ioctl("KVM_GET_XCRS"))?,
        msrs: msrs.as_slice().to_vec(),
        events: fd.get_vcpu_events().map_err(ioctl("KVM_GET_VCPU_EVENTS"))?,
        debugregs: fd.get_debug_regs().map_err(ioctl("KVM_GET_DEBUGREGS"))?,
    })
}

/// Loads `snap` into a stopped vCPU. `xsave_fits` must say whether this host's
/// XSAVE area fits the legacy 4 KiB `kvm_xsave` (checked once per VM).
pub fn restore(fd: &VcpuFd, snap: &VcpuSnapshot, xsave_fits: bool) -> Result<(), KvmError> {
    let cpuid = CpuId::from_entries(&snap.cpuid)
        .map_err(|e| KvmError::Config(format!("CPUID in the stream: {e:?}")))?;
    fd.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;
    fd.set_sregs(&snap.sregs).map_err(ioctl("KVM_SET_SREGS"))?;
    fd.set_regs(&snap.regs).map_err(ioctl("KVM_SET_REGS"))?;
    fd.set_xcrs(&snap.xcrs).map_err(ioctl("KVM_SET_XCRS"))?;
    if !xsave_fits {
        return Err(KvmError::Config(
            "this host's XSAVE area is larger than 4 KiB; ferry cannot restore it".into(),
        ));
    }
    // SAFETY: KVM_CAP_XSAVE2 reported an XSAVE area of at most 4096 bytes
    // (`xsave_fits`), so KVM reads no further than the end of `kvm_xsave`.
    unsafe { fd.set_xsave(&snap.xsave) }.map_err(ioctl("KVM_SET_XSAVE"))?;
    let msrs = Msrs::from_entries(&snap.msrs)
        .map_err(|e| KvmError::Config(format!("MSRs in the stream: {e:?}")))?;
    let written = fd.set_msrs(&msrs).map_err(ioctl("KVM_SET_MSRS"))?;
    if written != snap.msrs.len() {
        return Err(KvmError::Config(format!(
            "KVM_SET_MSRS took {written} of {} MSRs (MSR {:#x} refused)",
            snap.msrs.len(),
            snap.msrs[written].index
        )));
    }
    fd.set_vcpu_events(&snap.events)
        .map_err(ioctl("KVM_SET_VCPU_EVENTS"))?;
    fd.set_debug_regs(&snap.debugregs)
        .map_err(ioctl("KVM_SET_DEBUGREGS"))?;
    Ok(())
}
