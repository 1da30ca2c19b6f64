//! The guest's own checks as the engine reads them: progress is the disk
//! blocks read back and verified, errors are bad reads and failed
//! requests. Each vCPU keeps these counters in its lane; the probe sums
//! them.

use crate::layout::{lane, var, VARS};
use ferry_engine::vmm::{Gpa, GuestCheck, GuestProbe, ProbeError, RamError, Vm};

/// Reads minivmm's guest counters.
#[derive(Debug)]
pub struct MiniProbe;

/// The guest's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Console lines printed.
    pub console_lines: u64,
    /// Disk writes completed.
    pub writes: u64,
    /// Reads back that found the block last written.
    pub reads_verified: u64,
    /// Reads back that did not.
    pub bad_reads: u64,
    /// Requests completed with an error status.
    pub status_errors: u64,
    /// Buffers the fill device filled that the guest checked.
    pub fills: u64,
    /// Fill numbers skipped: buffers lost.
    pub fills_lost: u64,
    /// Fill numbers that came twice.
    pub fills_doubled: u64,
    /// Filled buffers whose check was wrong.
    pub fills_bad: u64,
}

/// Reads vCPU `i`'s counters out of `vm`'s memory.
pub fn vcpu_counters(vm: &dyn Vm, i: u32) -> Result<Counters, RamError> {
    let ram = vm.ram();
    let get = |off: u64| ram.load_u64(Gpa(lane(i) + VARS + off));
    Ok(Counters {
        console_lines: get(var::CONSOLE_SEQ)?,
        writes: get(var::WRITES_DONE)?,
        reads_verified: get(var::READS_VERIFIED)?,
        bad_reads: get(var::BAD_READS)?,
        status_errors: get(var::STATUS_ERRORS)?,
        fills: get(var::FILL_DONE)?,
        fills_lost: get(var::FILL_LOST)?,
        fills_doubled: get(var::FILL_DOUBLED)?,
        fills_bad: get(var::FILL_BAD)?,
    })
}

/// Every vCPU's counters, summed.
pub fn counters(vm: &dyn Vm) -> Result<Counters, RamError> {
    let mut sum = Counters::default();
    for i in 0..vm.vcpus() {
        let c = vcpu_counters(vm, i)?;
        sum.console_lines += c.console_lines;
        sum.writes += c.writes;
        sum.reads_verified += c.reads_verified;
        sum.bad_reads += c.bad_reads;
        sum.status_errors += c.status_errors;
        sum.fills += c.fills;
        sum.fills_lost += c.fills_lost;
        sum.fills_doubled += c.fills_doubled;
        sum.fills_bad += c.fills_bad;
    }
    Ok(sum)
}

impl GuestProbe for MiniProbe {
    /// A Linux guest reports nothing here (progress and errors 0): its
    /// checker's counters are on its console, which `minivmm demo` reads,
    /// and the memory minivmm's own guest keeps them in is the kernel's.
    fn read(&self, vm: &dyn Vm) -> Result<GuestCheck, ProbeError> {
        // A look at the VM's own type, not its config as JSON: the probe
        // runs while the guest is paused.
        let any: &dyn std::any::Any = vm;
        let linux = match any.downcast_ref::<crate::vm::MiniVm>() {
            Some(mini) => mini.config().linux.is_some(),
            None => !vm.vmm_config()["linux"].is_null(),
        };
        if linux {
            return Ok(GuestCheck {
                progress: 0,
                errors: 0,
            });
        }
        let c = counters(vm)?;
        Ok(GuestCheck {
            progress: c.reads_verified,
            errors: c.bad_reads + c.status_errors + c.fills_lost + c.fills_doubled + c.fills_bad,
        })
    }
}
