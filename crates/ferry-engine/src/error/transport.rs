//! Why a connection could not be set up: [`crate::transport`]'s error, kept
//! here so that [`MigrationError`](super::MigrationError) wraps it without
//! depending on the transport.

use std::io;
use thiserror::Error;

/// Errors setting up a connection.
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
