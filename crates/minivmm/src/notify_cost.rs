//! What one virtio queue notification costs on this host, both ways an
//! I/O thread can be woken: KVM signals its eventfd itself
//! (`KVM_IOEVENTFD`), or the write exits to the vCPU thread, which signals
//! it. A CPL3 guest writes the queue-notify register `n` times in a tight
//! loop, then writes a port to say it is done; the time per write is the
//! notification's cost to the vCPU, and the eventfd's count says every
//! notification arrived.

use crate::bare::{bare_vm, kvm, BareVm};
use crate::blk::{Notify, QUEUE_NOTIFY};
use crate::layout::{CODE, MMIO_BASE};
use crate::vm::MiniVmError;
use iced_x86::code_asm::*;
use kvm_ioctls::{IoEventAddress, NoDatamatch, VcpuExit};
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
    let code = program(n).map_err(|e| MiniVmError::Config(format!("cannot assemble: {e}")))?;
    let BareVm { mut vcpu, vm, ram } = bare_vm(&code, false)?;
    let eventfd =
        EventFd::new(libc::EFD_NONBLOCK).map_err(|e| MiniVmError::Config(e.to_string()))?;
    if notify == Notify::Ioeventfd {
        let at = IoEventAddress::Mmio(MMIO_BASE + QUEUE_NOTIFY);
        vm.register_ioevent(&eventfd, &at, NoDatamatch)
            .map_err(kvm("KVM_IOEVENTFD"))?;
    }
    let mut exits = 0;
    let started = Instant::now();
    loop {
        match vcpu.run().map_err(kvm("KVM_RUN"))? {
            VcpuExit::MmioWrite(..) => {
                exits += 1;
                let _ = eventfd.write(1);
            }
            VcpuExit::IoOut(DONE_PORT, _) => break,
            other => return Err(MiniVmError::Config(format!("the guest stopped: {other:?}"))),
        }
    }
    let elapsed = started.elapsed();
    drop((vcpu, vm, ram));
    Ok(NotifyCost {
        notify,
        notifications: n,
        delivered: eventfd.read().unwrap_or(0),
        exits,
        us_per_notification: elapsed.as_secs_f64() * 1e6 / n.max(1) as f64,
    })
}
