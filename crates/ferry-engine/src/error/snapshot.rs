//! What went wrong saving or restoring a snapshot ([`crate::snapshot`]).
//! Every refusal of a file names the file, the part and its offset, so
//! that an operator can tell a truncated copy from a flipped bit.

use ferry_vm::{RamError, VmError};
use std::path::PathBuf;

/// Why a snapshot could not be saved or restored.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file could not be made, read or written.
    #[error("cannot {what} {path}")]
    Io {
        /// What was being done: create, read, write, sync, rename.
        what: &'static str,
        /// Which file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start as a snapshot does.
    #[error("{path} is not a ferry snapshot (it does not start with FERRYSNP)")]
    NotASnapshot {
        /// Which file.
        path: PathBuf,
    },
    /// The file's format is one this release does not read.
    #[error(
        "{path} is in snapshot format {found}, and this release reads formats {oldest} to \
         {newest}"
    )]
    Version {
        /// Which file.
        path: PathBuf,
        /// The file's format.
        found: u32,
        /// The oldest this release reads.
        oldest: u32,
        /// The newest this release reads (and writes).
        newest: u32,
    },
    /// A part of the file ends past the file's end.
    #[error(
        "{path} is truncated: its {part} at offset {offset} ({len} bytes) ends past the \
         file's end ({size} bytes)"
    )]
    Truncated {
        /// Which file.
        path: PathBuf,
        /// superblock, manifest, vCPU state, sections, page hashes, pages.
        part: &'static str,
        /// Where the part starts in the file.
        offset: u64,
        /// Its length.
        len: u64,
        /// The file's size.
        size: u64,
    },
    /// A part of the file fails its checksum.
    #[error("{path} is damaged: its {part} at offset {offset} ({len} bytes) fails its checksum")]
    Damaged {
        /// Which file.
        path: PathBuf,
        /// superblock, manifest, vCPU state, sections, page hashes.
        part: &'static str,
        /// Where the part starts in the file.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// A page of guest memory in the file is not what was saved.
    #[error(
        "{path} is damaged: guest page {gfn:#x} at offset {offset} does not hold what was \
         saved (its hash differs)"
    )]
    DamagedPage {
        /// Which file.
        path: PathBuf,
        /// The guest frame.
        gfn: u64,
        /// Where the page starts in the file.
        offset: u64,
    },
    /// The manifest passed its checksum but does not describe a snapshot
    /// this release can restore.
    #[error("{path}: the manifest is not one this release reads: {detail}")]
    Manifest {
        /// Which file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The sections the devices saved are not what the VM declared (a
    /// version other than its spec's, or more bytes than declared).
    #[error("the devices' saved state does not match what the VM declared: {0}")]
    Sections(String),
    /// A diff snapshot's parent is missing, another VM's, not the one it
    /// was taken against, or its chain is too long.
    #[error("{path}, a diff snapshot's parent: {detail}")]
    Parent {
        /// The parent (or the last file of the chain reached).
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The VM the factory built cannot take this snapshot.
    #[error("the snapshot does not fit the VM built for it: {0}")]
    Header(String),
    /// The guest wrote memory that its dirty logs did not report while the
    /// snapshot was taken: the paused guest's memory is not what the file
    /// holds. The file is not kept, and the guest runs on.
    #[error(
        "the paused guest's memory (digest {memory:#018x}) is not what the file holds \
         ({file:#018x}): a write escaped the dirty logs; the snapshot is not kept"
    )]
    Untracked {
        /// The digest of the paused guest's memory.
        memory: u64,
        /// The digest of the pages the file holds.
        file: u64,
    },
    /// Cancelled through [`crate::Tunables::cancel`] before the pause: the
    /// file is not kept, and the guest runs on.
    #[error("snapshot cancelled; the guest runs on, and {path} was not written")]
    Cancelled {
        /// The file that was not written.
        path: PathBuf,
    },
    /// The restored guest's memory is not what the snapshot describes.
    #[error("the restored memory's digest {restored:#018x} is not the snapshot's {saved:#018x}")]
    Digest {
        /// The snapshot's digest.
        saved: u64,
        /// The restored memory's.
        restored: u64,
    },
    /// A lazy restore cannot go on (or start) on this VM or host.
    #[error("cannot restore lazily: {detail}")]
    Lazy {
        /// Why.
        detail: String,
    },
    /// The VM refused an operation.
    #[error("cannot {what}")]
    Vm {
        /// What the engine asked of it.
        what: &'static str,
        /// Why.
        #[source]
        source: VmError,
    },
    /// Guest memory could not be read or written.
    #[error("cannot {what}")]
    Ram {
        /// What the engine was doing.
        what: &'static str,
        /// Why.
        #[source]
        source: RamError,
    },
    /// A dirty log could not be started or read.
    #[error(transparent)]
    DirtyLog(Box<super::MigrationError>),
    /// The convergence policy asked for is one the VM does not serve, or
    /// the VM refused what the policy set (the guest then runs on, with
    /// nothing the snapshot set left in force).
    #[error(transparent)]
    Converge(Box<super::MigrationError>),
}

impl SnapshotError {
    /// A closure for `map_err` naming what the VM was asked.
    pub(crate) fn vm(what: &'static str) -> impl FnOnce(VmError) -> Self {
        move |source| SnapshotError::Vm { what, source }
    }

    /// A closure for `map_err` naming what was done to guest memory.
    pub(crate) fn ram(what: &'static str) -> impl FnOnce(RamError) -> Self {
        move |source| SnapshotError::Ram { what, source }
    }

    /// A closure for `map_err` naming what was done to `path`.
    pub(crate) fn io<'a>(
        what: &'static str,
        path: &'a std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| SnapshotError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}
