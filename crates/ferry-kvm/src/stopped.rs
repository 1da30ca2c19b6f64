//! Where a vCPU was when it stopped on its own (a triple fault, an exit
//! no VMM expects): its registers, its control registers and the events
//! KVM held for it, in one line. A failure report that carries this can
//! be told apart (a guest's own bug, an interrupt delivered to a guest
//! without an IDT, a host that corrupted state) from the report alone.

use kvm_ioctls::VcpuFd;

/// One line: `rip rsp rflags cs cr0 cr2 cr3 cr4 efer`, and KVM's pending
/// or injected exception, interrupt and NMI, where it has any. Registers
/// that cannot be read are named as such.
pub fn describe(fd: &VcpuFd) -> String {
    let mut parts = Vec::new();
    match fd.get_regs() {
        Ok(r) => parts.push(format!(
            "rip={:#x} rsp={:#x} rflags={:#x}",
            r.rip, r.rsp, r.rflags
        )),
        Err(e) => parts.push(format!("regs unreadable ({e})")),
    }
    match fd.get_sregs() {
        Ok(s) => parts.push(format!(
            "cs={:#x} cpl={} cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} idt={:#x}/{:#x}",
            s.cs.selector, s.cs.dpl, s.cr0, s.cr2, s.cr3, s.cr4, s.efer, s.idt.base, s.idt.limit
        )),
        Err(e) => parts.push(format!("sregs unreadable ({e})")),
    }
    match fd.get_vcpu_events() {
        Ok(ev) => {
            if ev.exception.injected != 0 || ev.exception.pending != 0 {
                parts.push(format!(
                    "exception {} ({}, error code {:#x})",
                    ev.exception.nr,
                    if ev.exception.injected != 0 {
                        "injected"
                    } else {
                        "pending"
                    },
                    if ev.exception.has_error_code != 0 {
                        ev.exception.error_code
                    } else {
                        0
                    }
                ));
            }
            if ev.interrupt.injected != 0 {
                parts.push(format!("interrupt vector {} injected", ev.interrupt.nr));
            }
            if ev.nmi.injected != 0 || ev.nmi.pending != 0 {
                parts.push("NMI pending or injected".into());
            }
            if ev.triple_fault.pending != 0 {
                parts.push("triple fault pending".into());
            }
        }
        Err(e) => parts.push(format!("events unreadable ({e})")),
    }
    parts.join(", ")
}
