//! Precopy migration: copy memory while the guest runs, in rounds, then stop
//! the guest briefly to send what is left.
//!
//! ```text
//!  source                                          destination
//!  start_dirty_log, drop VMM-dirty backlog
//!  round 0: every page ───────────────────────────► write, hash each page
//!  round k: harvest (backend log ∪ VMM writes) ───► write, hash
//!    … until  dirty_bytes / bandwidth ≤ downtime target, or the round cap
//!  pause ── harvest ── final pages, vCPU state,
//!  Switchover ────────────────────────────────────► restore vCPUs, START guest
//!            ◄──────────────────────────────────── Resumed          (downtime ends)
//!  hash all frozen memory (2 threads), Digest ────► compare with per-page hashes
//!            ◄──────────────────────────────────── Verified(match)
//!  match: stop_dirty_log, stay paused (committed)   match: keep running (committed)
//!  no match: start the guest again (rolled back)    no match: pause the guest, fail
//!                                                   run `run_after`, read guest progress
//!            ◄──────────────────────────────────── Report
//! ```
//!
//! **Commit after verify.** Hashing all of memory takes far longer than the
//! downtime budget, so the destination resumes the guest as soon as it has
//! the vCPU state, and the digest is checked afterwards. The source is held
//! paused, not destroyed, until the destination confirms the digest: if the
//! digests differ (or the destination goes away before confirming), the
//! destination pauses its copy and the source resumes, so the guest loses
//! only the time it ran on the destination, never memory. Whatever the
//! destination's guest did before that is discarded with it; a guest that
//! must never observe unverified memory uses `verify_before_resume`, which
//! has the destination wait for the digest before it resumes (strict, and a
//! downtime that includes hashing all memory). Either end can ask for it: the
//! destination says so in Accept, and the source then tells it in Switchover.
//!
//! One window is unavoidable with any two-party protocol: if the connection
//! dies after the destination sent `Verified(match)` but before the source
//! read it, the destination runs the guest and the source resumes its own
//! copy. The source logs this case loudly.
//!
//! **Threads and timeouts.** Each side runs on the caller's thread; the only
//! extra threads are the source's two scoped digest workers, while its guest
//! is paused. Neither side sets timeouts on the stream: the source waits for
//! the Report for as long as the destination's `run_after`, so a read timeout
//! set by the caller must be longer than that.
//!
//! Failure before switchover (I/O error, peer error, cancel, backend error)
//! leaves the source running: dirty logging is stopped and, if the engine
//! paused the vCPUs, they are started again. The error goes to the peer as
//! an Error frame when the stream still works.

mod destination;
mod source;
mod switchover;

pub use destination::{receive, CreateVm};
pub use source::migrate;

use crate::error::MigrationError;
use crate::stream::{ExpectedVm, FrameKind, FrameStream, Message, StreamError};
use crate::tunables::Tunables;
use ferry_backend::memstress::read_progress;
use ferry_backend::{GuestRam, RamError};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

/// Pages per batch by default (1 MiB).
pub const DEFAULT_BATCH_PAGES: usize = 256;

/// Options of the source side.
#[derive(Clone, Debug)]
pub struct PrecopyOptions {
    /// Live-tunable parameters (downtime target, round cap, bandwidth, cancel).
    pub tunables: Arc<Tunables>,
    /// Have the destination verify the digest before it resumes the guest.
    pub verify_before_resume: bool,
    /// Pages per batch (clamped to 1..=[`crate::stream::MAX_BATCH_PAGES`]).
    pub batch_pages: usize,
}

impl Default for PrecopyOptions {
    fn default() -> Self {
        PrecopyOptions {
            tunables: Tunables::shared(),
            verify_before_resume: false,
            batch_pages: DEFAULT_BATCH_PAGES,
        }
    }
}

/// Options of the destination side.
#[derive(Clone, Debug)]
pub struct ReceiveOptions {
    /// What the stream must carry; checked before any VM is built.
    pub expect: Option<ExpectedVm>,
    /// How long to run the guest after verification before reporting (and on
    /// until every vCPU has completed a pass, at most 120 s).
    pub run_after: Duration,
    /// Verify the digest before resuming the guest.
    pub verify_before_resume: bool,
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            expect: None,
            run_after: Duration::from_secs(1),
            verify_before_resume: false,
        }
    }
}

/// Sends one control message and flushes.
fn send<S: Read + Write>(io: &mut FrameStream<S>, msg: &Message) -> Result<(), StreamError> {
    io.write_frame(msg.kind(), &[&msg.encode()])?;
    io.flush()
}

/// Receives one control message; an Error frame becomes [`MigrationError::Peer`].
fn recv<S: Read + Write>(
    io: &mut FrameStream<S>,
    peer: &'static str,
    expected: &'static str,
) -> Result<(Message, u64), MigrationError> {
    let (kind, offset) = io.read_frame()?;
    if matches!(
        kind,
        FrameKind::Header | FrameKind::Pages | FrameKind::VcpuState
    ) {
        return Err(MigrationError::Protocol {
            expected,
            got: kind,
            offset,
        });
    }
    match Message::decode(kind, io.payload(), offset)? {
        Message::Error(message) => Err(MigrationError::Peer { peer, message }),
        m => Ok((m, offset)),
    }
}

/// A message that does not belong where it arrived.
fn unexpected(expected: &'static str, msg: &Message, offset: u64) -> MigrationError {
    MigrationError::Protocol {
        expected,
        got: msg.kind(),
        offset,
    }
}

/// Guest totals over all vCPUs: (passes, mismatches).
fn guest_totals(ram: &GuestRam, vcpus: u32) -> Result<(u64, u64), RamError> {
    let all = read_progress(ram, vcpus)?;
    Ok(all.iter().fold((0, 0), |(p, m), v| {
        (p.wrapping_add(v.passes), m.wrapping_add(v.mismatches))
    }))
}
