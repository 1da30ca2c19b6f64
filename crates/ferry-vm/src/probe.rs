//! A guest's own checks, as the engine may read them.
//!
//! The engine proves a migration with the memory digest, which needs no
//! particular guest. Some guests also check themselves: memstress stamps every
//! write and counts stale pages, a console guest numbers its lines. A VMM that
//! has such a guest passes a [`GuestProbe`]; the engine reads it on the source
//! once the vCPUs are paused for the switchover, and on the destination just
//! before the guest resumes, and puts what it read in the summaries. It never
//! reads guest memory for progress itself, and a VMM without a probe loses
//! nothing but those two readings.

use crate::vm::Vm;
use serde::{Deserialize, Serialize};

/// What a guest's own checks say at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestCheck {
    /// Work the guest has completed so far (memstress: passes, summed over
    /// vCPUs). It only grows while the guest runs, so two readings tell
    /// whether it ran in between.
    pub progress: u64,
    /// Errors the guest's self-check has counted so far (memstress: stamp
    /// mismatches). Any rise across a migration means it lost or corrupted
    /// something the guest could see.
    pub errors: u64,
}

impl GuestCheck {
    /// What changed from `earlier` to `self`.
    pub fn since(&self, earlier: &GuestCheck) -> GuestCheck {
        GuestCheck {
            progress: self.progress.wrapping_sub(earlier.progress),
            errors: self.errors.wrapping_sub(earlier.errors),
        }
    }
}

/// Reads a guest's own checks; see the module docs.
pub trait GuestProbe: Send + Sync + std::fmt::Debug {
    /// Reads the checks of the guest running in `vm` (its memory, or
    /// whatever the VMM keeps of it). The vCPUs may be paused or running.
    fn read(&self, vm: &dyn Vm) -> Result<GuestCheck, ProbeError>;
}

/// Why a guest's checks could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// Guest memory could not be read.
    #[error("reading the guest's record")]
    Ram(#[from] crate::RamError),
    /// The guest's record is not what the probe reads (another guest, one
    /// not yet started), in the probe's words.
    #[error("{0}")]
    Record(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_the_difference() {
        let a = GuestCheck {
            progress: 10,
            errors: 1,
        };
        let b = GuestCheck {
            progress: 25,
            errors: 1,
        };
        assert_eq!(
            b.since(&a),
            GuestCheck {
                progress: 15,
                errors: 0
            }
        );
    }
}
