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
    }
    Ok(sum)
}

impl GuestProbe for MiniProbe {
    fn read(&self, vm: &dyn Vm) -> Result<GuestCheck, ProbeError> {
        let c = counters(vm)?;
        Ok(GuestCheck {
            progress: c.reads_verified,
            errors: c.bad_reads + c.status_errors,
        })
    }
}
