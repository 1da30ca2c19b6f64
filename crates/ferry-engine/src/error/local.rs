//! What went wrong in a same-host migration: [`crate::local`]'s error, kept
//! here so that [`MigrationError`](super::MigrationError) wraps it without
//! depending on the same-host mode.

use std::path::PathBuf;

/// What went wrong in a same-host migration.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The VM's memory has no files to hand over.
    #[error(
        "a same-host migration hands guest memory over as files, and this VM's memory is \
         anonymous: start it with --backing memfd (or on hugetlbfs files)"
    )]
    NotFileBacked,
    /// The socket could not be reached or made.
    #[error("cannot {what} the socket {path}")]
    Path {
        /// connect, listen on, accept on.
        what: &'static str,
        /// Which.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Sending or receiving a message failed.
    #[error("cannot {what} {message}")]
    Socket {
        /// send or receive.
        what: &'static str,
        /// Which message.
        message: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The destination asked for an fd the source did not hand over.
    #[error("the source handed over no fd named '{name}' (it handed: {handed})")]
    NoHandedFd {
        /// The name asked for.
        name: String,
        /// The names it did hand over.
        handed: String,
    },
    /// The source could not start the thread that hashes guest memory
    /// during the handshake.
    #[error("cannot start the thread that hashes guest memory")]
    Thread {
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The peer broke the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The destination refused the VM; the source runs on.
    #[error("the destination refused the VM: {0}")]
    Refused(String),
    /// The destination could not load the state; the source runs on.
    #[error("the destination failed before it resumed: {0}")]
    Failed(String),
    /// The memory the destination maps is not the source's.
    #[error("digest mismatch: the source's memory hashes to {source_digest:#018x}, the destination's to {destination_digest:#018x}")]
    DigestMismatch {
        /// The source's digest at the pause.
        source_digest: u64,
        /// The destination's.
        destination_digest: u64,
    },
    /// The destination went away after Go and before saying it resumed.
    #[error(
        "the destination went away after it was told to resume and before it said it had: the \
         source holds its paused copy, since the guest may run there"
    )]
    Unconfirmed,
}
