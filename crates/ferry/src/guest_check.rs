//! The memstress guest's own checks around a switchover, as ferry's VMs
//! report them. The engine reads the probe at the pause and at the resume
//! and returns as soon as the destination commits; whether the guest then
//! really works here is this module's question, not the engine's.

use ferry_memstress::{read_progress, MemstressProbe};
use ferry_vm::{GuestCheck, GuestProbe, Vm};
use std::time::{Duration, Instant};

/// Longest the destination waits for every vCPU to complete a pass before
/// it reports anyway.
pub const MAX_RUN_AFTER: Duration = Duration::from_secs(120);
/// How often the guest's health is checked while it runs.
const HEALTH_POLL: Duration = Duration::from_millis(100);

/// What the guest did after the switchover.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AfterSwitchover {
    /// Passes and mismatches since the resume.
    pub since_resume: GuestCheck,
    /// A vCPU that stopped, or counters that could not be read.
    pub problem: Option<String>,
}

/// Runs the guest of `vm` for `run_after`, and on until every vCPU has
/// completed a pass since now (at most [`MAX_RUN_AFTER`]), watching its
/// health; then reads the probe and returns what changed since `at_resume`.
pub fn after_switchover(
    vm: &dyn Vm,
    at_resume: GuestCheck,
    run_after: Duration,
) -> AfterSwitchover {
    let started = Instant::now();
    let vcpus = vm.vcpus();
    let at_start = read_progress(vm.ram(), vcpus).unwrap_or_default();
    let mut problem = None;
    loop {
        if let Err(e) = vm.check_health() {
            problem = Some(e.to_string());
            break;
        }
        let elapsed = started.elapsed();
        if elapsed >= MAX_RUN_AFTER {
            break;
        }
        if elapsed >= run_after {
            let now = read_progress(vm.ram(), vcpus).unwrap_or_default();
            let each_passed = now.len() == at_start.len()
                && now.iter().zip(&at_start).all(|(n, s)| n.passes > s.passes);
            if each_passed {
                break;
            }
        }
        let left = run_after.saturating_sub(elapsed);
        std::thread::sleep(HEALTH_POLL.min(left.max(Duration::from_millis(5))));
    }
    let since_resume = match MemstressProbe.read(vm) {
        Ok(now) => now.since(&at_resume),
        Err(e) => {
            problem.get_or_insert(ferry_vm::error_chain(&e));
            GuestCheck::default()
        }
    };
    AfterSwitchover {
        since_resume,
        problem,
    }
}
