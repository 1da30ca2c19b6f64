//! What precopy and postcopy share: each side's migration state and the
//! steps both modes take with it.
//!
//! ```text
//!   options      each side's options and defaults, and the mode
//!   settings     a migration's settings as the faces take them, mapped
//!                to the source's options in one place
//!   source       the source's VM, connections, dirty logging, rounds sent
//!   links        the source's connections: main channel, senders,
//!                page server, their health, the session
//!   device_plan  the source's device state: live, at the pause, in parts
//!   switchover   the source's pause, vCPU state, digest, commit, rollback
//!   moment       when a switchover step began, on the wall's clock and
//!                its thread's CPU clock
//!   dest         the destination's VM, connections, loading and commit
//!   device_intake  the destination's device state as it arrives, within
//!                one limit
//!   loaded       the destination's memory image: hashes, what arrived,
//!                placement (UFFDIO_COPY, huge pages, deltas), round gate
//!   senders / receivers   a thread per data connection on each side
//!   compression, delta, within_round   how a batch is encoded, and pages
//!                harvested ahead of the send cursor
//!   page_server, page_requests, huge   postcopy's priority connection on
//!                each side, which the connection set opens with the
//!                others, and hugetlb staging in the memory image
//! ```
//!
//! The modes sit above this floor (`docs/design.md`, "The engine's
//! layers"): precopy's round loop and postcopy's switchover, push and
//! pager each drive a [`Source`] or a [`Dest`], and precopy hands over to
//! postcopy in a hybrid migration.

mod compression;
mod delta;
mod dest;
mod dest_takes;
pub mod device_cost;
mod device_intake;
mod device_plan;
mod huge;
mod links;
mod loaded;
mod moment;
mod options;
mod page_requests;
mod page_server;
mod phase;
mod receivers;
mod round_gate;
mod senders;
mod settings;
mod source;
mod switchover;
mod within_round;

pub(crate) use dest::{Dest, Outputs};
pub(crate) use device_intake::DeviceIntake;
pub(crate) use huge::HUGE_PAGES;
pub(crate) use loaded::Loaded;
pub(crate) use moment::Moment;
pub(crate) use options::Blocked;
pub use options::{
    Mode, Placement, PrecopyOptions, ReceiveOptions, DEFAULT_BATCH_PAGES, DEFAULT_PREFETCH,
    DEFAULT_RECOVER_TIMEOUT, DEFAULT_STALL_TIMEOUT, FAULT_HANDLERS, MAX_CONNECTIONS,
    PREFETCH_PAGES, RECOVER_TIMEOUT_SECS, STALL_TIMEOUT_SECS,
};
pub(crate) use page_requests::{BlockClock, Requests, ThreadWaits, BLOCK_BIN};
pub(crate) use phase::SourcePhase;
pub use settings::MigrationSettings;
pub(crate) use source::fresh_summary;
pub(crate) use source::{new_session_id, ship, Migrating, Source, EST_BYTES_PER_PAGE};
pub use switchover::SHARED_HOST_YIELD;

use crate::error::MigrationError;
pub use crate::error::PostcopyResume;
use crate::wire::Message;

/// Reads the guest's own checks on a paused source, where the VMM gave a
/// probe, into the summary.
pub(crate) fn probe_paused(
    vm: &dyn ferry_vm::Vm,
    opts: &PrecopyOptions,
    summary: &mut crate::summary::MigrationSummary,
) -> Result<(), MigrationError> {
    if let Some(probe) = &opts.probe {
        let check = probe.read(vm).map_err(MigrationError::Probe)?;
        summary.guest.guest_at_pause = Some(check);
        summary.guest.mismatches_before = Some(check.errors);
        summary.guest.guest_mismatches = Some(check.errors);
    }
    Ok(())
}

/// A message that does not belong where it arrived.
pub(crate) fn unexpected(expected: &'static str, msg: &Message, offset: u64) -> MigrationError {
    MigrationError::Protocol {
        expected,
        got: msg.kind(),
        offset,
    }
}
