//! What one virtio queue notification costs on this host, both ways an
//! I/O thread can be woken: KVM signals its eventfd itself
//! (`KVM_IOEVENTFD`), or the write exits to the vCPU thread, which signals
//! it. A CPL3 guest writes the queue-notify register `n` times in a tight
//! loop, then writes a port to say it is done; the time per write is the
//! notification's cost to the vCPU, and the eventfd's count says every
//! notification arrived.

use crate::blk::{Notify, QUEUE_NOTIFY};
use crate::layout::{CODE, MMIO_BASE, SYSTEM_BYTES};
use crate::vm::MiniVmError;
use ferry_engine::vmm::{Backing, Gpa, GuestRam};
use iced_x86::code_asm::*;
use kvm_bindings::{kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{IoEventAddress, Kvm, NoDatamatch, VcpuExit};
use std::time::Instant;
use vmm_sys_util::eventfd::EventFd;

/// The port the guest writes when it has finished.
const DONE_PORT: u16 = 0x3f8;

/// One measurement.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NotifyCost {
    /// How the notifications reached the eventfd.
    pub notify: Notify,
    /// Notifications the guest wrote.
    pub notifications: u64,
    /// What the eventfd counted.
    pub delivered: u64,
    /// Notify writes that exited to the vCPU thread.
    pub exits: u64,
    /// Microseconds of the guest's time per notification.
    pub us_per_notification: f64,
}

fn kvm(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> MiniVmError {
    move |e| MiniVmError::Kvm(op, e)
}

/// The guest: `n` writes of the notify register, then one `out`.
fn program(n: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut again = a.create_label();
    a.mov(rbp, MMIO_BASE)?;
    a.mov(rcx, n)?;
    a.set_label(&mut again)?;
    a.mov(dword_ptr(rbp + QUEUE_NOTIFY as i32), 0)?;
    a.dec(rcx)?;
    a.jnz(again)?;
    a.mov(edx, u32::from(DONE_PORT))?;
    a.out(dx, al)?;
    a.jmp(again)?;
    a.assemble(CODE)
}

/// Measures `n` notifications by `notify` (exit or ioeventfd) on a fresh
/// VM. Inline is the exit path with the device's work added, so it is
/// not measured here.
pub fn measure(notify: Notify, n: u64) -> Result<NotifyCost, MiniVmError> {
    let config = |why: String| MiniVmError::Config(why);
    let ram = GuestRam::with_regions(&[(Gpa(0), SYSTEM_BYTES)], Backing::Anonymous)
        .map_err(|e| config(e.to_string()))?;
    crate::boot::write_image(&ram)?;
    let code = program(n).map_err(|e| config(format!("cannot assemble: {e}")))?;
    ram.write_bytes(Gpa(CODE), &code)
        .map_err(|e| config(e.to_string()))?;

    let kvm_fd = Kvm::new().map_err(kvm("open /dev/kvm"))?;
    let vm = kvm_fd.create_vm().map_err(kvm("KVM_CREATE_VM"))?;
    vm.set_tss_address(crate::vm::TSS_ADDRESS)
        .map_err(kvm("KVM_SET_TSS_ADDR"))?;
    let slot = &ram.slots()[0];
    let region = kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: slot.size,
        userspace_addr: ram.host_address(slot) as u64,
    };
    // SAFETY: the mapping belongs to `ram`, which outlives the VM fd
    // (dropped first, at the end of this function).
    unsafe { vm.set_user_memory_region(region) }.map_err(kvm("KVM_SET_USER_MEMORY_REGION"))?;
    let eventfd = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| config(e.to_string()))?;
    if notify == Notify::Ioeventfd {
        let at = IoEventAddress::Mmio(MMIO_BASE + QUEUE_NOTIFY);
        vm.register_ioevent(&eventfd, &at, NoDatamatch)
            .map_err(kvm("KVM_IOEVENTFD"))?;
    }
    let mut vcpu = vm.create_vcpu(0).map_err(kvm("KVM_CREATE_VCPU"))?;
    let cpuid = kvm_fd
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm("KVM_GET_SUPPORTED_CPUID"))?;
    vcpu.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
    let sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    vcpu.set_sregs(&crate::boot::sregs(sregs))
        .map_err(kvm("KVM_SET_SREGS"))?;
    vcpu.set_regs(&crate::boot::regs(0))
        .map_err(kvm("KVM_SET_REGS"))?;

    let mut exits = 0;
    let started = Instant::now();
    loop {
        match vcpu.run().map_err(kvm("KVM_RUN"))? {
            VcpuExit::MmioWrite(..) => {
                exits += 1;
                let _ = eventfd.write(1);
            }
            VcpuExit::IoOut(DONE_PORT, _) => break,
            other => return Err(config(format!("the guest stopped: {other:?}"))),
        }
    }
    let elapsed = started.elapsed();
    Ok(NotifyCost {
        notify,
        notifications: n,
        delivered: eventfd.read().unwrap_or(0),
        exits,
        us_per_notification: elapsed.as_secs_f64() * 1e6 / n.max(1) as f64,
    })
}
