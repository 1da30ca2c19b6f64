//! A migration to itself: a source VM of the VMM, running, migrated by
//! precopy over TCP loopback into a destination VM of the same VMM, with
//! the engine's public API exactly as an embedder calls it. Both ends hash
//! all of memory at the switchover; the digests must match, and the
//! destination must come back running and healthy.

use super::pages::{chosen_pages, PagesError};
use super::{failure, step, Check, Failure, StepError, Verdict, VmmUnderTest};
use crate::error::MigrationError;
use crate::wire::StreamHeader;
use crate::{await_migration, listen, migrate, receive_as, NoProgress, TcpDialer};
use crate::{PrecopyOptions, ReceiveOptions};
use ferry_vm::{error_chain, Vm, VmError};
use std::time::{Duration, Instant};

/// How long the migration may take before the kit gives up on it (the
/// source cancels; the destination stops waiting for it to connect).
pub const MIGRATION_DEADLINE: Duration = Duration::from_secs(120);

/// Why [`loopback_migration`] failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum MigrationCheckError {
    /// A call into the VM or the hook failed.
    #[error(transparent)]
    Step(#[from] StepError),
    /// Reading guest memory failed.
    #[error(transparent)]
    Pages(#[from] PagesError),
    /// The loopback listener could not be opened.
    #[error("cannot listen on loopback: {0}")]
    Listen(String),
    /// The source's migrate failed.
    #[error("the source's migrate failed: {}", error_chain(.0))]
    Source(MigrationError),
    /// The destination's receive failed.
    #[error("the destination's receive failed: {}", error_chain(.0))]
    Destination(MigrationError),
    /// The destination's thread panicked (in the VMM's code).
    #[error("the destination's thread panicked: {0}")]
    DestinationPanicked(String),
    /// The two ends hold different memory.
    #[error(
        "the migration ended with memory digests that differ (the source says match: \
         {source_says}, the destination says match: {destination_says})"
    )]
    DigestMismatch {
        /// The source's summary.
        source_says: bool,
        /// The destination's summary.
        destination_says: bool,
    },
    /// The destination came back paused although the source ran.
    #[error("the destination came back paused, though its source was running")]
    ArrivedPaused,
}

/// Starts a source VM and has it write [`chosen_pages`], migrates it
/// running with `PrecopyOptions::default()` (bounded by
/// [`MIGRATION_DEADLINE`]) to a destination VM the VMM builds from the
/// stream header's configuration, and checks both digests match and the
/// destination runs, healthy.
pub fn loopback_migration<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, Failure> {
    run(vmm).map_err(|e| failure(Check::LoopbackMigration, vmm, e))
}

fn run<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, MigrationCheckError> {
    let mut src = step("building the source VM", vmm.source())?;
    step("the source VM's start", src.start())?;
    let pages = chosen_pages(src.ram());
    step("the VMM's write_pages", vmm.write_pages(&mut src, &pages))?;
    let dst = step(
        "building the destination VM",
        vmm.destination(&src.vmm_config()),
    )?;
    let listener =
        listen("127.0.0.1:0").map_err(|e| MigrationCheckError::Listen(error_chain(&e)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| MigrationCheckError::Listen(e.to_string()))?;
    let vmm_id = src.vmm_id().to_string();
    let config = src.vmm_config();
    let destination = std::thread::spawn(move || {
        let incoming = await_migration(&listener, Some(Instant::now() + MIGRATION_DEADLINE))?;
        let mut built = Some(dst);
        // The factory an embedder writes, its VM built beforehand: it
        // checks what the header says, then hands that VM over once.
        let mut factory = |h: &StreamHeader| -> Result<V::Vm, VmError> {
            if h.vmm != vmm_id || h.vmm_config != config {
                return Err(VmError::Guest(format!(
                    "the stream is of VMM {} with configuration {}, not the {vmm_id} the \
                     destination was built for",
                    h.vmm, h.vmm_config
                )));
            }
            built
                .take()
                .ok_or_else(|| VmError::Guest("the factory was asked for a second VM".into()))
        };
        receive_as(
            incoming,
            &listener,
            &mut factory,
            &ReceiveOptions::default(),
        )
    });
    let opts = PrecopyOptions {
        give_up_after: Some(MIGRATION_DEADLINE),
        ..PrecopyOptions::default()
    };
    let sent = migrate(&mut src, &TcpDialer(addr.to_string()), &opts, &NoProgress);
    let received = destination.join().map_err(|panic| {
        MigrationCheckError::DestinationPanicked(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "no message".into()),
        )
    })?;
    let summary = sent.map_err(MigrationCheckError::Source)?;
    let (mut moved, arrived) = received.map_err(MigrationCheckError::Destination)?;
    if !(summary.digest_match && arrived.digest_match) {
        return Err(MigrationCheckError::DigestMismatch {
            source_says: summary.digest_match,
            destination_says: arrived.digest_match,
        });
    }
    if arrived.paused {
        return Err(MigrationCheckError::ArrivedPaused);
    }
    step("the destination VM's health", moved.check_health())?;
    step("the destination VM's pause", moved.pause())?;
    Ok(Verdict::passed(format!(
        "{} MiB in {} rounds, digests match",
        moved.ram().size() >> 20,
        summary.memory.rounds.len()
    )))
}
