//! Precopy migration: copy memory while the guest runs, in rounds, then stop
//! the guest briefly to send what is left.
//!
//! ```text
//!  source                                          destination
//!  start_dirty_log, drop VMM-dirty backlog
//!  round 0: every page ───────────────────────────► write, hash each page
//!  round k: harvest (backend log ∪ VMM writes) ───► write, hash
//!    … until the predicted final round fits well under the downtime
//!      target (`downtime`), or the round cap
//!  pause ── harvest ── final pages, vCPU state,
//!  Switchover ────────────────────────────────────► restore vCPUs, START guest
//!            ◄──────────────────────────────────── Resumed          (downtime ends)
//!  hash all frozen memory (2 threads), Digest ────► compare with per-page hashes
//!            ◄──────────────────────────────────── Verified(match)
//!  match: stop_dirty_log, stay paused (committed)   match: keep running (committed)
//!  no match: start the guest again (rolled back)    no match: pause the guest, fail
//!            ◄──────────────────────────────────── Report   (receive() returns)
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
//! **Threads and timeouts.** The engine thread of each side drives the
//! migration; the control connection has a reader and a heartbeat thread on
//! each side (see [`crate::transport::control`]); each data connection has a
//! sender thread on the source and a receiver thread on the destination. The
//! source's digest runs on two scoped threads while its guest is paused. A
//! link on which nothing moves for the stall timeout fails both sides with
//! `no progress from <peer> for N s`; nothing else has a timeout.
//!
//! **The guest's own checks.** Where the VMM passes a
//! [`ferry_backend::GuestProbe`], the source reads it once its vCPUs are
//! paused and the destination just before it resumes the guest; the
//! summaries carry both readings. Nothing else reads the guest: what it does
//! after the switchover is the VMM's business.
//!
//! Failure before switchover (I/O error, peer error, stall, cancel, backend
//! error) leaves the source running: dirty logging is stopped and, if the
//! engine paused the vCPUs, they are started again. The error goes to the
//! peer as an Error frame on the control connection, and the side that
//! reports it gives the peer's reason when the peer gave one.

mod ahead;
mod compression;
mod delta;
mod destination;
pub mod downtime;
mod give_up;
mod loaded;
mod receivers;
mod round_gate;
mod senders;
mod source;
mod switchover;

pub(crate) use destination::Dest;
pub(crate) use loaded::Loaded;
pub(crate) use source::{ship, Migrating, Source};

pub use compression::Compression;
pub use destination::{await_migration, receive, receive_as, CreateVm, IncomingMigration};
pub use source::{fresh_summary, migrate, migrate_accounted};

use crate::converge::ConvergeMode;
use crate::error::MigrationError;
use crate::tunables::Tunables;
use crate::wire::{ExpectedVm, Message};
use ferry_backend::GuestProbe;
use std::sync::Arc;
use std::time::Duration;

/// How long a link may stand still before both sides give up.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Most data connections one migration opens.
pub const MAX_CONNECTIONS: usize = 64;

/// Pages per batch by default (1 MiB).
pub const DEFAULT_BATCH_PAGES: usize = 256;

/// Options of the source side.
#[derive(Clone, Debug)]
pub struct PrecopyOptions {
    /// Live-tunable parameters (downtime target, round cap, bandwidth, cancel).
    pub tunables: Arc<Tunables>,
    /// Have the destination verify the digest before it resumes the guest.
    pub verify_before_resume: bool,
    /// Pages per batch (clamped to 1..=[`crate::wire::MAX_BATCH_PAGES`]).
    pub batch_pages: usize,
    /// Data connections (clamped to 1..=[`MAX_CONNECTIONS`]).
    pub connections: usize,
    /// How long the link may stand still before the migration fails.
    pub stall_timeout: Duration,
    /// Compression of page batches.
    pub compression: Compression,
    /// Bytes of last-sent pages kept to re-send pages as deltas (0: off).
    pub delta_cache_bytes: u64,
    /// Harvest the dirty log at each policy interval while a round runs, so
    /// a page dirtied ahead of the send cursor is sent once, not again in
    /// the next round (see `ahead`). Fewer bytes and shorter migrations;
    /// but each harvest write-protects what it finds, so a guest that
    /// rewrites its pages faults (and is metered by the quota) more often.
    pub harvest_within_rounds: bool,
    /// What slows the guest when precopy does not converge; `None`: the
    /// best the VM serves ([`crate::converge::choose`]).
    pub converge: Option<ConvergeMode>,
    /// Highest downtime target a stall may raise the target to (`None`:
    /// the target is never raised).
    pub max_downtime: Option<Duration>,
    /// Precopy, postcopy, or precopy then postcopy.
    pub mode: crate::postcopy::Mode,
    /// Postcopy: how long to keep trying to reconnect after the
    /// connections break (zero: give up at once, the source staying paused
    /// with its pages).
    pub recover_timeout: Duration,
    /// The guest's own checks, read once the vCPUs are paused for the
    /// switchover (`None`: the guest has none, or the VMM does not say).
    pub probe: Option<Arc<dyn GuestProbe>>,
    /// Cancel the migration if it has not switched over by then (the
    /// source runs on); the error says it gave up.
    pub give_up_after: Option<Duration>,
}

impl Default for PrecopyOptions {
    fn default() -> Self {
        PrecopyOptions {
            tunables: Tunables::shared(),
            verify_before_resume: false,
            batch_pages: DEFAULT_BATCH_PAGES,
            connections: 1,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            compression: Compression::None,
            delta_cache_bytes: 0,
            harvest_within_rounds: false,
            converge: None,
            max_downtime: None,
            mode: crate::postcopy::Mode::Precopy,
            recover_timeout: crate::postcopy::DEFAULT_RECOVER_TIMEOUT,
            probe: None,
            give_up_after: None,
        }
    }
}

impl PrecopyOptions {
    /// Refuses settings that cannot go together, before anything starts:
    /// delta re-sends with a mode that may switch to postcopy (a delta
    /// re-sends a page against a copy that postcopy drops).
    pub fn validate(&self) -> Result<(), MigrationError> {
        if self.mode.may_postcopy() && self.delta_cache_bytes > 0 {
            return Err(MigrationError::Refused(format!(
                "delta re-sends cannot be used with a {} migration: a delta re-sends a page \
                 against a copy that postcopy drops",
                self.mode
            )));
        }
        Ok(())
    }
}

/// Options of the destination side.
#[derive(Clone, Debug)]
pub struct ReceiveOptions {
    /// What the stream must carry; checked before any VM is built.
    pub expect: Option<ExpectedVm>,
    /// Verify the digest before resuming the guest.
    pub verify_before_resume: bool,
    /// How long the link may stand still before the migration fails.
    pub stall_timeout: Duration,
    /// How received pages land in guest memory.
    pub placement: Placement,
    /// Postcopy: pages asked for per fault (the faulting page and the
    /// missing ones after it).
    pub prefetch: u32,
    /// Postcopy: how long to wait for the source to reconnect after the
    /// connections break, with the guest running on (zero: give up at
    /// once, pausing the guest).
    pub recover_timeout: Duration,
    /// Postcopy: let vCPUs ask for their missing pages themselves where
    /// the backend has annotated fault exits (else userfaultfd always).
    pub vcpu_fault_exits: bool,
    /// Postcopy: threads reading the userfaultfd's fault events.
    pub fault_handlers: usize,
    /// Postcopy: those threads spin instead of sleeping in `poll`.
    pub fault_busy_poll: bool,
    /// The guest's own checks, read just before the guest resumes here.
    pub probe: Option<Arc<dyn GuestProbe>>,
}

/// How the destination puts a received page into guest memory that has
/// never been touched.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// `UFFDIO_COPY`: the kernel allocates the page already filled (no
    /// zeroing first); falls back to `Write` where userfaultfd is missing
    /// and on hugetlb backing.
    #[default]
    Uffd,
    /// A plain copy into the mapping: the first touch faults and the kernel
    /// zeroes the page before the data overwrites it.
    Write,
}

impl Placement {
    /// Every placement, for parsers and their help.
    pub const ALL: [Placement; 2] = [Placement::Uffd, Placement::Write];

    /// Its name on a command line (`uffd`, `write`), which `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Uffd => "uffd",
            Placement::Write => "write",
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Placement::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names = Placement::ALL.map(Placement::name).join(", ");
                format!("unknown placement {s:?} ({names})")
            })
    }
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            expect: None,
            verify_before_resume: false,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            placement: Placement::Uffd,
            prefetch: crate::postcopy::DEFAULT_PREFETCH,
            recover_timeout: crate::postcopy::DEFAULT_RECOVER_TIMEOUT,
            vcpu_fault_exits: true,
            fault_handlers: 1,
            fault_busy_poll: false,
            probe: None,
        }
    }
}

/// Reads the guest's own checks on a paused source, where the VMM gave a
/// probe, into the summary.
pub(crate) fn probe_paused(
    vm: &dyn ferry_backend::Vm,
    opts: &PrecopyOptions,
    summary: &mut crate::summary::MigrationSummary,
) -> Result<(), MigrationError> {
    if let Some(probe) = &opts.probe {
        let check = probe.read(vm).map_err(MigrationError::Probe)?;
        summary.guest_at_pause = Some(check);
        summary.mismatches_before = Some(check.errors);
        summary.guest_mismatches = Some(check.errors);
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
