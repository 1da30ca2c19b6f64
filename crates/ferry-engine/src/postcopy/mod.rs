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
//! * [`server`]: the source's page server, and the order of the push.
//! * [`pager`]: the destination's fault handler and priority reader.
//! * `source`, `destination`: the switchover of each side.
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

mod destination;
pub(crate) mod huge;
pub(crate) mod pager;
mod recovery;
mod resume;

pub use resume::resume_postcopy;
pub(crate) mod server;
mod source;

pub use pager::DEFAULT_PREFETCH;

/// How long either side tries to recover a postcopy whose connections
/// broke before it gives up.
pub const DEFAULT_RECOVER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How a migration moves memory.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Rounds while the guest runs, then stop-and-copy.
    #[default]
    Precopy,
    /// Switch over at once; every page is fetched on demand or pushed.
    Postcopy,
    /// Precopy for `after_rounds` rounds (the full pass is the first),
    /// or until precopy stalls if `on_stall`, then postcopy, unless
    /// precopy converged first.
    Hybrid {
        /// Precopy rounds before the switch, at least 1.
        after_rounds: u32,
        /// Switch as soon as the stall detector says precopy will not
        /// finish (the remaining bytes stopped shrinking), instead of
        /// escalating.
        on_stall: bool,
    },
}

impl Mode {
    /// The name used in summaries and on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Precopy => "precopy",
            Mode::Postcopy => "postcopy",
            Mode::Hybrid { .. } => "hybrid",
        }
    }

    /// Whether the migration may switch to postcopy (and so opens the
    /// priority connection).
    pub fn may_postcopy(&self) -> bool {
        *self != Mode::Precopy
    }

    /// Whether precopy hands over to postcopy after `rounds` rounds.
    pub fn switch_after(&self, rounds: u32) -> bool {
        match self {
            Mode::Precopy => false,
            Mode::Postcopy => true,
            Mode::Hybrid { after_rounds, .. } => rounds >= (*after_rounds).max(1),
        }
    }

    /// Whether a precopy stall switches to postcopy.
    pub fn switch_on_stall(&self) -> bool {
        matches!(self, Mode::Hybrid { on_stall: true, .. })
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    /// `precopy`, `postcopy`, or `hybrid` (switching after the full pass;
    /// set `after_rounds` for more).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "precopy" => Ok(Mode::Precopy),
            "postcopy" => Ok(Mode::Postcopy),
            "hybrid" => Ok(Mode::Hybrid {
                after_rounds: 1,
                on_stall: false,
            }),
            _ => Err(format!(
                "unknown mode '{s}': expected precopy, postcopy or hybrid"
            )),
        }
    }
}

impl Mode {
    /// This mode, if hybrid switching after `rounds` precopy rounds, and on
    /// a stall if `on_stall`. Without `rounds`: after the full pass, or
    /// only on a stall (or at the round cap) if `on_stall`.
    pub fn with_switch(self, rounds: Option<u32>, on_stall: bool) -> Self {
        match self {
            Mode::Hybrid { .. } => Mode::Hybrid {
                after_rounds: rounds.unwrap_or(if on_stall { u32::MAX } else { 1 }).max(1),
                on_stall,
            },
            m => m,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub use crate::summary::PostcopyReport;

pub use crate::error::PostcopyResume;

/// Whether a postcopy that failed with `e` may be recovered: the
/// connections broke or stood still, and the peer said nothing.
pub(crate) fn recoverable(e: &crate::error::MigrationError) -> bool {
    crate::transport::health::is_link_failure(e)
        || matches!(e, crate::error::MigrationError::Stalled { .. })
}
