//! Postcopy: switch over at once, and fetch each page the guest touches
//! before it arrives.
//!
//! ```text
//!  source                                            destination
//!  [hybrid: precopy rounds first]                    (uffd MISSING registration,
//!  pause ── harvest ── save vCPUs                     faults queue as events)
//!  VcpuState, Missing(runs), Switchover(postcopy) ──► wait for the last precopy round,
//!                                                     drop stale copies of Missing pages,
//!                                                     start the pager, restore, START
//!            ◄────────────────────────────────────── Resumed              (downtime ends)
//!  page server (priority connection):
//!     PageRequest(first, n) ◄─────────────────────── fault handler: a vCPU touched a
//!     Pages (frozen memory) ────────────────────────► missing page; UFFDIO_COPY wakes it
//!  push (data connections): every Missing page not
//!     yet served, from the last request onwards ────► placed once: UFFDIO_COPY, and a
//!                                                      page already there is left alone
//!  hash frozen memory, Digest ──────────────────────► every page in: compare with the
//!            ◄────────────────────────────────────── Verified           per-page hashes
//! ```
//!
//! * `pager`: the destination's fault handlers and priority reader.
//! * `blocked`: which vCPU waited for pages, and when.
//! * `source`, `destination`: the switchover of each side, and the push.
//! * `recovery`, `resume`: reconnecting after a cut.
//! * The source's page server, the destination's page requests and the
//!   hugetlb staging sit in `crate::session`, since the connection set and
//!   the memory image that both modes use hold them.
//!
//! **Placed exactly once.** Every missing page lands with `UFFDIO_COPY`,
//! which fails with EEXIST if the page is there already: a request's answer
//! and the push's copy of one page race, the first wins, and the second is
//! dropped, so it can never overwrite what the guest wrote since.
//!
//! **The source never resumes after a postcopy switchover.** The guest has
//! run on the destination; the source's paused copy holds every page not
//! yet sent and is kept for recovery (a later step: today a cut ends the
//! migration, and both sides say how many pages were still missing).
//!
//! **The digest** is the source's frozen memory at switchover against the
//! hashes of the pages as the destination received them: the guest runs
//! meanwhile, so the destination's memory itself has moved on.

mod blocked;
mod destination;
pub(crate) mod pager;
mod recovery;
mod resume;

pub use resume::resume_postcopy;
mod source;

pub use crate::session::{DEFAULT_PREFETCH, DEFAULT_RECOVER_TIMEOUT};

/// Whether a postcopy that failed with `e` may be recovered: the
/// connections broke or stood still, and the peer said nothing.
pub(crate) fn recoverable(e: &crate::error::MigrationError) -> bool {
    crate::transport::health::is_link_failure(e)
        || matches!(e, crate::error::MigrationError::Stalled { .. })
}
