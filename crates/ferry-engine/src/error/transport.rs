//! Why a connection could not be set up: [`crate::transport`]'s error, kept
//! here so that [`MigrationError`](super::MigrationError) wraps it without
//! depending on the transport.

use std::io;
use thiserror::Error;

/// Errors setting up a connection.
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum TransportError {
    /// The address did not resolve.
    #[error("cannot resolve {addr}")]
    Resolve {
        /// The address as given.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// No address to connect to.
    #[error("{addr} resolves to no address")]
    NoAddress {
        /// The address as given.
        addr: String,
    },
    /// Connecting failed.
    #[error("cannot connect to {addr}")]
    Connect {
        /// The address tried.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Binding failed.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The caller handed over fewer connections than the migration opens.
    #[error(
        "the migration needs another connection, and only {given} connections were handed over \
         (it opens 1 + --connections, and one more where it may switch to postcopy)"
    )]
    NoHeldConnection {
        /// How many were handed over.
        given: usize,
    },
    /// Fewer connections were handed over than the migration opens.
    #[error(
        "the migration opens {needed} connections (1 main, {data} data{priority}), \
         and {given} were handed over"
    )]
    TooFewHeld {
        /// Connections it opens.
        needed: usize,
        /// Of those, data connections.
        data: usize,
        /// ", 1 priority" where it may switch to postcopy.
        priority: &'static str,
        /// Connections handed over.
        given: usize,
    },
    /// An fd handed over is not a connected stream socket.
    #[error("fd {fd}: {why}")]
    BadFd {
        /// The fd.
        fd: i32,
        /// What it is instead.
        why: String,
    },
    /// No connection arrived in time.
    #[error("no connection from the source on {addr} within {secs} s")]
    AcceptTimeout {
        /// The listening address.
        addr: String,
        /// How long we waited.
        secs: u64,
    },
    /// The TLS handshake failed, or the peer does not speak TLS.
    #[error("TLS with {peer}: {reason}")]
    Tls {
        /// The peer.
        peer: String,
        /// What went wrong, in words.
        reason: String,
    },
    /// Setting a socket option failed.
    #[error("cannot set up the connection to {addr}")]
    Setup {
        /// The peer.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}
