//! minivmm's guest: a long-mode program at CPL3 (this host runs only CPL3
//! code natively) that drives three things at once, each with its own
//! check:
//!
//! - **the console**: numbered lines `L<seq> <seq·K>` (16 hex digits each)
//!   on the serial port, one `out` per byte;
//! - **the disk**: [`SLOTS`] requests in flight on the virtio-blk queue.
//!   Each slot writes a block carrying a sequence number and a check, reads
//!   it back and compares it with the guest's own table of what it last
//!   wrote to that block. The guest polls the used ring (no interrupts at
//!   CPL3) and notifies the device by one MMIO write per batch;
//! - **memory**: it sweeps the data region, a few pages per loop, so
//!   precopy has pages to chase.
//!
//! Every vCPU runs this one program in its own lane of memory (`rdi` at
//! entry), on its own port and device, sweeping its own slice of the data
//! region: N independent streams, each checked on its own.
//!
//! Everything the program knows lives in its registers and guest memory,
//! so the vCPU state and RAM capture it exactly, mid-line and mid-request.

use crate::layout::{self, slot, var, *};
use iced_x86::code_asm::*;

/// How the program is built.
#[derive(Clone, Copy, Debug)]
pub struct GuestParams {
    /// Data pages written per main-loop iteration.
    pub sweep_per_loop: u32,
    /// A console line every this many iterations (a power of two).
    pub line_every: u32,
}

/// Errors assembling the guest.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// iced-x86 refused an instruction.
    #[error("cannot assemble minivmm's guest: {0}")]
    Assemble(#[from] IcedError),
    /// The code outgrew its area.
    #[error("minivmm's guest is {0} bytes, over the code area")]
    TooLarge(usize),
}

fn d(offset: u64) -> i32 {
    i32::try_from(offset).expect("layout offsets fit in 32 bits")
}

/// The program, to run at [`CODE`].
pub fn program(p: GuestParams) -> Result<Vec<u8>, GuestError> {
    let mut a = CodeAssembler::new(64)?;
    let mut main_loop = a.create_label();
    let mut sweep = a.create_label();
    let mut no_wrap = a.create_label();
    let mut poll = a.create_label();
    let mut polled = a.create_label();
    let mut no_notify = a.create_label();
    let mut complete = a.create_label();
    let mut start_write = a.create_label();
    let mut submit = a.create_label();
    let mut print_line = a.create_label();
    let mut hex16 = a.create_label();
    let mut fill_poll = a.create_label();
    let mut write_list = a.create_label();

    // rbx: the lane (its variables first); rbp: the device's registers;
    // r15: notify due.
    a.mov(rbx, rdi)?;
    a.lea(rsp, qword_ptr(rbx + d(STACK_TOP)))?;
    a.mov(rbp, qword_ptr(rbx + d(var::MMIO)))?;
    init_device(&mut a, [DESC, AVAIL, USED])?;
    for s in 0..SLOTS {
        write_descriptors(&mut a, s)?;
    }
    for s in 0..SLOTS {
        a.mov(r12, s)?;
        a.lea(r13, qword_ptr(rbx + d(SLOTS_STATE + s * SLOT_BYTES)))?;
        a.call(start_write)?;
    }
    a.mov(dword_ptr(rbp + d(mmio::QUEUE_NOTIFY)), 0)?;
    fill_init(&mut a)?;

    a.set_label(&mut main_loop)?;
    // The sweep: stamp each page with its pass and number.
    a.mov(ecx, p.sweep_per_loop)?;
    a.set_label(&mut sweep)?;
    a.mov(rax, qword_ptr(rbx + d(var::SWEEP_PAGE)))?;
    a.mov(rdx, rax)?;
    a.add(rdx, qword_ptr(rbx + d(var::SWEEP_BASE)))?;
    a.shl(rdx, 12)?;
    a.mov(r8, DATA_GPA)?;
    a.add(rdx, r8)?;
    a.mov(r9, qword_ptr(rbx + d(var::SWEEP_PASS)))?;
    a.mov(qword_ptr(rdx), r9)?;
    a.mov(qword_ptr(rdx + 8), rax)?;
    a.inc(rax)?;
    a.cmp(rax, qword_ptr(rbx + d(var::SWEEP_PAGES)))?;
    a.jb(no_wrap)?;
    a.xor(eax, eax)?;
    a.inc(qword_ptr(rbx + d(var::SWEEP_PASS)))?;
    a.set_label(&mut no_wrap)?;
    a.mov(qword_ptr(rbx + d(var::SWEEP_PAGE)), rax)?;
    a.dec(ecx)?;
    a.jnz(sweep)?;

    // The disk: handle every new used-ring entry, then notify once.
    a.xor(r15d, r15d)?;
    a.set_label(&mut poll)?;
    a.lea(rdi, qword_ptr(rbx + d(USED)))?;
    a.movzx(eax, word_ptr(rdi + 2))?;
    a.mov(rdx, qword_ptr(rbx + d(var::USED_SEEN)))?;
    a.cmp(ax, dx)?;
    a.je(polled)?;
    a.mov(ecx, edx)?;
    a.and(ecx, u32::from(QUEUE_SIZE - 1))?;
    a.mov(eax, dword_ptr(rdi + rcx * 8 + 4))?;
    a.inc(edx)?;
    a.and(edx, 0xffff)?;
    a.mov(qword_ptr(rbx + d(var::USED_SEEN)), rdx)?;
    // The entry names the head descriptor, 3 × slot.
    a.xor(edx, edx)?;
    a.mov(ecx, 3)?;
    a.div(ecx)?;
    a.mov(r12, rax)?;
    a.mov(r13, r12)?;
    a.shl(r13, 5)?;
    a.lea(rax, qword_ptr(rbx + d(SLOTS_STATE)))?;
    a.add(r13, rax)?;
    a.call(complete)?;
    a.jmp(poll)?;
    a.set_label(&mut polled)?;
    a.test(r15d, r15d)?;
    a.jz(no_notify)?;
    a.mov(dword_ptr(rbp + d(mmio::QUEUE_NOTIFY)), 0)?;
    a.set_label(&mut no_notify)?;
    let mut no_fill = a.create_label();
    a.cmp(qword_ptr(rbx + d(var::FILL_MMIO)), 0)?;
    a.je(no_fill)?;
    a.call(fill_poll)?;
    a.set_label(&mut no_fill)?;

    // Pages the VMM asked this vCPU to write.
    let mut no_list = a.create_label();
    a.cmp(qword_ptr(rbx + d(var::WRITE_COUNT)), 0)?;
    a.je(no_list)?;
    a.call(write_list)?;
    a.set_label(&mut no_list)?;

    // The console: a line every `line_every` loops.
    a.inc(qword_ptr(rbx + d(var::LOOPS)))?;
    a.mov(rax, qword_ptr(rbx + d(var::LOOPS)))?;
    a.test(eax, p.line_every - 1)?;
    a.jnz(main_loop)?;
    a.call(print_line)?;
    a.jmp(main_loop)?;

    // complete(r12 = slot, r13 = its state): the request finished.
    a.set_label(&mut complete)?;
    let mut status_ok = a.create_label();
    let mut was_read = a.create_label();
    let mut bad = a.create_label();
    a.lea(rdi, qword_ptr(rbx + d(STATUS)))?;
    a.movzx(eax, byte_ptr(rdi + r12))?;
    a.test(eax, eax)?;
    a.jz(status_ok)?;
    a.inc(qword_ptr(rbx + d(var::STATUS_ERRORS)))?;
    a.set_label(&mut status_ok)?;
    a.cmp(qword_ptr(r13 + d(slot::PHASE)), 1)?;
    a.jne(was_read)?;
    // A write: note it, then read the block back.
    a.mov(rcx, qword_ptr(r13 + d(slot::BLOCK)))?;
    a.mov(rdx, qword_ptr(r13 + d(slot::SEQ)))?;
    a.lea(rdi, qword_ptr(rbx + d(LAST_WRITTEN)))?;
    a.mov(qword_ptr(rdi + rcx * 8), rdx)?;
    a.inc(qword_ptr(rbx + d(var::WRITES_DONE)))?;
    a.mov(qword_ptr(r13 + d(slot::PHASE)), 2)?;
    a.xor(esi, esi)?;
    a.jmp(submit)?;
    // A read: the block must carry what was last written to it.
    a.set_label(&mut was_read)?;
    buffer_of_slot(&mut a)?;
    a.mov(rcx, qword_ptr(r13 + d(slot::BLOCK)))?;
    a.lea(rsi, qword_ptr(rbx + d(LAST_WRITTEN)))?;
    a.mov(rdx, qword_ptr(rsi + rcx * 8))?;
    a.cmp(qword_ptr(rdi), rdx)?;
    a.jne(bad)?;
    a.mov(rax, rdx)?;
    a.mov(r8, CHECK_MUL)?;
    a.imul_2(rax, r8)?;
    a.xor(rax, rcx)?;
    a.cmp(qword_ptr(rdi + 8), rax)?;
    a.jne(bad)?;
    a.inc(qword_ptr(rbx + d(var::READS_VERIFIED)))?;
    a.jmp(start_write)?;
    a.set_label(&mut bad)?;
    a.inc(qword_ptr(rbx + d(var::BAD_READS)))?;
    a.jmp(start_write)?;

    // start_write(r12, r13): the slot's next block, with a new number.
    a.set_label(&mut start_write)?;
    a.mov(rax, qword_ptr(rbx + d(var::DISK_SEQ)))?;
    a.mov(qword_ptr(r13 + d(slot::SEQ)), rax)?;
    a.inc(rax)?;
    a.mov(qword_ptr(rbx + d(var::DISK_SEQ)), rax)?;
    a.mov(rax, qword_ptr(r13 + d(slot::ROUND)))?;
    a.lea(rcx, qword_ptr(rax + 1))?;
    a.mov(qword_ptr(r13 + d(slot::ROUND)), rcx)?;
    a.and(eax, (BLOCKS_PER_SLOT - 1) as u32)?;
    a.imul_3(eax, eax, SLOTS as i32)?;
    a.add(rax, r12)?;
    a.mov(qword_ptr(r13 + d(slot::BLOCK)), rax)?;
    buffer_of_slot(&mut a)?;
    a.mov(rdx, qword_ptr(r13 + d(slot::SEQ)))?;
    a.mov(qword_ptr(rdi), rdx)?;
    a.mov(rax, rdx)?;
    a.mov(r8, CHECK_MUL)?;
    a.imul_2(rax, r8)?;
    a.xor(rax, qword_ptr(r13 + d(slot::BLOCK)))?;
    a.mov(qword_ptr(rdi + 8), rax)?;
    a.mov(qword_ptr(r13 + d(slot::PHASE)), 1)?;
    a.mov(esi, 1)?;
    // Falls through to submit.

    // submit(r12, r13, esi = 1 write / 0 read): header, data descriptor's
    // direction, status, then the available ring.
    a.set_label(&mut submit)?;
    let mut is_read = a.create_label();
    a.mov(rdi, r12)?;
    a.shl(rdi, 4)?;
    a.lea(rax, qword_ptr(rbx + d(HEADERS)))?;
    a.add(rdi, rax)?;
    a.mov(dword_ptr(rdi), esi)?;
    a.mov(dword_ptr(rdi + 4), 0)?;
    a.mov(rax, qword_ptr(r13 + d(slot::BLOCK)))?;
    a.shl(rax, (BLOCK_BYTES / 512).trailing_zeros())?;
    a.mov(qword_ptr(rdi + 8), rax)?;
    a.imul_3(rdi, r12, 48)?;
    a.lea(rax, qword_ptr(rbx + d(DESC + 16)))?;
    a.add(rdi, rax)?;
    a.mov(eax, u32::from(DESC_NEXT | DESC_WRITE))?;
    a.test(esi, esi)?;
    a.jz(is_read)?;
    a.mov(eax, u32::from(DESC_NEXT))?;
    a.set_label(&mut is_read)?;
    a.mov(word_ptr(rdi + 12), ax)?;
    a.lea(rdi, qword_ptr(rbx + d(STATUS)))?;
    a.mov(byte_ptr(rdi + r12), 0xff)?;
    a.lea(rdi, qword_ptr(rbx + d(AVAIL)))?;
    a.mov(rax, qword_ptr(rbx + d(var::AVAIL_IDX)))?;
    a.mov(ecx, eax)?;
    a.and(ecx, u32::from(QUEUE_SIZE - 1))?;
    a.imul_3(edx, r12d, 3)?;
    a.mov(word_ptr(rdi + rcx * 2 + 4), dx)?;
    a.inc(eax)?;
    a.and(eax, 0xffff)?;
    a.mov(qword_ptr(rbx + d(var::AVAIL_IDX)), rax)?;
    // x86 stores are seen in order: the entry before the index.
    a.mov(word_ptr(rdi + 2), ax)?;
    a.mov(r15d, 1)?;
    a.ret()?;

    // print_line: "L<seq> <seq·K>\n", then the number moves on.
    a.set_label(&mut print_line)?;
    a.mov(rdx, qword_ptr(rbx + d(var::PORT)))?;
    a.mov(al, b'L' as u32)?;
    a.out(dx, al)?;
    a.mov(rax, qword_ptr(rbx + d(var::CONSOLE_SEQ)))?;
    a.call(hex16)?;
    a.mov(al, b' ' as u32)?;
    a.out(dx, al)?;
    a.mov(rax, qword_ptr(rbx + d(var::CONSOLE_SEQ)))?;
    a.mov(r8, CHECK_MUL)?;
    a.imul_2(rax, r8)?;
    a.call(hex16)?;
    a.mov(al, b'\n' as u32)?;
    a.out(dx, al)?;
    a.inc(qword_ptr(rbx + d(var::CONSOLE_SEQ)))?;
    a.ret()?;

    a.set_label(&mut fill_poll)?;
    fill_poll_body(&mut a)?;

    // write_list: one locked store (an OR of 0) to each listed address.
    a.set_label(&mut write_list)?;
    let mut each = a.create_label();
    a.mov(rcx, qword_ptr(rbx + d(var::WRITE_COUNT)))?;
    a.lea(rsi, qword_ptr(rbx + d(WRITE_LIST)))?;
    a.set_label(&mut each)?;
    a.mov(rdi, qword_ptr(rsi))?;
    a.lock().or(byte_ptr(rdi), 0)?;
    a.add(rsi, 8)?;
    a.dec(rcx)?;
    a.jnz(each)?;
    a.mov(qword_ptr(rbx + d(var::WRITE_COUNT)), 0)?;
    a.inc(qword_ptr(rbx + d(var::WRITE_DONE)))?;
    a.ret()?;

    // hex16(rax, dx = port): 16 lowercase hex digits, one `out` each.
    a.set_label(&mut hex16)?;
    let mut digit = a.create_label();
    let mut decimal = a.create_label();
    a.mov(rsi, rax)?;
    a.mov(ecx, 16)?;
    a.set_label(&mut digit)?;
    a.rol(rsi, 4)?;
    a.mov(eax, esi)?;
    a.and(eax, 0xf)?;
    a.cmp(eax, 10)?;
    a.jb(decimal)?;
    a.add(eax, u32::from(b'a' - 10 - b'0'))?;
    a.set_label(&mut decimal)?;
    a.add(eax, u32::from(b'0'))?;
    a.out(dx, al)?;
    a.dec(ecx)?;
    a.jnz(digit)?;
    a.ret()?;

    let code = a.assemble(CODE)?;
    if code.len() > layout::CODE_MAX {
        return Err(GuestError::TooLarge(code.len()));
    }
    Ok(code)
}

/// If this vCPU drives the fill device: initialize it (rbp pointing at its
/// registers for the while), describe its buffers, post them all, notify.
fn fill_init(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut none = a.create_label();
    a.mov(rax, qword_ptr(rbx + d(var::FILL_MMIO)))?;
    a.test(rax, rax)?;
    a.jz(none)?;
    a.push(rbp)?;
    a.mov(rbp, rax)?;
    init_device(a, [FILL_DESC, FILL_AVAIL, FILL_USED])?;
    for s in 0..FILL_SLOTS {
        a.lea(rdi, qword_ptr(rbx + d(FILL_DESC + s * 16)))?;
        a.lea(
            rax,
            qword_ptr(rbx + d(FILL_BUFFERS + s * FILL_BUFFER_BYTES)),
        )?;
        a.mov(qword_ptr(rdi), rax)?;
        a.mov(dword_ptr(rdi + 8), FILL_BUFFER_BYTES as u32)?;
        a.mov(word_ptr(rdi + 12), u32::from(DESC_WRITE))?;
        a.mov(word_ptr(rdi + 14), 0)?;
        a.lea(rdi, qword_ptr(rbx + d(FILL_AVAIL + 4 + s * 2)))?;
        a.mov(word_ptr(rdi), s as u32)?;
    }
    a.mov(qword_ptr(rbx + d(var::FILL_AVAIL_IDX)), FILL_SLOTS as i32)?;
    a.lea(rdi, qword_ptr(rbx + d(FILL_AVAIL)))?;
    a.mov(word_ptr(rdi + 2), FILL_SLOTS as u32)?;
    a.mov(dword_ptr(rbp + d(mmio::QUEUE_NOTIFY)), 0)?;
    a.pop(rbp)?;
    a.set_label(&mut none)?;
    // The main loop's label follows; an instruction takes only one.
    a.nop()
}

/// fill_poll: every filled buffer is checked (its number once, in order,
/// with its check) and posted again; one notify if any was.
fn fill_poll_body(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut next = a.create_label();
    let mut done = a.create_label();
    let mut check_ok = a.create_label();
    let mut in_order = a.create_label();
    let mut doubled = a.create_label();
    let mut repost = a.create_label();
    let mut quiet = a.create_label();
    a.xor(r14d, r14d)?;
    a.set_label(&mut next)?;
    a.lea(rdi, qword_ptr(rbx + d(FILL_USED)))?;
    a.movzx(eax, word_ptr(rdi + 2))?;
    a.mov(rdx, qword_ptr(rbx + d(var::FILL_SEEN)))?;
    a.cmp(ax, dx)?;
    a.je(done)?;
    a.mov(ecx, edx)?;
    a.and(ecx, u32::from(QUEUE_SIZE - 1))?;
    a.mov(esi, dword_ptr(rdi + rcx * 8 + 4))?;
    a.inc(edx)?;
    a.and(edx, 0xffff)?;
    a.mov(qword_ptr(rbx + d(var::FILL_SEEN)), rdx)?;
    // rdi = the buffer of descriptor esi; rdx = its number.
    a.mov(eax, esi)?;
    a.shl(rax, FILL_BUFFER_BYTES.trailing_zeros())?;
    a.lea(rdi, qword_ptr(rbx + d(FILL_BUFFERS)))?;
    a.add(rdi, rax)?;
    a.mov(rdx, qword_ptr(rdi))?;
    a.mov(rax, rdx)?;
    a.mov(r8, CHECK_MUL)?;
    a.imul_2(rax, r8)?;
    a.xor(rax, 0xf111)?;
    a.cmp(qword_ptr(rdi + 8), rax)?;
    a.je(check_ok)?;
    a.inc(qword_ptr(rbx + d(var::FILL_BAD)))?;
    a.set_label(&mut check_ok)?;
    a.inc(qword_ptr(rbx + d(var::FILL_DONE)))?;
    a.mov(rcx, qword_ptr(rbx + d(var::FILL_NEXT)))?;
    a.cmp(rdx, rcx)?;
    a.je(in_order)?;
    a.jb(doubled)?;
    a.mov(rax, rdx)?;
    a.sub(rax, rcx)?;
    a.add(qword_ptr(rbx + d(var::FILL_LOST)), rax)?;
    a.jmp(in_order)?;
    a.set_label(&mut doubled)?;
    a.inc(qword_ptr(rbx + d(var::FILL_DOUBLED)))?;
    a.jmp(repost)?;
    a.set_label(&mut in_order)?;
    a.lea(rax, qword_ptr(rdx + 1))?;
    a.mov(qword_ptr(rbx + d(var::FILL_NEXT)), rax)?;
    a.set_label(&mut repost)?;
    a.lea(rdi, qword_ptr(rbx + d(FILL_AVAIL)))?;
    a.mov(rax, qword_ptr(rbx + d(var::FILL_AVAIL_IDX)))?;
    a.mov(ecx, eax)?;
    a.and(ecx, u32::from(QUEUE_SIZE - 1))?;
    a.mov(word_ptr(rdi + rcx * 2 + 4), si)?;
    a.inc(eax)?;
    a.and(eax, 0xffff)?;
    a.mov(qword_ptr(rbx + d(var::FILL_AVAIL_IDX)), rax)?;
    // x86 stores are seen in order: the entry before the index.
    a.mov(word_ptr(rdi + 2), ax)?;
    a.inc(r14d)?;
    a.jmp(next)?;
    a.set_label(&mut done)?;
    a.test(r14d, r14d)?;
    a.jz(quiet)?;
    a.mov(rax, qword_ptr(rbx + d(var::FILL_MMIO)))?;
    a.mov(dword_ptr(rax + d(mmio::QUEUE_NOTIFY)), 0)?;
    a.set_label(&mut quiet)?;
    a.ret()
}

/// rdi = the data buffer of slot r12.
fn buffer_of_slot(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.mov(rdi, r12)?;
    a.shl(rdi, BLOCK_BYTES.trailing_zeros())?;
    a.lea(rax, qword_ptr(rbx + d(BUFFERS)))?;
    a.add(rdi, rax)
}

/// virtio-mmio registers the driver writes.
pub mod mmio {
    /// Which feature word `DRIVER_FEATURES` means.
    pub const DRIVER_FEATURES_SEL: u64 = 0x24;
    /// The features the driver accepts.
    pub const DRIVER_FEATURES: u64 = 0x20;
    /// Which queue the queue registers mean.
    pub const QUEUE_SEL: u64 = 0x30;
    /// The queue's size.
    pub const QUEUE_NUM: u64 = 0x38;
    /// The queue is set up.
    pub const QUEUE_READY: u64 = 0x44;
    /// The driver has new requests.
    pub const QUEUE_NOTIFY: u64 = 0x50;
    /// The device status.
    pub const STATUS: u64 = 0x70;
    /// Descriptor table address, low and high words.
    pub const QUEUE_DESC: u64 = 0x80;
    /// Available ring address.
    pub const QUEUE_DRIVER: u64 = 0x90;
    /// Used ring address.
    pub const QUEUE_DEVICE: u64 = 0xa0;
}

const DESC_NEXT: u16 = 1;
const DESC_WRITE: u16 = 2;

/// The driver's half of virtio initialization (virtio 1.2, 3.1.1): reset,
/// ACKNOWLEDGE, DRIVER, accept VERSION_1 only, FEATURES_OK, set up queue
/// 0 (in the lane, below 4 GiB), DRIVER_OK. Straight-line MMIO writes:
/// each one exits to the VMM.
fn init_device(a: &mut CodeAssembler, rings: [u64; 3]) -> Result<(), IcedError> {
    use mmio::*;
    let w =
        |a: &mut CodeAssembler, reg: u64, value: u64| a.mov(dword_ptr(rbp + d(reg)), value as u32);
    w(a, STATUS, 0)?;
    w(a, STATUS, 1)?;
    w(a, STATUS, 3)?;
    w(a, DRIVER_FEATURES_SEL, 1)?;
    w(a, DRIVER_FEATURES, 1)?; // VIRTIO_F_VERSION_1 (bit 32)
    w(a, DRIVER_FEATURES_SEL, 0)?;
    w(a, DRIVER_FEATURES, 0)?;
    w(a, STATUS, 0xb)?;
    w(a, QUEUE_SEL, 0)?;
    w(a, QUEUE_NUM, u64::from(QUEUE_SIZE))?;
    for (reg, addr) in [QUEUE_DESC, QUEUE_DRIVER, QUEUE_DEVICE]
        .into_iter()
        .zip(rings)
    {
        a.lea(rax, qword_ptr(rbx + d(addr)))?;
        a.mov(dword_ptr(rbp + d(reg)), eax)?;
        w(a, reg + 4, 0)?;
    }
    w(a, QUEUE_READY, 1)?;
    w(a, STATUS, 0xf)
}

/// Slot `s`'s chain: header (device reads), data (either way), status
/// (device writes).
fn write_descriptors(a: &mut CodeAssembler, s: u64) -> Result<(), IcedError> {
    let first = s * 3;
    let parts = [
        (HEADERS + s * 16, 16u32, DESC_NEXT, first + 1),
        (
            BUFFERS + s * BLOCK_BYTES,
            BLOCK_BYTES as u32,
            DESC_NEXT,
            first + 2,
        ),
        (STATUS + s, 1, DESC_WRITE, 0),
    ];
    for (i, (addr, len, flags, next)) in parts.into_iter().enumerate() {
        let at = DESC + (first + i as u64) * 16;
        a.lea(rdi, qword_ptr(rbx + d(at)))?;
        a.lea(rax, qword_ptr(rbx + d(addr)))?;
        a.mov(qword_ptr(rdi), rax)?;
        a.mov(dword_ptr(rdi + 8), len)?;
        a.mov(word_ptr(rdi + 12), u32::from(flags))?;
        a.mov(word_ptr(rdi + 14), next as u32)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_assembles_into_its_area() {
        let code = program(GuestParams {
            sweep_per_loop: 8,
            line_every: 16,
        })
        .unwrap();
        assert!(!code.is_empty() && code.len() < CODE_MAX);
    }
}
