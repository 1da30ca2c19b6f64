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
//!  [one host: let the guest run SHARED_HOST_YIELD]
//!  hash all frozen memory (1/CPU), Digest ────────► compare with per-page hashes
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
//! migration; the main channel has a reader and a heartbeat thread on
//! each side (see [`crate::transport::main_channel`]); each data connection has a
//! sender thread on the source and a receiver thread on the destination. The
//! source's digest runs on one scoped thread per CPU while its guest is paused. A
//! link on which nothing moves for the stall timeout fails both sides with
//! `no progress from <peer> for N s`; nothing else has a timeout.
//!
//! **The guest's own checks.** Where the VMM passes a
//! [`ferry_vm::GuestProbe`], the source reads it once its vCPUs are
//! paused and the destination just before it resumes the guest; the
//! summaries carry both readings. Nothing else reads the guest: what it does
//! after the switchover is the VMM's business.
//!
//! Failure before switchover (I/O error, peer error, stall, cancel, backend
//! error) leaves the source running: dirty logging is stopped and, if the
//! engine paused the vCPUs, they are started again. The error goes to the
//! peer as an Error frame on the main channel, and the side that
//! reports it gives the peer's reason when the peer gave one.

mod destination;
pub mod downtime;
mod give_up;
mod source;
mod switchover;

pub use crate::session::{
    MigrationSettings, Placement, PrecopyOptions, ReceiveOptions, DEFAULT_BATCH_PAGES,
    DEFAULT_STALL_TIMEOUT, FAULT_HANDLERS, MAX_CONNECTIONS, PREFETCH_PAGES, RECOVER_TIMEOUT_SECS,
    SHARED_HOST_YIELD, STALL_TIMEOUT_SECS,
};
pub use destination::{await_migration, receive, receive_as, IncomingMigration};
pub use source::{migrate, migrate_accounted};
