//! vCPU state, for a VM that declares [`ferry_vm::VcpuState`]: saved after
//! its guest ran, restored into a fresh VM and saved again, it is the same;
//! and a cut-short state is refused, not loaded.

use super::pages::{memory_changes, PageHashes, PagesError};
use super::pause::WRITES_DEADLINE;
use super::sections::first_difference;
use super::{failure, step, Check, Failure, Saved, StepError, Verdict, VmmUnderTest};
use ferry_vm::{restore_vcpu_state, save_vcpu_state, Vm};

/// Why [`vcpu_state_round_trips`] failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A call into the VM failed.
    #[error(transparent)]
    Step(#[from] StepError),
    /// Reading guest memory failed.
    #[error(transparent)]
    Pages(#[from] PagesError),
    /// The source declares vCPU state and the destination does not.
    #[error("the source VM declares VcpuState and the destination VM does not")]
    NotAtDestination,
    /// The source saved nothing.
    #[error("the source VM declares VcpuState and saved none (0 bytes)")]
    Empty,
    /// Saved again after its restore, the state differs.
    #[error(
        "saved ({} bytes), restored into a fresh VM and saved again ({} bytes), vCPU state \
         differs: {}", saved.len(), resaved.len(), first_difference(saved, resaved)
    )]
    Differs {
        /// The source's state.
        saved: Vec<u8>,
        /// The destination's, saved again.
        resaved: Vec<u8>,
    },
    /// A fresh VM loaded vCPU state cut to half its length.
    #[error(
        "a fresh VM loaded vCPU state cut short to {len} of its {of} bytes, rather than \
         refusing it (VmError::BadVcpuState)"
    )]
    TruncatedLoaded {
        /// The bytes it was given.
        len: usize,
        /// The whole state's length.
        of: usize,
    },
}

/// Runs a source VM until its guest writes, pauses it, saves its vCPU
/// state, restores that into a fresh destination VM and saves it again:
/// the same state ([`crate::conformance::VmmUnderTest::same_state`]).
/// Then a second fresh VM must refuse the state cut to half its length.
/// Skipped for a VM that declares no `VcpuState`.
pub fn vcpu_state_round_trips<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, Failure> {
    run(vmm).map_err(|e| failure(Check::VcpuStateRoundTrip, vmm, e))
}

fn run<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, VcpuError> {
    let mut src = step("building the source VM", vmm.source())?;
    if src.vcpu_state().is_none() {
        return Ok(Verdict::skipped(
            "the VM declares no VcpuState (its vCPU state, if any, travels in its sections)",
        ));
    }
    let before = PageHashes::of(src.ram())?;
    step("the source VM's start", src.start())?;
    // Whether or not the guest writes, its vCPUs have run by then.
    memory_changes(&src, &before, WRITES_DEADLINE)?;
    step("the source VM's pause", src.pause())?;
    let saved = step("the source VM's save_vcpus", save_vcpu_state(&mut src))?;
    if saved.is_empty() {
        return Err(VcpuError::Empty);
    }
    let config = src.vmm_config();
    let mut dst = step("building the destination VM", vmm.destination(&config))?;
    if dst.vcpu_state().is_none() {
        return Err(VcpuError::NotAtDestination);
    }
    step(
        "the destination VM's restore_vcpus",
        restore_vcpu_state(&mut dst, &saved),
    )?;
    let resaved = step(
        "the destination VM's save_vcpus after its restore",
        save_vcpu_state(&mut dst),
    )?;
    if !vmm.same_state(Saved::Vcpus(&saved), Saved::Vcpus(&resaved)) {
        return Err(VcpuError::Differs { saved, resaved });
    }
    let mut other = step("building a second destination VM", vmm.destination(&config))?;
    let half = &saved[..saved.len() / 2];
    if restore_vcpu_state(&mut other, half).is_ok() {
        return Err(VcpuError::TruncatedLoaded {
            len: half.len(),
            of: saved.len(),
        });
    }
    Ok(Verdict::passed(format!(
        "{} bytes of state for {} vCPUs; half of it refused",
        saved.len(),
        src.vcpus()
    )))
}
