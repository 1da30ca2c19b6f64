//! After `pause`, guest memory stops changing: read in memory (a hash of
//! every page, twice, with a wait between), not taken from `is_running`,
//! which a VM sets itself. The engine relies on it: what it sends after the
//! pause must be the guest's last word.

use super::pages::{list_frames, memory_changes, PageHashes, PagesError};
use super::{failure, step, Check, Failure, StepError, Verdict, VmmUnderTest};
use ferry_vm::{Gfn, Vm};
use std::time::Duration;

/// How long a paused VM's memory is watched for a write.
pub const PAUSED_WAIT: Duration = Duration::from_millis(200);
/// How long the kit waits for a running guest to write something.
pub const WRITES_DEADLINE: Duration = Duration::from_secs(10);

/// Why [`pause_stops_memory`] failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    /// A call into the VM failed.
    #[error(transparent)]
    Step(#[from] StepError),
    /// Reading guest memory failed.
    #[error(transparent)]
    Pages(#[from] PagesError),
    /// The running guest wrote nothing, so a pause cannot be told from a
    /// guest that idles.
    #[error(
        "the source VM's memory did not change in {deadline:?} {when}: the kit needs a \
         source whose guest writes while it runs"
    )]
    NoWrites {
        /// How long the kit waited.
        deadline: Duration,
        /// After which call.
        when: &'static str,
    },
    /// Memory changed while the VM was paused.
    #[error(
        "{} pages changed in the {wait:?} after pause() returned{}: {frames}",
        changed.len(),
        if *.says_running { "" } else { " (is_running() says false)" }
    )]
    WritesAfterPause {
        /// The frames that changed.
        changed: Vec<Gfn>,
        /// How long the kit watched.
        wait: Duration,
        /// What `is_running` said, for the message.
        says_running: bool,
        /// The frames, described.
        frames: String,
    },
}

/// Starts a source VM, waits until its guest writes, pauses it, and checks
/// that no page of its memory changes over [`PAUSED_WAIT`]; then that
/// `start` resumes it (memory changes again) and a second pause holds too.
pub fn pause_stops_memory<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, Failure> {
    run(vmm).map_err(|e| failure(Check::PauseStopsMemory, vmm, e))
}

fn run<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, PauseError> {
    let mut vm = step("building the source VM", vmm.source())?;
    for (when, pause_step) in [
        ("after start()", "the source VM's pause"),
        (
            "after start() again, following a pause",
            "the source VM's second pause",
        ),
    ] {
        let before = PageHashes::of(vm.ram())?;
        step("the source VM's start", vm.start())?;
        if !memory_changes(&vm, &before, WRITES_DEADLINE)? {
            return Err(PauseError::NoWrites {
                deadline: WRITES_DEADLINE,
                when,
            });
        }
        step(pause_step, vm.pause())?;
        still_after_pause(&vm)?;
    }
    Ok(Verdict::passed(format!(
        "{} MiB unchanged for {PAUSED_WAIT:?} after each of two pauses",
        vm.ram().size() >> 20
    )))
}

/// Checks that no page of `vm`'s memory changes over [`PAUSED_WAIT`].
pub(crate) fn still_after_pause(vm: &dyn Vm) -> Result<(), PauseError> {
    let paused = PageHashes::of(vm.ram())?;
    std::thread::sleep(PAUSED_WAIT);
    let changed = paused.changed(&PageHashes::of(vm.ram())?);
    if changed.is_empty() {
        return Ok(());
    }
    Err(PauseError::WritesAfterPause {
        frames: list_frames(vm.ram(), &changed),
        changed,
        wait: PAUSED_WAIT,
        says_running: vm.is_running(),
    })
}
