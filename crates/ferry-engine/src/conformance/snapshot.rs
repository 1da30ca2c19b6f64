//! A snapshot round trip: a source VM of the VMM, running and written to,
//! saved live to a file with the engine's public API exactly as an
//! embedder calls it, then restored from that file into a fresh
//! destination VM of the same VMM once per restore mode. The save proves
//! itself (the paused guest's memory, hashed on its own, is what the file
//! holds); each restore must come back running, with the snapshot's
//! digest, and healthy.

use super::pages::{chosen_pages, PagesError};
use super::{failure, step, Check, Failure, StepError, Verdict, VmmUnderTest};
use crate::error::SnapshotError;
use crate::snapshot::{self, RestoreMode, RestoreOptions, SnapshotOptions};
use crate::wire::StreamHeader;
use ferry_vm::{error_chain, Vm, VmError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Why [`snapshot_round_trip`] failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum SnapshotCheckError {
    /// A call into the VM or the hook failed.
    #[error(transparent)]
    Step(#[from] StepError),
    /// Reading guest memory failed.
    #[error(transparent)]
    Pages(#[from] PagesError),
    /// The live snapshot failed (a write that no dirty log reported fails
    /// it here: the paused memory is not what the file holds).
    #[error("the live snapshot failed: {}", error_chain(.0))]
    Save(SnapshotError),
    /// The source did not run on after a snapshot that did not stop it.
    #[error("the source is not running after its snapshot, which was not to stop it")]
    SourceStopped,
    /// A restore failed.
    #[error("the {mode} restore failed: {}", error_chain(source))]
    Restore {
        /// The restore mode.
        mode: &'static str,
        /// Why.
        source: SnapshotError,
    },
    /// A restore came back with its guest not running.
    #[error("the {mode} restore came back paused, though it was to start the guest")]
    RestoredPaused {
        /// The restore mode.
        mode: &'static str,
    },
}

/// Starts a source VM and has it write [`chosen_pages`], saves it live to
/// a file in the temporary directory (`SnapshotOptions::default()`: the
/// guest runs on), checks it still runs, then restores the file into a
/// destination VM the VMM builds from the header's configuration, in each
/// [`RestoreMode`], each checked against the snapshot's digest and left
/// running and healthy. A lazy mode the VM cannot take (the engine refuses
/// it before anything starts, saying why: memory a userfaultfd cannot
/// register, devices that map guest memory elsewhere) is named in the
/// verdict, not passed silently.
pub fn snapshot_round_trip<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, Failure> {
    let path = scratch_file();
    let result = run(vmm, &path);
    let _ = std::fs::remove_file(&path);
    result.map_err(|e| failure(Check::SnapshotRoundTrip, vmm, e))
}

/// A file of this call's own in the temporary directory.
fn scratch_file() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "ferry-conformance-{}-{}.snap",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

fn run<V: VmmUnderTest>(vmm: &mut V, path: &Path) -> Result<Verdict, SnapshotCheckError> {
    let mut src = step("building the source VM", vmm.source())?;
    step("the source VM's start", src.start())?;
    let pages = chosen_pages(src.ram());
    step("the VMM's write_pages", vmm.write_pages(&mut src, &pages))?;
    let saved = snapshot::save(&mut src, path, &SnapshotOptions::default())
        .map_err(SnapshotCheckError::Save)?;
    if !src.is_running() {
        return Err(SnapshotCheckError::SourceStopped);
    }
    step(
        "the source VM's health after its snapshot",
        src.check_health(),
    )?;
    step("the source VM's pause", src.pause())?;
    let ram_mib = src.ram().size() >> 20;
    let vmm_id = src.vmm_id().to_string();
    let config = src.vmm_config();
    drop(src);

    let mut restored = Vec::new();
    let mut refused = Vec::new();
    for mode in RestoreMode::ALL {
        // The factory an embedder writes: it checks what the header says,
        // then builds the VMM's destination.
        let mut factory = |h: &StreamHeader| -> Result<V::Vm, VmError> {
            if h.vmm != vmm_id || h.vmm_config != config {
                return Err(VmError::Guest(format!(
                    "the snapshot is of VMM {} with configuration {}, not the {vmm_id} saved",
                    h.vmm, h.vmm_config
                )));
            }
            vmm.destination(&h.vmm_config)
        };
        let opts = RestoreOptions {
            mode,
            ..RestoreOptions::default()
        };
        let failed = |source| SnapshotCheckError::Restore {
            mode: mode.name(),
            source,
        };
        let (mut vm, restoring) = match snapshot::restore_as(path, &mut factory, &opts) {
            Ok(r) => r,
            Err(SnapshotError::Lazy { detail }) if mode != RestoreMode::Eager => {
                refused.push(format!("{} refused ({detail})", mode.name()));
                continue;
            }
            Err(e) => return Err(failed(e)),
        };
        // With the default options, finish() fails unless the restored
        // memory has the snapshot's digest.
        restoring.finish(&mut vm).map_err(failed)?;
        if !vm.is_running() {
            return Err(SnapshotCheckError::RestoredPaused { mode: mode.name() });
        }
        step("the restored VM's health", vm.check_health())?;
        step("the restored VM's pause", vm.pause())?;
        restored.push(mode.name());
    }
    let mut what = format!(
        "{ram_mib} MiB of RAM saved live in {} rounds; restored {} with the snapshot's digest",
        saved.rounds.len(),
        restored.join(", ")
    );
    if !refused.is_empty() {
        what.push_str(&format!("; {}", refused.join("; ")));
    }
    Ok(Verdict::passed(what))
}
