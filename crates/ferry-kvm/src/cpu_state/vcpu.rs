//! One vCPU's state: reading it from a stopped vCPU, and loading it into
//! another in the order KVM needs. CPUID goes first, because KVM checks the
//! XSAVE area, XCRs and MSRs against it; the TSC frequency before the TSC
//! MSR, which KVM converts at that frequency; sregs (with the APIC base)
//! before the LAPIC; MP state, events and debug registers last.

use super::msrs::{self, MsrError};
use super::xsave::{self, XsaveError, XsaveKind};
use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs,
    kvm_sregs, kvm_vcpu_events, kvm_xcrs, CpuId, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};
use vmm_sys_util::errno;

/// What went wrong saving or restoring one vCPU.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A vCPU ioctl failed.
    #[error("{0} failed")]
    Ioctl(&'static str, #[source] errno::Error),
    /// Reading or writing MSRs failed.
    #[error(transparent)]
    Msr(#[from] MsrError),
    /// Reading or writing the XSAVE area failed.
    #[error(transparent)]
    Xsave(#[from] XsaveError),
    /// The saved CPUID does not fit a `kvm_cpuid2`.
    #[error("the saved CPUID has {0} entries, more than KVM takes")]
    Cpuid(usize),
    /// This host's KVM did not take the source's TSC frequency.
    #[error("this host's KVM refused TSC frequency {wanted} kHz (this vCPU runs at {here})")]
    TscKhz {
        /// The source's frequency.
        wanted: u32,
        /// This vCPU's frequency, as text.
        here: String,
        /// Why.
        #[source]
        source: errno::Error,
    },
    /// The state has a LAPIC and this VM none, or the other way round.
    #[error("{0}")]
    Lapic(&'static str),
}

impl VcpuError {
    /// Whether the error says the state does not fit this VM (rather than
    /// that KVM failed).
    pub fn is_unfit(&self) -> bool {
        matches!(
            self,
            VcpuError::Cpuid(_)
                | VcpuError::TscKhz { .. }
                | VcpuError::Lapic(_)
                | VcpuError::Xsave(XsaveError::TooLarge { .. } | XsaveError::TooShort(_))
        )
    }
}

/// What saving or restoring a vCPU of this VM needs to know.
#[derive(Clone, Debug)]
pub struct VcpuContext<'a> {
    /// The MSRs to save (the VM's probe).
    pub msrs: &'a [u32],
    /// How the XSAVE area is read and written here.
    pub xsave: XsaveKind,
    /// Whether the VM has an in-kernel LAPIC.
    pub lapic: bool,
}

/// One vCPU's complete state.
#[derive(Clone, Serialize, Deserialize)]
pub struct VcpuSnapshot {
    /// CPUID as the vCPU was given it.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// TSC frequency, where `KVM_GET_TSC_KHZ` gives it.
    pub tsc_khz: Option<u32>,
    /// General-purpose registers, RIP, RFLAGS.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers, EFER, APIC base.
    pub sregs: kvm_sregs,
    /// Extended control registers (XCR0).
    pub xcrs: kvm_xcrs,
    /// The whole XSAVE area, as 32-bit words.
    pub xsave: Vec<u32>,
    /// Every saveable MSR, IA32_TSC among them.
    pub msrs: Vec<kvm_msr_entry>,
    /// The in-kernel LAPIC's registers, where the VM has one.
    pub lapic: Option<kvm_lapic_state>,
    /// Runnable, halted, waiting for SIPI...
    pub mp_state: kvm_mp_state,
    /// Pending exceptions, interrupts, NMIs, SMM and interrupt shadow.
    pub events: kvm_vcpu_events,
    /// DR0-3, DR6, DR7.
    pub debugregs: kvm_debugregs,
}

fn ioctl(name: &'static str) -> impl FnOnce(errno::Error) -> VcpuError {
    move |e| VcpuError::Ioctl(name, e)
}

/// Reads the state of a stopped vCPU.
pub fn save(fd: &VcpuFd, cx: &VcpuContext) -> Result<VcpuSnapshot, VcpuError> {
    Ok(VcpuSnapshot {
        cpuid: fd
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(ioctl("KVM_GET_CPUID2"))?
            .as_slice()
            .to_vec(),
        tsc_khz: fd.get_tsc_khz().ok(),
        regs: fd.get_regs().map_err(ioctl("KVM_GET_REGS"))?,
        sregs: fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?,
        xcrs: fd.get_xcrs().map_err(ioctl("KVM_GET_XCRS"))?,
        xsave: xsave::save(fd, cx.xsave)?,
        msrs: msrs::read(fd, cx.msrs)?,
        lapic: match cx.lapic {
            true => Some(fd.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?),
            false => None,
        },
        mp_state: fd.get_mp_state().map_err(ioctl("KVM_GET_MP_STATE"))?,
        events: fd.get_vcpu_events().map_err(ioctl("KVM_GET_VCPU_EVENTS"))?,
        debugregs: fd.get_debug_regs().map_err(ioctl("KVM_GET_DEBUGREGS"))?,
    })
}

/// Checks, before anything is written, that `snap` can load into a vCPU of
/// this VM.
pub fn check_fits(snap: &VcpuSnapshot, cx: &VcpuContext) -> Result<(), VcpuError> {
    match (snap.lapic.is_some(), cx.lapic) {
        (true, false) => {
            return Err(VcpuError::Lapic(
                "the state has an in-kernel LAPIC, this VM has no in-kernel irqchip",
            ))
        }
        (false, true) => {
            return Err(VcpuError::Lapic(
                "the state has no LAPIC (its VM had no in-kernel irqchip), this VM has one",
            ))
        }
        _ => {}
    }
    if snap.xsave.len() * 4 > cx.xsave.bytes().next_multiple_of(4) {
        return Err(XsaveError::TooLarge {
            blob: snap.xsave.len() * 4,
            host: cx.xsave.bytes(),
        }
        .into());
    }
    Ok(())
}

/// Makes the vCPU's TSC read the saved IA32_TSC now, through its TSC
/// offset where this KVM has the attribute.
///
/// The MSR write alone is not enough: KVM takes a host write of IA32_TSC
/// within a second of where the VM's TSC already is as an attempt to
/// synchronize vCPUs, and keeps the VM's offset instead. A guest saved
/// less than a second into its life (or a destination VM created about as
/// long before the restore as the guest had run) then restarts its TSC
/// from the destination VM's creation: time goes back. Seen on Linux
/// 6.1's SVM KVM (docs/svm-host.md); `kvm_pvm` happened not to.
fn pin_tsc(fd: &VcpuFd, saved: &[kvm_bindings::kvm_msr_entry]) -> Result<(), VcpuError> {
    let Some(want) = saved
        .iter()
        .find(|m| m.index == msrs::IA32_TSC)
        .map(|m| m.data)
    else {
        return Ok(());
    };
    let Ok(offset) = crate::ioctls::tsc_offset(fd) else {
        // A KVM before 5.16: the MSR write is all there is.
        return Ok(());
    };
    let now = msrs::read(fd, &[msrs::IA32_TSC])?
        .first()
        .map_or(want, |m| m.data);
    let pinned = offset.wrapping_add(want.wrapping_sub(now));
    crate::ioctls::set_tsc_offset(fd, pinned).map_err(ioctl("KVM_SET_DEVICE_ATTR(TSC_OFFSET)"))
}

/// Tells a stopped vCPU's guest that the host held it
/// (`KVM_KVMCLOCK_CTRL`): KVM sets `PVCLOCK_GUEST_STOPPED` in the guest's
/// kvmclock page as it next enters, and a Linux guest then resets its soft
/// lockup watchdog and skips one RCU stall check instead of reporting the
/// hold as a CPU stuck for that long. A VMM calls it on every vCPU before
/// it lets a paused or restored guest run: after a pause of over 20 s (a
/// snapshot restored later, a guest held for an operator, a slow
/// switchover rolled back) Linux would otherwise log `BUG: soft lockup`.
/// QEMU does the same on each start. Call it while the vCPU is out of
/// `KVM_RUN`: KVM serializes it with the vCPU's run.
///
/// `Ok(false)` where the guest has no kvmclock (it never wrote
/// `MSR_KVM_SYSTEM_TIME_NEW`: a guest that is not Linux, or one not yet
/// booted that far): nothing to tell.
pub fn tell_guest_it_was_paused(fd: &VcpuFd) -> Result<bool, VcpuError> {
    match fd.kvmclock_ctrl() {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == libc::EINVAL => Ok(false),
        Err(e) => Err(ioctl("KVM_KVMCLOCK_CTRL")(e)),
    }
}

/// Loads `snap` into a stopped vCPU that has not run.
pub fn restore(fd: &VcpuFd, cx: &VcpuContext, snap: &VcpuSnapshot) -> Result<(), VcpuError> {
    check_fits(snap, cx)?;
    let cpuid = CpuId::from_entries(&snap.cpuid).map_err(|_| VcpuError::Cpuid(snap.cpuid.len()))?;
    fd.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;
    if let Some(wanted) = snap.tsc_khz {
        let here = fd.get_tsc_khz();
        if here.as_ref().ok() != Some(&wanted) {
            fd.set_tsc_khz(wanted).map_err(|source| VcpuError::TscKhz {
                wanted,
                here: match here {
                    Ok(khz) => format!("{khz} kHz"),
                    Err(e) => format!("an unknown frequency: KVM_GET_TSC_KHZ failed: {e}"),
                },
                source,
            })?;
        }
    }
    fd.set_sregs(&snap.sregs).map_err(ioctl("KVM_SET_SREGS"))?;
    fd.set_regs(&snap.regs).map_err(ioctl("KVM_SET_REGS"))?;
    fd.set_xcrs(&snap.xcrs).map_err(ioctl("KVM_SET_XCRS"))?;
    xsave::restore(fd, cx.xsave, &snap.xsave)?;
    msrs::write(fd, &snap.msrs)?;
    pin_tsc(fd, &snap.msrs)?;
    if let Some(lapic) = &snap.lapic {
        fd.set_lapic(lapic).map_err(ioctl("KVM_SET_LAPIC"))?;
    }
    fd.set_mp_state(snap.mp_state)
        .map_err(ioctl("KVM_SET_MP_STATE"))?;
    fd.set_vcpu_events(&snap.events)
        .map_err(ioctl("KVM_SET_VCPU_EVENTS"))?;
    fd.set_debug_regs(&snap.debugregs)
        .map_err(ioctl("KVM_SET_DEBUGREGS"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::Msrs;

    #[test]
    fn only_a_guest_on_kvmclock_is_told_it_was_paused() {
        if !crate::host::require_kvm("only_a_guest_on_kvmclock_is_told_it_was_paused") {
            return;
        }
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        // No kvmclock yet: nothing to tell, and no error.
        assert!(!tell_guest_it_was_paused(&vcpu).unwrap());
        // The guest takes up kvmclock (a page at 1 MiB, enabled).
        let msrs = Msrs::from_entries(&[kvm_msr_entry {
            index: msrs::KVM_SYSTEM_TIME_NEW,
            data: (1 << 20) | 1,
            ..Default::default()
        }])
        .unwrap();
        assert_eq!(vcpu.set_msrs(&msrs).unwrap(), 1);
        assert!(tell_guest_it_was_paused(&vcpu).unwrap());
    }
}
