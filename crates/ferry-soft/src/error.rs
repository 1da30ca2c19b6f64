//! Errors of the soft backend.

use crate::table::ArenaError;

/// What can go wrong in the soft MMU, its vCPUs and its experiments.
#[derive(Debug, thiserror::Error)]
pub enum SoftError {
    /// The page-table arena ran out (a bug in its size bound).
    #[error("page tables")]
    Arena(#[from] ArenaError),
    /// A guest access outside guest memory.
    #[error("guest access at gfn {0:#x} is outside guest memory")]
    OutOfRange(u64),
    /// Guest RAM failed.
    #[error("guest RAM")]
    Ram(#[from] ferry_backend::RamError),
    /// The workload cannot run.
    #[error("workload")]
    Workload(#[from] ferry_backend::WorkloadError),
    /// Options of an experiment that cannot work.
    #[error("invalid options: {0}")]
    Options(String),
    /// A worker thread panicked.
    #[error("thread {0} panicked")]
    Thread(String),
}
