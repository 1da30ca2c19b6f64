//! Whether an interrupt raised through `KVM_IRQFD` reaches a CPL3 guest on
//! this host, and how long it takes if it does.
//!
//! The guest enables its LAPIC (spurious-vector register), routes IOAPIC
//! pin [`PIN`] to vector [`VECTOR`] on itself, and spins with interrupts
//! enabled (IOPL 3 lets CPL3 code own IF), leaving to userspace now and
//! then through a port so the VMM can stop it. Its IDT (set by the VMM:
//! `lidt` is CPL0's) sends [`VECTOR`] to a handler at CPL3 that counts the
//! interrupt and writes the LAPIC's EOI, and every other vector to a stub
//! that records which vector came (an exception, or an interrupt nobody
//! asked for) and stops. The VMM raises the irqfd, waits for the count to
//! move, and raises it again.

use crate::bare::{bare_vm, kvm};
use crate::layout::CODE;
use crate::vm::MiniVmError;
use ferry_engine::vmm::Gpa;
use iced_x86::code_asm::*;
use iced_x86::BlockEncoderOptions;
use kvm_ioctls::VcpuExit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

/// The IOAPIC pin (and GSI) the irqfd raises.
pub const PIN: u32 = 16;
/// The vector the guest gives it.
pub const VECTOR: u8 = 0x40;
/// Where the guest counts the interrupts it took; after it, its spin
/// counter and the vector (plus one) of anything else that came.
const COUNT: u64 = 0x8000;
/// Offset of that other vector from [`COUNT`].
const OTHER: u64 = 0x10;
/// The IDT.
const IDT: u64 = 0x9000;
/// The port of the guest's periodic exit.
const HEARTBEAT_PORT: u16 = 0x3f8;
/// How long one interrupt may take before it counts as not delivered.
const PATIENCE: Duration = Duration::from_millis(500);

/// What the probe found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct IrqDelivery {
    /// Interrupts raised.
    pub raised: u64,
    /// Interrupts the guest's handler counted.
    pub delivered: u64,
    /// Microseconds from the irqfd write to the count moving, median.
    pub median_us: Option<f64>,
    /// The same, the slowest.
    pub max_us: Option<f64>,
    /// How the vCPU stopped, if it stopped on its own (a triple fault
    /// says the interrupt could not be delivered into the guest).
    pub vcpu_stopped: Option<String>,
    /// A vector other than [`VECTOR`] that reached the guest's IDT: an
    /// exception (13: #GP), or an interrupt nobody raised.
    pub other_vector: Option<u8>,
}

/// The program, and where each vector's handler is.
fn program() -> Result<(Vec<u8>, Vec<u64>), IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut spin = a.create_label();
    let mut handler = a.create_label();
    let mut stopped = a.create_label();
    let mut stubs: Vec<CodeLabel> = (0..256).map(|_| a.create_label()).collect();
    a.mov(rbx, COUNT)?;
    // LAPIC: software-enable, spurious vector 0xff.
    a.mov(rax, 0xfee0_00f0u64)?;
    a.mov(dword_ptr(rax), 0x1ff)?;
    // IOAPIC: pin PIN → VECTOR, fixed, physical, edge, unmasked, to APIC 0.
    a.mov(rax, 0xfec0_0000u64)?;
    a.mov(dword_ptr(rax), 0x10 + 2 * PIN)?;
    a.mov(dword_ptr(rax + 0x10), u32::from(VECTOR))?;
    a.mov(dword_ptr(rax), 0x11 + 2 * PIN)?;
    a.mov(dword_ptr(rax + 0x10), 0)?;
    // IF is already set: the boot flags have it (and IOPL 3). An `sti`
    // here is not needed, and on kvm_pvm it triple-faults (below).
    a.set_label(&mut spin)?;
    a.inc(qword_ptr(rbx + 8))?;
    a.test(dword_ptr(rbx + 8), 0xffff)?;
    a.jnz(spin)?;
    a.mov(edx, u32::from(HEARTBEAT_PORT))?;
    a.out(dx, al)?;
    a.jmp(spin)?;
    a.set_label(&mut handler)?;
    a.push(rax)?;
    a.inc(qword_ptr(rbx))?;
    a.mov(rax, 0xfee0_00b0u64)?;
    a.mov(dword_ptr(rax), 0)?;
    a.pop(rax)?;
    a.iretq()?;
    // Any other vector: record it, then leave to userspace for ever.
    for (v, stub) in stubs.iter_mut().enumerate() {
        a.set_label(stub)?;
        a.mov(rax, COUNT + OTHER)?;
        a.mov(qword_ptr(rax), v as i32 + 1)?;
        a.jmp(stopped)?;
    }
    a.set_label(&mut stopped)?;
    a.mov(edx, u32::from(HEARTBEAT_PORT))?;
    a.out(dx, al)?;
    a.jmp(stopped)?;
    let result = a.assemble_options(CODE, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    let mut handlers = Vec::new();
    for (v, stub) in stubs.iter().enumerate() {
        handlers.push(match v == usize::from(VECTOR) {
            true => result.label_ip(&handler)?,
            false => result.label_ip(stub)?,
        });
    }
    Ok((result.inner.code_buffer, handlers))
}

/// A 64-bit interrupt gate to `handler` in the guest's CPL3 code segment,
/// callable from CPL3.
fn gate(handler: u64) -> [u64; 2] {
    let selector = u64::from(ferry_kvm::boot::CODE_SELECTOR);
    let low = (handler & 0xffff)
        | selector << 16
        | 0xee << 40 // present, DPL 3, 64-bit interrupt gate
        | ((handler >> 16) & 0xffff) << 48;
    [low, handler >> 32]
}

/// Raises `n` interrupts, one at a time, each waited for.
pub fn probe(n: u64) -> Result<IrqDelivery, MiniVmError> {
    let (code, handlers) =
        program().map_err(|e| MiniVmError::Config(format!("cannot assemble: {e}")))?;
    let bare = bare_vm(&code, true)?;
    let mem = |e: ferry_engine::vmm::RamError| MiniVmError::Config(e.to_string());
    for (v, &handler) in (0u64..).zip(&handlers) {
        let [low, high] = gate(handler);
        bare.ram.store_u64(Gpa(IDT + v * 16), low).map_err(mem)?;
        bare.ram
            .store_u64(Gpa(IDT + v * 16 + 8), high)
            .map_err(mem)?;
    }
    let mut sregs = bare.vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    sregs.idt.base = IDT;
    sregs.idt.limit = 0xfff;
    bare.vcpu.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;
    let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| MiniVmError::Config(e.to_string()))?;
    bare.vm
        .register_irqfd(&irq, PIN)
        .map_err(kvm("KVM_IRQFD"))?;

    let stop = Arc::new(AtomicBool::new(false));
    let ram = &bare.ram;
    let mut vcpu = bare.vcpu;
    std::thread::scope(|scope| {
        let stop_vcpu = Arc::clone(&stop);
        let runner = scope.spawn(move || -> Option<String> {
            loop {
                match vcpu.run() {
                    Ok(VcpuExit::IoOut(HEARTBEAT_PORT, _)) => {}
                    Ok(other) => {
                        let what = format!("{other:?}");
                        let rip = vcpu.get_regs().map(|r| r.rip).unwrap_or(0);
                        return Some(format!(
                            "{what} at rip {rip:#x} (the code starts at {CODE:#x})"
                        ));
                    }
                    Err(e) if e.errno() == libc::EINTR => {}
                    Err(e) => return Some(format!("KVM_RUN: {e}")),
                }
                if stop_vcpu.load(Ordering::Acquire) {
                    return None;
                }
            }
        });
        let count = || ram.load_u64(Gpa(COUNT)).unwrap_or(0);
        let other = || ram.load_u64(Gpa(COUNT + OTHER)).unwrap_or(0);
        // The guest has set its chips up once it spins.
        let started = Instant::now();
        while ram.load_u64(Gpa(COUNT + 8)).unwrap_or(0) == 0
            && other() == 0
            && started.elapsed() < PATIENCE
            && !runner.is_finished()
        {
            std::thread::yield_now();
        }
        let mut times = Vec::new();
        let mut raised = 0;
        for _ in 0..n {
            if runner.is_finished() || other() != 0 {
                break;
            }
            let before = count();
            let t0 = Instant::now();
            raised += 1;
            let _ = irq.write(1);
            while count() == before
                && other() == 0
                && t0.elapsed() < PATIENCE
                && !runner.is_finished()
            {
                std::hint::spin_loop();
            }
            if count() == before {
                break;
            }
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        stop.store(true, Ordering::Release);
        let vcpu_stopped = runner
            .join()
            .unwrap_or(Some("the vCPU thread panicked".into()));
        times.sort_by(f64::total_cmp);
        Ok(IrqDelivery {
            raised,
            delivered: count(),
            median_us: times.get(times.len() / 2).copied(),
            max_us: times.last().copied(),
            vcpu_stopped,
            other_vector: other().checked_sub(1).map(|v| v as u8),
        })
    })
}
