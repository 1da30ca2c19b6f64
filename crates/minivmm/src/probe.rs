//! The guest's own checks as the engine reads them: progress is the disk
//! blocks read back and verified, errors are bad reads and failed
//! requests. The guest keeps these counters in its memory.

use crate::layout::{var, VARS};
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

/// Reads the counters out of `vm`'s memory.
pub fn counters(vm: &dyn Vm) -> Result<Counters, RamError> {
    let ram = vm.ram();
    let get = |off: u64| ram.load_u64(Gpa(VARS + off));
    Ok(Counters {
        console_lines: get(var::CONSOLE_SEQ)?,
        writes: get(var::WRITES_DONE)?,
        reads_verified: get(var::READS_VERIFIED)?,
        bad_reads: get(var::BAD_READS)?,
        status_errors: get(var::STATUS_ERRORS)?,
    })
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
