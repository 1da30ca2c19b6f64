//! What `ferry receive` does once the guest has arrived: checks it ran on
//! here, reports, and serves it or exits with the verdict.

use super::ReceiveArgs;
use crate::control::{self, VmCommand};
use crate::error::CmdError;
use crate::serve::serve_vm_on;
use ferry_engine::ReceiveSummary;
use ferry_vm::Vm;
use std::process::ExitCode;
use std::sync::mpsc::Receiver;

/// `--break-guest-after-resume`: every byte of the memstress guest's code
/// becomes `ud2` (0f 0b); a vCPU faults at its next instruction fetch.
pub(super) fn break_guest(vm: &dyn Vm) {
    let code = ferry_memstress::CODE_GPA.0;
    for at in (code..code + ferry_memstress::CODE_MAX as u64).step_by(8) {
        let _ = vm.ram().store_u64(ferry_vm::Gpa(at), 0x0b0f_0b0f_0b0f_0b0f);
    }
    eprintln!("ferry receive: broke the guest's code on purpose (--break-guest-after-resume)");
}

/// Reports how the arrival went, then serves the guest, or exits with the
/// verdict.
pub(super) fn report(
    a: &ReceiveArgs,
    vm: &mut dyn Vm,
    summary: &ReceiveSummary,
    problem: Option<String>,
    shared: control::Shared,
    commands: Receiver<VmCommand>,
) -> Result<ExitCode, CmdError> {
    let before = summary.guest_at_resume.unwrap_or_default().errors;
    let after = summary.mismatches_after.unwrap_or(0);
    eprintln!(
        "ferry receive: {:?}: resumed in {:.1} ms, digest {}, {} passes after switchover, mismatches {before} before / {after} after",
        summary.status,
        summary.resume_ms,
        if summary.digest_match { "match" } else { "MISMATCH" },
        summary.passes_after.unwrap_or(0),
    );
    if let Some(p) = &problem {
        eprintln!("ferry receive: the guest after switchover: {p}");
    }
    let ok = summary.digest_match && after == 0 && problem.is_none();
    if !a.exit_after_report && ok {
        if summary.paused {
            eprintln!(
                "ferry receive: guest paused here, as it was at the source; cont resumes it; \
                 Ctrl-C to stop"
            );
        } else {
            eprintln!("ferry receive: guest running here; Ctrl-C to stop");
        }
        return serve_vm_on(vm, &a.serving(), shared, commands);
    }
    a.remove_sockets();
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
