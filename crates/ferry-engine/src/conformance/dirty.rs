//! Dirty sources miss no page: the VM's guest and devices write pages the
//! kit chooses in every region, and every one must come back from the
//! collection a migration makes (the VM's dirty log, its dirty sources and
//! `GuestRam`'s tracked writes, through the engine's own code).

use super::pages::{chosen_pages, list_frames};
use super::{failure, step, Check, Failure, StepError, Verdict, VmmUnderTest};
use crate::dirty_logs;
use crate::error::MigrationError;
use ferry_vm::{error_chain, DirtyPages, Gfn, Vm};

/// Why [`dirty_pages_reported`] failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum DirtyError {
    /// A call into the VM or the hook failed.
    #[error(transparent)]
    Step(#[from] StepError),
    /// Starting or collecting the dirty logs failed, as it would fail a
    /// migration.
    #[error("{what}: {}", error_chain(source))]
    Logs {
        /// What the kit was doing.
        what: &'static str,
        /// The engine's error.
        source: MigrationError,
    },
    /// Pages the VM wrote that no log reported: a migration would not send
    /// them again, and the digest would fail it.
    #[error(
        "{} of the {written} pages the guest and devices wrote were reported by no dirty log, \
         dirty source or GuestRam: {frames}",
        missed.len()
    )]
    Missed {
        /// The frames not reported.
        missed: Vec<Gfn>,
        /// How many frames were written.
        written: usize,
        /// The frames, described.
        frames: String,
    },
}

/// Has a running source VM write [`chosen_pages`] through
/// [`VmmUnderTest::write_pages`] with its dirty logs on, collects them as
/// the engine does while the VM runs and once more after `pause` (the
/// switchover's last harvest), and checks that every page written was
/// reported.
pub fn dirty_pages_reported<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, Failure> {
    run(vmm).map_err(|e| failure(Check::DirtyPages, vmm, e))
}

fn run<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, DirtyError> {
    let mut vm = step("building the source VM", vmm.source())?;
    step("the source VM's start", vm.start())?;
    dirty_logs::start(&mut vm).map_err(|source| DirtyError::Logs {
        what: "starting the dirty logs",
        source,
    })?;
    let outcome = written_and_reported(vmm, &mut vm);
    dirty_logs::stop(&mut vm, "after the conformance check");
    let (pages, reported) = outcome?;
    let missed: Vec<Gfn> = pages
        .iter()
        .copied()
        .filter(|&g| !reported.contains(g))
        .collect();
    if !missed.is_empty() {
        return Err(DirtyError::Missed {
            frames: list_frames(vm.ram(), &missed),
            missed,
            written: pages.len(),
        });
    }
    Ok(Verdict::passed(format!(
        "{} pages in {} regions, each reported",
        pages.len(),
        vm.ram().slots().len()
    )))
}

/// Writes the chosen pages and returns them with what the logs reported.
fn written_and_reported<V: VmmUnderTest>(
    vmm: &mut V,
    vm: &mut V::Vm,
) -> Result<(Vec<Gfn>, DirtyPages), DirtyError> {
    let frames = vm.ram().pages();
    let collect = |vm: &mut V::Vm, into: &mut DirtyPages, what| {
        dirty_logs::collect(vm, into).map_err(|source| DirtyError::Logs { what, source })
    };
    // What was dirty before the writes is no evidence of them.
    collect(
        vm,
        &mut DirtyPages::new(frames),
        "collecting the dirty logs before the writes",
    )?;
    let pages = chosen_pages(vm.ram());
    step("the VMM's write_pages", vmm.write_pages(vm, &pages))?;
    let mut reported = DirtyPages::new(frames);
    collect(
        vm,
        &mut reported,
        "collecting the dirty logs while the VM runs",
    )?;
    step("the source VM's pause", vm.pause())?;
    collect(
        vm,
        &mut reported,
        "collecting the dirty logs after the pause",
    )?;
    Ok((pages, reported))
}
