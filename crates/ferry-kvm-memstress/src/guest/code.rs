//! The memstress loop as x86-64 machine code.
//!
//! The loop is the one documented in `ferry_memstress`, register for
//! register. All loop state lives in registers or guest memory, so saving the
//! vCPU registers and RAM captures it exactly, mid-pass included:
//!
//! ```text
//!  rdi params record      rsi progress record    r8  region base
//!  r9  pages in region    r11 page index         r12 shadow array
//!  r13 stamp high bits ((vcpu+1) << 56)          r14 mismatches
//!  r15 access index i     rbx random state       rbp current pass
//!  rax comparand / clock, rcx page address, rdx expected stamp, r10 scratch
//!
//! A write is one unlocked `CMPXCHG` of the expected stamp for the new one:
//! a single write access that both checks and stores, so dirty tracking
//! costs one write-protection fault per page, as in `dirty_log_perf_test`.
//! ```
//!
//! Progress is published to the progress record in guest memory (the host reads
//! it without an exit). A busy guest never exits, because an exit costs tens of
//! microseconds here (docs/kvm-host-devices.md); a rate-limited guest a
//! millisecond or more ahead of schedule asks the host to sleep it (`out` to
//! `SLEEP_PORT`), like an idle guest halting on a timer. The host stops vCPUs
//! by signalling their threads.

use ferry_memstress::{param, progress, RATE_BURST_PAGES, SLEEP_PORT};
use iced_x86::code_asm::*;

/// LCG multiplier, as in `ferry_memstress::next_rand32`.
const LCG_MUL: u64 = 6364136223846793005;
/// LCG increment.
const LCG_ADD: u64 = 1442695040888963407;

/// Errors assembling the guest.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    /// iced-x86 rejected an instruction or a label.
    #[error("cannot assemble the memstress guest: {0}")]
    Assemble(#[from] IcedError),
}

/// rbx = rbx * LCG_MUL + LCG_ADD (clobbers r10): `next_rand32`'s state step.
fn lcg_step(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.mov(r10, LCG_MUL)?;
    a.imul_2(rbx, r10)?;
    a.mov(r10, LCG_ADD)?;
    a.add(rbx, r10)
}

/// r10 = stamp(vcpu, page = r11, pass = 0): the vCPU and page fields.
fn stamp_without_pass(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.mov(r10, r11)?;
    a.and(r10d, 0xff_ffff)?;
    a.shl(r10, 32)?;
    a.or(r10, r13)
}

/// Publishes pass `rbp` as completed, waits at the benchmark barrier (spin
/// while a pass limit is set and reached), then starts the next pass.
fn end_pass(a: &mut CodeAssembler, pass_loop: CodeLabel) -> Result<(), IcedError> {
    let mut barrier = a.create_label();
    let mut go_on = a.create_label();
    a.mov(qword_ptr(rsi + disp(progress::PASS)), rbp)?;
    a.set_label(&mut barrier)?;
    a.mov(r10, qword_ptr(rdi + disp(param::PASS_LIMIT)))?;
    a.test(r10, r10)?;
    a.jz(go_on)?;
    a.cmp(rbp, r10)?;
    a.jb(go_on)?;
    a.pause()?;
    a.jmp(barrier)?;
    a.set_label(&mut go_on)?;
    a.inc(rbp)?;
    a.jmp(pass_loop)
}

fn disp(offset: u64) -> i32 {
    i32::try_from(offset).expect("record offsets are small")
}

/// Assembles the memstress loop to run at guest address `origin`.
/// The vCPU enters with `rdi` = its parameter record and everything else zero.
pub fn memstress(origin: u64) -> Result<Vec<u8>, CodeError> {
    let mut a = CodeAssembler::new(64)?;
    let mut pass_loop = a.create_label();
    let mut access_loop = a.create_label();
    let mut sequential = a.create_label();
    let mut have_page = a.create_label();
    let mut check = a.create_label();
    let mut stored = a.create_label();
    let mut read_only = a.create_label();
    let mut no_write = a.create_label();
    let mut wait = a.create_label();
    let mut next = a.create_label();
    let mut spin = a.create_label();
    let mut behind = a.create_label();

    // Load parameters. Resuming state (pass, mismatches) comes from the
    // progress record, which is zero on a fresh guest.
    a.mov(rsi, qword_ptr(rdi + disp(param::PROGRESS)))?;
    a.mov(r8, qword_ptr(rdi + disp(param::REGION)))?;
    a.mov(r9, qword_ptr(rdi + disp(param::PAGES)))?;
    a.mov(r12, qword_ptr(rdi + disp(param::SHADOW)))?;
    a.mov(r13, qword_ptr(rdi + disp(param::VCPU)))?;
    a.inc(r13)?;
    a.shl(r13, 56)?;
    a.mov(rbx, qword_ptr(rdi + disp(param::SEED)))?;
    a.mov(rbp, qword_ptr(rsi + disp(progress::PASS)))?;
    a.inc(rbp)?;
    a.mov(r14, qword_ptr(rsi + disp(progress::MISMATCHES)))?;

    a.set_label(&mut pass_loop)?;
    a.xor(r15, r15)?;
    a.rdtsc()?;
    a.shl(rdx, 32)?;
    a.or(rax, rdx)?;
    a.mov(qword_ptr(rsi + disp(progress::PASS_START)), rax)?;

    a.set_label(&mut access_loop)?;
    // Pick the page: random order draws from the LCG, sequential is i * stride.
    a.cmp(qword_ptr(rdi + disp(param::RANDOM)), 0)?;
    a.je(sequential)?;
    lcg_step(&mut a)?;
    a.mov(r11, rbx)?;
    a.shr(r11, 32)?;
    a.imul_2(r11, r9)?;
    a.shr(r11, 32)?;
    a.jmp(have_page)?;
    a.set_label(&mut sequential)?;
    a.mov(r11, r15)?;
    a.imul_2(r11, qword_ptr(rdi + disp(param::STRIDE)))?;
    a.set_label(&mut have_page)?;
    a.mov(rcx, r11)?;
    a.shl(rcx, 12)?;
    a.add(rcx, r8)?;

    // Expected stamp: 0 if never written, else stamp(vcpu, page, shadow[page]).
    a.mov(edx, dword_ptr(r12 + r11 * 4))?;
    a.test(edx, edx)?;
    a.jz(check)?;
    stamp_without_pass(&mut a)?;
    a.or(rdx, r10)?;
    a.set_label(&mut check)?;

    // Write decision: a second LCG draw below the threshold, read from memory
    // every time so the host can change it while the guest runs.
    lcg_step(&mut a)?;
    a.mov(r10, rbx)?;
    a.shr(r10, 32)?;
    a.cmp(r10, qword_ptr(rdi + disp(param::WRITE_THRESHOLD)))?;
    a.jae(read_only)?;

    // Write: check and store in one unlocked CMPXCHG, a single write access,
    // so a write-protected page takes one fault, not a read fault and then a
    // write fault. ZF clear means the page did not hold the expected stamp.
    stamp_without_pass(&mut a)?;
    a.mov(eax, ebp)?;
    a.or(r10, rax)?;
    a.mov(rax, rdx)?;
    a.cmpxchg(qword_ptr(rcx), r10)?;
    a.je(stored)?;
    a.inc(r14)?;
    a.mov(qword_ptr(rsi + disp(progress::MISMATCHES)), r14)?;
    a.mov(qword_ptr(rcx), r10)?;
    a.set_label(&mut stored)?;
    a.mov(dword_ptr(r12 + r11 * 4), ebp)?;
    a.inc(qword_ptr(rsi + disp(progress::WRITES)))?;
    a.jmp(no_write)?;

    // Read: just check.
    a.set_label(&mut read_only)?;
    a.cmp(qword_ptr(rcx), rdx)?;
    a.je(no_write)?;
    a.inc(r14)?;
    a.mov(qword_ptr(rsi + disp(progress::MISMATCHES)), r14)?;
    a.set_label(&mut no_write)?;
    a.inc(r15)?;
    // Published per access, so a host reading progress over a fraction of
    // a pass (a reader's share of a short migration) sees it.
    a.inc(qword_ptr(rsi + disp(progress::ACCESSES)))?;

    // Rate limit: spin until (now - pass_start) >= i * tsc_per_page. Behind
    // by more than RATE_BURST_PAGES pages' worth, pass_start moves up so that
    // only that much is made up. A clock that went backwards (as after a
    // migration) reads as far behind, so the schedule restarts from now.
    a.mov(r10, qword_ptr(rdi + disp(param::TSC_PER_PAGE)))?;
    a.test(r10, r10)?;
    a.jz(next)?;
    a.imul_2(r10, r15)?;
    a.set_label(&mut wait)?;
    a.rdtsc()?;
    a.shl(rdx, 32)?;
    a.or(rax, rdx)?;
    a.sub(rax, qword_ptr(rsi + disp(progress::PASS_START)))?;
    a.cmp(rax, r10)?;
    a.jae(behind)?;
    // Ahead of schedule. With sleeping allowed, run on until a millisecond or
    // more ahead, then ask the host to sleep the vCPU for the ticks left (one
    // exit per millisecond of idleness at most). Without, spin page by page.
    a.mov(rcx, r10)?;
    a.sub(rcx, rax)?;
    a.mov(rax, qword_ptr(rdi + disp(param::SLEEP_MIN)))?;
    a.test(rax, rax)?;
    a.jz(spin)?;
    a.cmp(rcx, rax)?;
    a.jb(next)?;
    a.mov(qword_ptr(rsi + disp(progress::SLEEP_TICKS)), rcx)?;
    a.mov(edx, u32::from(SLEEP_PORT))?;
    a.out(dx, al)?;
    a.jmp(wait)?;
    a.set_label(&mut spin)?;
    a.pause()?;
    a.jmp(wait)?;

    // On or behind schedule: rcx = how far behind, rdx = the burst allowed.
    a.set_label(&mut behind)?;
    a.mov(rcx, rax)?;
    a.sub(rcx, r10)?;
    a.mov(rdx, qword_ptr(rdi + disp(param::TSC_PER_PAGE)))?;
    a.imul_3(rdx, rdx, RATE_BURST_PAGES as i32)?;
    a.cmp(rcx, rdx)?;
    a.jbe(next)?;
    a.sub(rcx, rdx)?;
    a.add(qword_ptr(rsi + disp(progress::PASS_START)), rcx)?;

    a.set_label(&mut next)?;
    a.cmp(r15, qword_ptr(rdi + disp(param::ACCESSES)))?;
    a.jb(access_loop)?;
    // End of pass: publish, then start the next one.
    end_pass(&mut a, pass_loop)?;

    Ok(a.assemble(origin)?)
}

/// The probe's loop, for calibration: write one u64 (the pass number) to
/// every page of the region in order, with no check, no random draw and no
/// bookkeeping but the pass counter and the benchmark barrier. `ferry bench
/// dirty-log` runs it next to memstress, so the cost of a write-protection
/// fault on this host is measured in the same run rather than assumed.
pub fn raw_writes(origin: u64) -> Result<Vec<u8>, CodeError> {
    let mut a = CodeAssembler::new(64)?;
    let mut pass_loop = a.create_label();
    let mut page_loop = a.create_label();
    a.mov(rsi, qword_ptr(rdi + disp(param::PROGRESS)))?;
    a.mov(r8, qword_ptr(rdi + disp(param::REGION)))?;
    a.mov(r9, qword_ptr(rdi + disp(param::PAGES)))?;
    a.mov(rbp, qword_ptr(rsi + disp(progress::PASS)))?;
    a.inc(rbp)?;
    a.set_label(&mut pass_loop)?;
    a.mov(rcx, r8)?;
    a.xor(r15, r15)?;
    a.set_label(&mut page_loop)?;
    a.mov(qword_ptr(rcx), rbp)?;
    a.add(rcx, 4096)?;
    a.inc(r15)?;
    a.cmp(r15, r9)?;
    a.jb(page_loop)?;
    a.add(qword_ptr(rsi + disp(progress::ACCESSES)), r9)?;
    a.add(qword_ptr(rsi + disp(progress::WRITES)), r9)?;
    end_pass(&mut a, pass_loop)?;
    Ok(a.assemble(origin)?)
}

/// The write-list program of `ferry_memstress::write_list`: heartbeat,
/// and for each new generation the host asks, a locked `or` of zero into
/// each of this vCPU's share of the listed pages (entries `vcpu`,
/// `vcpu + vcpus`, ...), then the generation published as done. Never
/// exits.
///
/// ```text
///  rdi params record   rsi progress record   r8 list    r13 vCPU index
///  rbp generation      r9 entries            r10 vCPUs  r15 entry index
///  rcx page address
/// ```
pub fn write_list(origin: u64) -> Result<Vec<u8>, CodeError> {
    use ferry_memstress::write_list::{COUNT, ENTRIES, GENERATION, LIST_GPA, VCPUS};
    let mut a = CodeAssembler::new(64)?;
    let mut idle = a.create_label();
    let mut next = a.create_label();
    let mut done = a.create_label();
    a.mov(rsi, qword_ptr(rdi + disp(param::PROGRESS)))?;
    a.mov(r13, qword_ptr(rdi + disp(param::VCPU)))?;
    a.mov(r8, LIST_GPA.0)?;
    a.set_label(&mut idle)?;
    a.inc(qword_ptr(rsi + disp(progress::ACCESSES)))?;
    a.pause()?;
    a.mov(rbp, qword_ptr(r8 + disp(GENERATION)))?;
    a.cmp(rbp, qword_ptr(rsi + disp(progress::PASS)))?;
    a.je(idle)?;
    a.mov(r9, qword_ptr(r8 + disp(COUNT)))?;
    a.mov(r10, qword_ptr(r8 + disp(VCPUS)))?;
    // No vCPUs to share among: write nothing rather than loop for ever.
    a.test(r10, r10)?;
    a.jz(done)?;
    a.mov(r15, r13)?;
    a.set_label(&mut next)?;
    a.cmp(r15, r9)?;
    a.jae(done)?;
    a.mov(rcx, qword_ptr(r8 + r15 * 8 + disp(ENTRIES)))?;
    a.lock().or(qword_ptr(rcx), 0)?;
    a.add(r15, r10)?;
    a.jmp(next)?;
    a.set_label(&mut done)?;
    a.mov(qword_ptr(rsi + disp(progress::PASS)), rbp)?;
    a.jmp(idle)?;
    Ok(a.assemble(origin)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assembles_and_fits_the_code_area() {
        for code in [
            memstress(ferry_memstress::CODE_GPA.0).unwrap(),
            write_list(ferry_memstress::CODE_GPA.0).unwrap(),
        ] {
            assert!(!code.is_empty());
            assert!(code.len() <= ferry_memstress::CODE_MAX);
        }
    }

    #[test]
    fn exits_only_to_ask_for_sleep() {
        let code = memstress(0xc000).unwrap();
        let mut decoder = iced_x86::Decoder::with_ip(64, &code, 0xc000, 0);
        let mut outs = 0;
        for insn in &mut decoder {
            let m = insn.mnemonic();
            assert!(
                !matches!(
                    m,
                    iced_x86::Mnemonic::Hlt
                        | iced_x86::Mnemonic::In
                        | iced_x86::Mnemonic::Cli
                        | iced_x86::Mnemonic::Sti
                ),
                "{m:?} would fault at CPL3"
            );
            outs += usize::from(m == iced_x86::Mnemonic::Out);
        }
        assert_eq!(outs, 1, "one sleep request, nothing else");
    }
}
