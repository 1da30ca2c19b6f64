//! memstress's self-check as the engine's [`GuestProbe`]: passes completed
//! and stamp mismatches, summed over the vCPUs' progress records.

use crate::read_progress;
use ferry_vm::{GuestCheck, GuestProbe, ProbeError, Vm};

/// Reads memstress's progress records (no vCPU exit, no pause needed).
#[derive(Clone, Copy, Debug, Default)]
pub struct MemstressProbe;

impl GuestProbe for MemstressProbe {
    fn read(&self, vm: &dyn Vm) -> Result<GuestCheck, ProbeError> {
        let all = read_progress(vm.ram(), vm.vcpus())?;
        Ok(all.iter().fold(GuestCheck::default(), |c, v| GuestCheck {
            progress: c.progress.wrapping_add(v.passes),
            errors: c.errors.wrapping_add(v.mismatches),
        }))
    }
}
