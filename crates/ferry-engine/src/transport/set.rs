//! Opening the connections of one migration.
//!
//! Every connection starts the same way, so a destination can tell a
//! migration's main channel from its data connections, and a stray or
//! foreign connection from both:
//!
//! ```text
//!   source                                   destination
//!   preamble (magic, versions), Hello ─────► version check, session check
//!                       ◄───────────────── Welcome(version) | Error(reason)
//! ```
//!
//! A version mismatch is refused with an Error frame naming both versions. A
//! ferry that speaks v1 answers a v2 preamble the same way, so either side of
//! a mixed pair says what is wrong.

use super::{Channel, Link};
use crate::error::MigrationError;
use crate::error::TransportError;
use crate::wire::messages::Hello;
use crate::wire::{FrameKind, FrameStream, Message, StreamError};
use std::time::{Duration, Instant};

/// Opens connections to a destination.
pub trait Dial: Sync {
    /// A new connection.
    fn dial(&self) -> Result<Box<dyn Link>, TransportError>;
    /// Whether the connections are TLS (for the summary).
    fn tls(&self) -> bool {
        false
    }
    /// How many connections it can still open, where that is bounded
    /// (connections handed over): a migration that needs more is refused
    /// before it starts. `None`: as many as asked.
    fn available(&self) -> Option<usize> {
        None
    }
}

/// Where a destination waits for connections.
pub trait Listen {
    /// The next connection; by `deadline` if one is given.
    fn accept_link(&self, deadline: Option<Instant>) -> Result<Box<dyn Link>, TransportError>;
    /// Whether the connections are TLS (for the summary).
    fn tls(&self) -> bool {
        false
    }
}

/// Source side: dials one connection and introduces it as `hello`. Waits at
/// most `timeout` for the destination's answer. Returns the framed link and
/// the version the destination chose.
pub fn open_channel(
    dialer: &dyn Dial,
    hello: Hello,
    timeout: Duration,
) -> Result<Channel, MigrationError> {
    let link = dialer.dial()?;
    link.set_read_timeout_link(Some(timeout))
        .map_err(StreamError::Io)?;
    let mut io = FrameStream::new(link);
    io.write_preamble()?;
    let msg = Message::Hello(hello);
    io.write_frame(msg.kind(), &[&msg.encode()])?;
    io.flush()?;
    let (kind, offset) = io.read_frame().map_err(|e| match e {
        StreamError::Io(e) if is_timeout(&e) => MigrationError::Stalled {
            peer: "destination",
            secs: timeout.as_secs_f64(),
        },
        e => e.into(),
    })?;
    match Message::decode(kind, io.payload(), offset)? {
        Message::Welcome { version }
            if (crate::wire::MIN_VERSION..=crate::wire::VERSION).contains(&version) =>
        {
            io.set_version(version);
        }
        Message::Welcome { version } => {
            return Err(StreamError::Version {
                peer_min: version,
                peer_max: version,
            }
            .into())
        }
        Message::Error(message) => {
            return Err(MigrationError::Peer {
                peer: "destination",
                message,
            })
        }
        m => {
            return Err(MigrationError::Protocol {
                expected: "Welcome",
                got: m.kind(),
                offset,
            })
        }
    }
    io.get_ref()
        .set_read_timeout_link(None)
        .map_err(StreamError::Io)?;
    Ok(io)
}

/// Destination side: accepts one connection (by `deadline`, if given),
/// reads its preamble and Hello, and checks them with `admit`, which returns
/// a reason to refuse. Welcomes it, or sends the reason as an Error frame
/// and fails with it.
pub fn accept_channel(
    listener: &dyn Listen,
    deadline: Option<Instant>,
    admit: &dyn Fn(&Hello) -> Result<(), String>,
) -> Result<(Channel, Hello), MigrationError> {
    let link = listener.accept_link(deadline)?;
    tracing::debug!("connection from {}", link.peer_name());
    let mut io = FrameStream::new(link);
    let hello = read_hello(&mut io);
    let hello = match hello.and_then(|h| admit(&h).map(|_| h).map_err(Refused::Admit)) {
        Ok(h) => h,
        Err(r) => {
            let e = match r {
                Refused::Stream(e) => e,
                Refused::Admit(reason) => MigrationError::Refused(reason),
            };
            refuse(&mut io, &e);
            return Err(e);
        }
    };
    let welcome = Message::Welcome {
        version: io.version(),
    };
    io.write_frame(welcome.kind(), &[&welcome.encode()])?;
    io.flush()?;
    Ok((io, hello))
}

enum Refused {
    Stream(MigrationError),
    Admit(String),
}

fn read_hello(io: &mut Channel) -> Result<Hello, Refused> {
    io.read_preamble().map_err(|e| Refused::Stream(e.into()))?;
    let (kind, offset) = io.read_frame().map_err(|e| Refused::Stream(e.into()))?;
    if kind != FrameKind::Hello {
        return Err(Refused::Stream(MigrationError::Protocol {
            expected: "Hello",
            got: kind,
            offset,
        }));
    }
    match Message::decode(kind, io.payload(), offset) {
        Ok(Message::Hello(h)) => Ok(h),
        Ok(m) => Err(Refused::Stream(MigrationError::Protocol {
            expected: "Hello",
            got: m.kind(),
            offset,
        })),
        Err(e) => Err(Refused::Stream(e.into())),
    }
}

/// Sends `e` to the peer as an Error frame, best effort (the link may be
/// what broke).
pub fn refuse(io: &mut Channel, e: &MigrationError) {
    let msg = Message::Error(e.chain());
    if io.write_frame(msg.kind(), &[&msg.encode()]).is_ok() {
        let _ = io.flush();
    }
    let link = io.get_ref();
    link.shutdown_link(std::net::Shutdown::Write);
    // Read what the peer still sends until it closes (it does once it has
    // our Error), so closing does not reset the connection under the Error.
    if link
        .set_read_timeout_link(Some(Duration::from_millis(100)))
        .is_ok()
    {
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut sink = [0u8; 4096];
        while Instant::now() < deadline {
            match std::io::Read::read(io.get_mut(), &mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if is_timeout(&e) => {}
                Err(_) => break,
            }
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}
