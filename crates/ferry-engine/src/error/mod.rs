//! Errors of a migration, on either side. Stream and header errors are shown
//! as they are: their messages are already what the user needs to read.

mod local;
mod options;
mod snapshot;
mod transport;

pub use local::LocalError;
pub use options::OptionsError;
pub use snapshot::SnapshotError;
pub use transport::TransportError;

use crate::wire::{FrameKind, HeaderError, SectionError, StreamError};
use ferry_vm::{RamError, VmError};
use thiserror::Error;

/// Why a migration failed.
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum MigrationError {
    /// The stream is broken, corrupt or not ours.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The header does not fit this destination.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// Device state the destination cannot load.
    #[error(transparent)]
    Section(#[from] SectionError),
    /// A connection could not be set up.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The peer gave up and said why.
    #[error("{}", peer_gave_up(peer, message))]
    Peer {
        /// "source" or "destination".
        peer: &'static str,
        /// Its message.
        message: String,
    },
    /// A frame arrived that does not belong here.
    #[error("protocol error at stream offset {offset}: expected {expected}, got a {got} frame")]
    Protocol {
        /// What was expected.
        expected: &'static str,
        /// What came.
        got: FrameKind,
        /// Stream offset of the frame.
        offset: u64,
    },
    /// A backend call failed.
    #[error("cannot {what}")]
    Backend {
        /// What the engine was doing.
        what: &'static str,
        /// The backend's error.
        #[source]
        source: VmError,
    },
    /// Copying guest memory failed.
    #[error("cannot {what}")]
    Ram {
        /// What the engine was doing.
        what: &'static str,
        /// The RAM error.
        #[source]
        source: RamError,
    },
    /// A writer of guest memory that cannot report what it writes, or
    /// whose log failed.
    #[error("the dirty source '{name}'")]
    DirtySource {
        /// The source's name.
        name: String,
        /// What failed.
        #[source]
        source: ferry_vm::DirtySourceError,
    },
    /// The VMM's guest probe could not read the guest's checks.
    #[error("the guest probe failed")]
    Probe(#[source] ferry_vm::ProbeError),
    /// The stream reached switchover without all of memory.
    #[error("the stream reached switchover with {missing} of {total} pages never sent")]
    Incomplete {
        /// Pages never received.
        missing: u64,
        /// Guest pages.
        total: u64,
    },
    /// The destination's memory differs from the source's.
    #[error(
        "memory digest mismatch: source {source_digest:#018x}, destination {dest_digest:#018x}"
    )]
    DigestMismatch {
        /// Source digest.
        source_digest: u64,
        /// Destination digest.
        dest_digest: u64,
    },
    /// The stream failed after the source sent its digest, before the
    /// destination's verdict arrived. The source has resumed; the
    /// destination pauses its copy, as it never gets the source's Commit
    /// (even when its verdict was lost in flight).
    #[error(
        "lost the destination before it confirmed the memory digest; the source \
         resumed (the destination pauses its copy without the source's commit)"
    )]
    Unconfirmed(#[source] Box<MigrationError>),
    /// The destination's side of a lost verdict: the source never said
    /// Commit after our Verified(match), so it may have resumed its copy.
    #[error(
        "the source did not confirm the commit after the digest matched; this copy \
         of the guest is paused so that two copies never run: check the source, \
         which resumed its guest unless it got the verdict"
    )]
    Uncommitted(#[source] Box<MigrationError>),
    /// The give-up deadline passed before the switchover.
    #[error("gave up after {after_s} s: {cause}")]
    GaveUp {
        /// The deadline, in seconds.
        after_s: f64,
        /// What the cancel ended in.
        cause: Box<MigrationError>,
    },
    /// Cancelled through [`crate::Tunables::cancel`].
    #[error("migration cancelled")]
    Cancelled,
    /// The source took a step out of order (a bug in the engine): the
    /// migration fails rather than go on.
    #[error("internal error: the migration source cannot {step} while {phase}")]
    Phase {
        /// What was asked.
        step: &'static str,
        /// The phase it was asked in.
        phase: String,
    },
    /// The destination's side of a failed postcopy.
    #[error(
        "postcopy failed with {missing} of {total} pages still missing here ({ranges}); \
         this copy of the guest is paused and must not run: only the source holds \
         those pages"
    )]
    PostcopyIncomplete {
        /// Pages never received.
        missing: u64,
        /// Pages of the guest.
        total: u64,
        /// The missing frame ranges, the first few spelled out.
        ranges: String,
        /// What failed.
        #[source]
        source: Box<MigrationError>,
    },
    /// A postcopy failed after the guest moved to the destination.
    #[error(
        "postcopy failed after the guest moved to the destination; the source stays \
         paused and keeps all its memory ({missing} pages were missing on the \
         destination at switchover, {unsent} of them not sent yet)"
    )]
    Postcopy {
        /// Pages the destination lacked at switchover.
        missing: u64,
        /// Of those, pages the source had not sent (handed to a connection).
        unsent: u64,
        /// What [`crate::resume_postcopy`] needs to try again later.
        resume: PostcopyResume,
        /// What failed.
        #[source]
        source: Box<MigrationError>,
    },
    /// A postcopy's connections broke and the peer did not come back.
    #[error("the {peer} did not reconnect within {secs} s after the postcopy connections broke")]
    NotRecovered {
        /// "source" or "destination".
        peer: &'static str,
        /// The recovery timeout.
        secs: u64,
        /// Why the connections broke.
        #[source]
        cause: Box<MigrationError>,
    },
    /// One of the engine's own threads panicked: a bug in ferry.
    #[error("ferry's {thread} thread panicked (a bug; please report it): {message}")]
    Panicked {
        /// The thread's name.
        thread: String,
        /// What it panicked with.
        message: String,
    },
    /// Nothing moved on the link for the stall timeout.
    #[error("no progress from {peer} for {secs} s")]
    Stalled {
        /// "source" or "destination".
        peer: &'static str,
        /// The stall timeout.
        secs: f64,
    },
    /// The peer closed the connection without saying why.
    #[error("the {peer} closed the connection without saying why")]
    Closed {
        /// "source" or "destination".
        peer: &'static str,
    },
    /// Placing a page by copy failed.
    #[error("cannot place a received page: {0}")]
    Placement(String),
    /// The destination refused a connection.
    #[error("{0}")]
    Refused(String),
    /// Another thread of this side failed; its reason is kept in the
    /// side's [`crate::transport::Health`] and reported instead of this.
    #[error("the migration was aborted")]
    Aborted,
    /// A same-host migration failed.
    #[error(transparent)]
    Local(#[from] LocalError),
    /// The options asked for cannot be.
    #[error(transparent)]
    Options(#[from] OptionsError),
}

/// "destination refused the stream: …" or "source gave up the migration: …".
fn peer_gave_up(peer: &str, message: &str) -> String {
    if peer == "destination" {
        format!("destination refused the stream: {message}")
    } else {
        format!("{peer} gave up the migration: {message}")
    }
}

impl MigrationError {
    /// Wraps a backend error with what the engine was doing.
    pub(crate) fn backend(what: &'static str) -> impl FnOnce(VmError) -> Self {
        move |source| MigrationError::Backend { what, source }
    }

    /// Wraps a RAM error with what the engine was doing.
    pub(crate) fn ram(what: &'static str) -> impl FnOnce(RamError) -> Self {
        move |source| MigrationError::Ram { what, source }
    }

    /// The message with its causes, for an Error frame to the peer.
    pub fn chain(&self) -> String {
        ferry_vm::error_chain(self)
    }
}

/// What a source keeps to resume a postcopy whose automatic recovery ran
/// out of time (see [`crate::resume_postcopy`]): the destination still waits, or
/// will be asked again, for the same session.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PostcopyResume {
    /// The migration's session id.
    pub session: u64,
    /// The round the push sends.
    pub round: u32,
    /// Data connections per set.
    pub connections: usize,
}
