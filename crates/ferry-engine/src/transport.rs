//! TCP transport helpers. The engine itself runs over any `Read + Write`;
//! these set up the common case.
//!
//! Socket buffers are left to Linux's TCP autotuning: setting `SO_SNDBUF`
//! pins the size and turns autotuning off, which on a fast link makes things
//! slower. Large writes come from [`crate::stream::FrameStream`] instead
//! (1 MiB buffer, page data written through), and Nagle is off so the small
//! switchover frames leave at once.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;
use thiserror::Error;

/// How long [`connect`] tries each address.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Connects to `addr` (host:port) with [`CONNECT_TIMEOUT`] per address, and
/// disables Nagle.
pub fn connect<A: ToSocketAddrs + std::fmt::Display>(addr: A) -> Result<TcpStream, TransportError> {
    let name = addr.to_string();
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| TransportError::Resolve {
            addr: name.clone(),
            source,
        })?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => {
                prepare(&s, &name)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(source) => TransportError::Connect { addr: name, source },
        None => TransportError::NoAddress { addr: name },
    })
}

/// Binds a listener on `addr`.
pub fn listen<A: ToSocketAddrs + std::fmt::Display>(
    addr: A,
) -> Result<TcpListener, TransportError> {
    let name = addr.to_string();
    TcpListener::bind(addr).map_err(|source| TransportError::Listen { addr: name, source })
}

/// Accepts one connection on `listener` and sets it up like [`connect`].
pub fn accept(listener: &TcpListener) -> Result<(TcpStream, SocketAddr), TransportError> {
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "the listener".into());
    let (s, peer) = listener.accept().map_err(|source| TransportError::Listen {
        addr: local,
        source,
    })?;
    prepare(&s, &peer.to_string())?;
    Ok((s, peer))
}

fn prepare(s: &TcpStream, name: &str) -> Result<(), TransportError> {
    s.set_nodelay(true).map_err(|source| TransportError::Setup {
        addr: name.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_address() {
        let err = listen("127.0.0.1:99999").unwrap_err().to_string();
        assert!(err.contains("127.0.0.1:99999"), "{err}");
        let l = listen("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let err = connect(format!("127.0.0.1:{port}"))
            .unwrap_err()
            .to_string();
        assert_eq!(err, format!("cannot connect to 127.0.0.1:{port}"));
    }

    #[test]
    fn connect_and_accept() {
        let l = listen("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || accept(&l).map(|(s, _)| s.nodelay().unwrap()));
        let s = connect(addr).unwrap();
        assert!(s.nodelay().unwrap());
        assert!(t.join().unwrap().unwrap());
    }
}
