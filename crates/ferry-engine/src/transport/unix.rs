//! The VMM's own transports: UNIX sockets, and connections the caller
//! already holds (an orchestrator opened them and passed the fds, as
//! QEMU's `unix:` and `fd:` migration URIs do).
//!
//! ```text
//!   UnixDialer(path) ── connect per connection ──► UnixListener (Listen)
//!   HeldConnections  ── hands out the connections it was given, in order:
//!                       the main channel first, then each data connection,
//!                       then (postcopy) the priority connection
//! ```
//!
//! A migration opens 1 + `connections` connections (one more where the mode
//! may switch to postcopy). Held connections must be at least that many on
//! both sides; one short is refused by name, never waited for.

use super::set::{Dial, Listen};
use super::tcp::accept_until;
use super::Link;
use crate::error::TransportError;
use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

impl Link for UnixStream {
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_link(&self, how: Shutdown) {
        // Already shut down: nothing left to stop.
        let _ = self.shutdown(how);
    }
    fn set_read_timeout_link(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
    fn set_write_timeout_link(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(t)
    }
    fn peer_name(&self) -> String {
        match self
            .peer_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(Path::to_owned))
        {
            Some(path) => format!("unix:{}", path.display()),
            None => format!("unix socket fd {}", self.as_raw_fd()),
        }
    }
    fn peer_on_this_host(&self) -> bool {
        true
    }
}

/// Connects to a UNIX socket for every connection of a migration.
#[derive(Clone, Debug)]
pub struct UnixDialer(pub PathBuf);

impl Dial for UnixDialer {
    fn dial(&self) -> Result<Box<dyn Link>, TransportError> {
        let s = UnixStream::connect(&self.0).map_err(|source| TransportError::Connect {
            addr: format!("unix:{}", self.0.display()),
            source,
        })?;
        Ok(Box::new(s))
    }
}

/// Binds a UNIX socket at `path` to listen on. A socket file left there by
/// a process that is gone is replaced; any other file is not.
pub fn listen_unix(path: &Path) -> Result<UnixListener, TransportError> {
    let name = format!("unix:{}", path.display());
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        let stale = meta.file_type().is_socket() && UnixStream::connect(path).is_err();
        if stale {
            let _ = std::fs::remove_file(path);
        }
    }
    UnixListener::bind(path).map_err(|source| TransportError::Listen { addr: name, source })
}

impl Listen for UnixListener {
    fn accept_link(&self, deadline: Option<Instant>) -> Result<Box<dyn Link>, TransportError> {
        let name = self
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
            .unwrap_or_else(|| "the UNIX listener".into());
        let listen = |source| TransportError::Listen {
            addr: name.clone(),
            source,
        };
        let Some(deadline) = deadline else {
            return Ok(Box::new(self.accept().map_err(listen)?.0));
        };
        self.set_nonblocking(true).map_err(listen)?;
        let got = accept_until(&name, deadline, || self.accept().map(|(s, _)| s));
        self.set_nonblocking(false).map_err(listen)?;
        let s = got?;
        s.set_nonblocking(false).map_err(listen)?;
        Ok(Box::new(s))
    }
}

/// Connections the caller already holds, handed out in order to a source
/// (as its [`Dial`]) or a destination (as its [`Listen`]).
pub struct HeldConnections {
    links: Mutex<VecDeque<Box<dyn Link>>>,
    given: usize,
}

impl HeldConnections {
    /// These connections, in the order the migration opens them.
    pub fn new(links: Vec<Box<dyn Link>>) -> Self {
        HeldConnections {
            given: links.len(),
            links: Mutex::new(links.into()),
        }
    }

    /// Connected stream sockets passed as fds (UNIX or TCP, told apart by
    /// the socket's domain). An fd that is no stream socket is refused,
    /// naming it.
    pub fn from_fds(fds: Vec<OwnedFd>) -> Result<Self, TransportError> {
        let links = fds
            .into_iter()
            .map(link_from_fd)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(links))
    }

    fn next(&self) -> Result<Box<dyn Link>, TransportError> {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links
            .pop_front()
            .ok_or(TransportError::NoHeldConnection { given: self.given })
    }
}

impl Dial for HeldConnections {
    fn dial(&self) -> Result<Box<dyn Link>, TransportError> {
        self.next()
    }
    fn available(&self) -> Option<usize> {
        Some(self.links.lock().unwrap_or_else(|p| p.into_inner()).len())
    }
}

impl Listen for HeldConnections {
    fn accept_link(&self, _deadline: Option<Instant>) -> Result<Box<dyn Link>, TransportError> {
        self.next()
    }
}

/// A connected stream socket passed as `fd`.
fn link_from_fd(fd: OwnedFd) -> Result<Box<dyn Link>, TransportError> {
    let raw = fd.as_raw_fd();
    let not_a_socket = |why: String| TransportError::BadFd { fd: raw, why };
    let int_opt = |opt| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `raw` is an fd this function owns; `v` and `len` are
        // valid for the call and sized for an int option.
        let r = unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r == 0 {
            Ok(v)
        } else {
            Err(io::Error::last_os_error())
        }
    };
    let kind = int_opt(libc::SO_TYPE).map_err(|e| not_a_socket(format!("not a socket ({e})")))?;
    if kind != libc::SOCK_STREAM {
        return Err(not_a_socket("not a stream socket".into()));
    }
    match int_opt(libc::SO_DOMAIN).map_err(|e| not_a_socket(e.to_string()))? {
        libc::AF_UNIX => Ok(Box::new(UnixStream::from(fd))),
        libc::AF_INET | libc::AF_INET6 => {
            let s = TcpStream::from(fd);
            s.set_nodelay(true)
                .map_err(|e| not_a_socket(format!("TCP_NODELAY: {e}")))?;
            Ok(Box::new(s))
        }
        other => Err(not_a_socket(format!(
            "a socket of domain {other}, not UNIX or TCP"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn held_connections_come_out_in_order_then_run_out() {
        let (a, mut a_peer) = UnixStream::pair().unwrap();
        let (b, mut b_peer) = UnixStream::pair().unwrap();
        let held = HeldConnections::from_fds(vec![a.into(), b.into()]).unwrap();
        for (peer, byte) in [(&mut a_peer, b'a'), (&mut b_peer, b'b')] {
            let mut link = held.dial().unwrap();
            link.write_all(&[byte]).unwrap();
            let mut got = [0u8];
            peer.read_exact(&mut got).unwrap();
            assert_eq!(got[0], byte);
        }
        let err = held.dial().err().unwrap().to_string();
        assert!(err.contains("2 connections were handed over"), "{err}");
    }

    #[test]
    fn a_unix_peer_is_on_this_host() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(a.peer_on_this_host());
    }

    #[test]
    fn an_fd_that_is_no_stream_socket_is_refused_by_number() {
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let raw = file.as_raw_fd();
        let err = HeldConnections::from_fds(vec![file.into()])
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with(&format!("fd {raw}: not a socket")), "{err}");
    }
}
