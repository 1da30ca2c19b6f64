//! Transport: the connections one migration runs over, and what keeps them
//! honest.
//!
//! ```text
//!   tcp       connect / listen / accept with clear errors; a Link is one socket
//!   set       opening a migration's connections: preamble + Hello → Welcome | Error
//!   health    the first failure of any thread, stall detection, shutting links down
//!   main_channel  the main channel: a reader thread, a shared writer, heartbeats
//!   tls       mutual TLS on every connection (--tls-dir), and throwaway certificates
//!   unix      UNIX sockets, and connections the caller already holds (fds)
//! ```
//!
//! A migration has one main channel and N data connections (see
//! [`crate::wire`]). The main channel is read on its own thread on both
//! sides, so an Error or a heartbeat never waits behind page data: a refusal
//! reaches the source while its senders are blocked writing pages, and a link
//! that stops moving is noticed by whichever side is waiting. Every blocking
//! call on a link returns once [`health::Health`] shuts the links down.

pub(crate) mod health;
pub mod main_channel;
pub mod set;
pub mod tcp;
pub mod tls;
pub mod unix;

pub(crate) use health::{Health, Side};
pub use main_channel::MainChannel;
pub use set::{accept_channel, open_channel, Dial, Listen};
pub use tcp::{accept, connect, listen, TcpDialer};
pub use tls::{TlsConfig, TlsDialer, TlsError, TlsListener};
pub use unix::{listen_unix, HeldConnections, UnixDialer};

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::time::Duration;

/// One framed connection of a migration.
pub type Channel = crate::wire::FrameStream<Box<dyn Link>>;

/// One connection of a migration: a duplex byte stream that a second thread
/// can hold a handle on, and that can be shut down from any thread.
pub trait Link: Read + Write + Send {
    /// Another handle on the same connection (for a reader thread, or to
    /// shut it down from elsewhere).
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>>;
    /// Shuts the connection down; blocked reads and writes on every handle
    /// return.
    fn shutdown_link(&self, how: Shutdown);
    /// Bounds how long one read may block (`None`: for ever).
    fn set_read_timeout_link(&self, t: Option<Duration>) -> io::Result<()>;
    /// Bounds how long one write may block (`None`: for ever).
    fn set_write_timeout_link(&self, t: Option<Duration>) -> io::Result<()>;
    /// The peer's address, for messages.
    fn peer_name(&self) -> String;
    /// Bytes written but not yet acknowledged by the peer (the kernel's
    /// send queue), where the link can tell. A final round's pages wait
    /// behind them, so the switchover counts them in its downtime.
    fn queued_bytes(&self) -> Option<u64> {
        None
    }
    /// Whether the peer runs on this host (a UNIX socket, a TCP peer at a
    /// loopback address or at this end's own): the two ends then share
    /// this host's CPUs. False where the link cannot tell.
    fn peer_on_this_host(&self) -> bool {
        false
    }
}
