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
    Ram(#[from] ferry_vm::RamError),
    /// The workload cannot run.
    #[error("workload")]
    Workload(#[from] ferry_memstress::WorkloadError),
    /// Options of an experiment that cannot work.
    #[error("invalid options: {0}")]
    Options(String),
    /// A vCPU touched a page that is not present yet (postcopy): an
    /// annotated memory-fault exit.
    #[error("memory fault at {} ({} bytes, write: {})", .0.gpa, .0.size, .0.flags.write)]
    MemoryFault(crate::fault::MemoryFault),
    /// A vCPU's missing page could not be brought in (postcopy failed).
    #[error(transparent)]
    Fetch(#[from] ferry_vm::FetchError),
    /// A worker thread panicked.
    #[error("thread {0} panicked")]
    Thread(String),
}
