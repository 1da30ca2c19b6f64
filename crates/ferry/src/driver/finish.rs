//! How a migration this process ran ends on screen: the summary, the exit
//! code, and on a failure proof that the source guest still runs.

use crate::summary::{self, DestinationChecks};
use ferry_engine::{MigrationSummary, Outcome};
use ferry_memstress::{read_progress, VcpuProgress};
use ferry_vm::Vm;
use std::process::ExitCode;
use std::time::Duration;

/// The line that shows a failed migration's source guest still runs: the
/// page accesses its vCPUs made over half a second (a pass over a large
/// region can take longer than that on a slow host; an access cannot),
/// with the passes and the stamp mismatches so far. Also the mismatches.
pub fn source_still_runs(vm: &dyn Vm) -> (String, u64) {
    let vcpus = vm.vcpus();
    let before = read_progress(vm.ram(), vcpus).unwrap_or_default();
    std::thread::sleep(Duration::from_millis(500));
    let after = read_progress(vm.ram(), vcpus).unwrap_or_default();
    let delta = |f: fn(&VcpuProgress) -> u64| -> u64 {
        after
            .iter()
            .zip(&before)
            .map(|(a, b)| f(a).saturating_sub(f(b)))
            .sum()
    };
    let mismatches: u64 = after.iter().map(|p| p.mismatches).sum();
    let line = format!(
        "the source VM is still running: {} guest page accesses in the last 0.5 s ({} passes), {mismatches} guest mismatches",
        delta(|p| p.accesses),
        delta(|p| p.passes),
    );
    (line, mismatches)
}

/// Prints the summary (with what the destination said after the
/// switchover, where it said it) and picks the exit code. On failure,
/// shows that the source VM still runs.
pub fn finish(
    vm: &mut dyn Vm,
    s: &MigrationSummary,
    after: &DestinationChecks,
    json: bool,
) -> ExitCode {
    let mut s = s.clone();
    let ok = s.status == Outcome::Completed
        && s.digest_match
        && s.guest.guest_mismatches.unwrap_or(0) == 0
        && s.error.is_none();
    if s.status == Outcome::Failed && vm.is_running() {
        // Show that the guest survived: it still makes progress, and its own
        // stamp checks still pass.
        let (line, mismatches) = source_still_runs(vm);
        s.guest.mismatches_before = Some(mismatches);
        s.guest.guest_mismatches = Some(mismatches);
        println!("{line}");
    }
    println!("{}", summary::render(&s, after));
    if json {
        println!("{}", summary::json(&s, after));
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
