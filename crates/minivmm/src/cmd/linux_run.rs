//! Running a Linux guest from the command line: waiting for its checker
//! to start, telling it that it moved, and running it until it powers off.

use ferry_engine::vmm::Vm;
use minivmm::linux::PowerRequest;
use minivmm::MiniVm;
use std::path::Path;
use std::time::{Duration, Instant};

/// Waits until the checker has printed `lines` numbered lines on the
/// console file `console` (vCPU 0's), so that a migration moves a guest
/// that runs its checks, not one still booting.
pub fn wait_for_checker(
    vm: &MiniVm,
    console: Option<&Path>,
    lines: u64,
    limit: Duration,
) -> Result<Duration, String> {
    let start = Instant::now();
    let Some(console) = console else {
        return Err(
            "--guest linux needs --console FILE: the checker's lines are read there".into(),
        );
    };
    loop {
        vm.check_health().map_err(|e| e.to_string())?;
        if let Some(exit) = vm.guest_exit() {
            return Err(format!("the guest ended ({exit:?}) before its checker ran"));
        }
        let text = std::fs::read_to_string(console).unwrap_or_default();
        let seen = minivmm::checks::linux_console(&text).lines.lines;
        if seen >= lines {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= limit {
            return Err(format!(
                "the guest's checker printed {seen} of {lines} lines within {} s of boot",
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the guest until it powers off (or asks for another sleep state),
/// a vCPU stops, or `limit` passes (`None`).
pub fn run_until_exit(vm: &MiniVm, limit: Duration) -> Result<Option<PowerRequest>, String> {
    let start = Instant::now();
    loop {
        if let Some(exit) = vm.guest_exit() {
            return Ok(Some(exit));
        }
        vm.check_health().map_err(|e| e.to_string())?;
        if start.elapsed() >= limit {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How the summary names a guest's end.
pub fn exit_name(exit: Option<PowerRequest>) -> Option<String> {
    exit.map(|e| match e {
        PowerRequest::Off => "poweroff".to_string(),
        PowerRequest::Other(s) => format!("sleep state S{s}"),
    })
}
