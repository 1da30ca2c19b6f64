//! TCP: connect, listen and accept with clear errors, and [`Link`] for a
//! socket.
//!
//! Socket buffers are left to Linux's TCP autotuning: setting `SO_SNDBUF`
//! pins the size and turns autotuning off, which on a fast link makes things
//! slower. Large writes come from [`crate::wire::FrameStream`] instead
//! (1 MiB buffer, page data written through), and Nagle is off so the small
//! switchover frames leave at once.

use super::set::{Dial, Listen};
use super::Link;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long [`connect`] tries each address.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

use crate::error::TransportError;

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

/// Dials a TCP address for every connection of a migration.
#[derive(Clone, Debug)]
pub struct TcpDialer(pub String);

impl Dial for TcpDialer {
    fn dial(&self) -> Result<Box<dyn Link>, TransportError> {
        Ok(Box::new(connect(self.0.as_str())?))
    }
}

impl Listen for TcpListener {
    fn accept_link(&self, deadline: Option<Instant>) -> Result<Box<dyn Link>, TransportError> {
        Ok(Box::new(accept_by(self, deadline)?))
    }
}

/// Accepts one connection on `listener` like [`accept`], giving up at
/// `deadline` if one is given.
pub fn accept_by(
    listener: &TcpListener,
    deadline: Option<Instant>,
) -> Result<TcpStream, TransportError> {
    let Some(deadline) = deadline else {
        return Ok(accept(listener)?.0);
    };
    let name = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "the listener".into());
    let setup = |source| TransportError::Setup {
        addr: name.clone(),
        source,
    };
    listener.set_nonblocking(true).map_err(setup)?;
    let got = accept_until(&name, deadline, || listener.accept());
    listener.set_nonblocking(false).map_err(setup)?;
    let (s, peer) = got?;
    s.set_nonblocking(false).map_err(setup)?;
    prepare(&s, &peer.to_string())?;
    Ok(s)
}

/// Polls `accept` on a non-blocking listener named `name` until it gives a
/// connection, fails, or `deadline` passes (TCP's and UNIX's listeners).
pub(crate) fn accept_until<T>(
    name: &str,
    deadline: Instant,
    mut accept: impl FnMut() -> io::Result<T>,
) -> Result<T, TransportError> {
    let started = Instant::now();
    loop {
        match accept() {
            Ok(got) => return Ok(got),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(TransportError::AcceptTimeout {
                        addr: name.to_string(),
                        // Rounded: a wait set from just before this call
                        // ends a hair short of its whole seconds.
                        secs: started.elapsed().as_secs_f64().round() as u64,
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(TransportError::Listen {
                    addr: name.to_string(),
                    source,
                })
            }
        }
    }
}

impl Link for TcpStream {
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_link(&self, how: Shutdown) {
        // Already shut down or never connected: nothing left to stop.
        let _ = self.shutdown(how);
    }
    fn set_read_timeout_link(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
    fn set_write_timeout_link(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(t)
    }
    fn peer_name(&self) -> String {
        self.peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "the peer".into())
    }
    fn queued_bytes(&self) -> Option<u64> {
        send_queue(self)
    }
    fn peer_on_this_host(&self) -> bool {
        peer_on_this_host(self)
    }
}

/// Whether `s`'s peer is on this host: at a loopback address, or at the
/// address this end has.
pub(crate) fn peer_on_this_host(s: &TcpStream) -> bool {
    match (s.peer_addr(), s.local_addr()) {
        (Ok(peer), Ok(us)) => peer.ip().is_loopback() || peer.ip() == us.ip(),
        _ => false,
    }
}

/// The bytes in `s`'s send queue not yet acknowledged (`SIOCOUTQ`).
pub(crate) fn send_queue(s: &TcpStream) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) on a socket fd we hold writes one c_int
    // through the pointer, which points at a live local.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    (rc == 0).then_some(queued.max(0) as u64)
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
    fn the_send_queue_holds_what_the_peer_has_not_acknowledged() {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        assert_eq!(s.queued_bytes(), Some(0));
        // Loopback acknowledges at once; what the peer's full receive
        // buffer refuses stays queued here.
        peer.set_nonblocking(true).unwrap();
        s.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut sent = 0u64;
        for _ in 0..64 {
            match s.write(&chunk) {
                Ok(n) => sent += n as u64,
                Err(_) => break,
            }
        }
        let queued = s.queued_bytes().unwrap();
        assert!(queued > 0 && queued <= sent, "{queued} of {sent}");
    }

    #[test]
    fn a_loopback_peer_is_on_this_host() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        assert!(s.peer_on_this_host() && peer.peer_on_this_host());
    }

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
