//! [`TlsLink`]: one TLS session over one TCP socket, usable from a reader
//! thread and a writer thread at once.
//!
//! A rustls session is one object that both directions need, so it cannot be
//! split into a read half and a write half the way a socket can. Instead the
//! session sits behind a mutex that is only ever held for in-memory work
//! (decrypting what arrived, sealing what is to leave). Blocking socket I/O
//! happens outside it:
//!
//! ```text
//!   reader: [recv lock] socket.read → raw ─► [session] decrypt → plaintext
//!   writer: [send lock] [session] seal → records ─► socket.write_all
//! ```
//!
//! The send lock is held from sealing until the records are on the socket,
//! so records leave in sequence order even with several writers; the recv
//! lock keeps raw bytes in arrival order. A writer blocked on a full socket
//! therefore never stops the reader, and the heartbeat and Error frames of
//! the main channel flow as they do over plain TCP. Timeouts and
//! shutdown act on the socket, so [`Link`] behaves exactly as for TCP.

use super::super::Link;
use rustls::Connection;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Bytes of sealed records one write may produce: a whole 1 MiB page write
/// becomes one socket write.
const SEAL_LIMIT: usize = 1 << 20;
/// Bytes read from the socket at a time.
const RAW_CHUNK: usize = 256 << 10;

/// One TLS connection of a migration; see the module docs.
pub struct TlsLink {
    tcp: TcpStream,
    shared: Arc<Shared>,
    raw: Vec<u8>,
    sealed: Vec<u8>,
}

struct Shared {
    session: Mutex<Session>,
    recv: Mutex<()>,
    send: Mutex<()>,
    peer: String,
    /// "source" or "destination": who is at the other end, for messages.
    peer_role: &'static str,
}

struct Session {
    conn: Connection,
    /// Raw bytes read from the socket that rustls has not taken yet.
    pending: Vec<u8>,
    start: usize,
    eof: bool,
    eof_fed: bool,
    /// A failure found while plaintext was still being handed out; reported
    /// by the next read.
    failed: Option<(io::ErrorKind, String)>,
}

enum Drained {
    Data(usize),
    Closed,
    Empty,
    Failed(io::Error),
}

impl TlsLink {
    /// Wraps a session whose handshake is complete.
    pub(super) fn new(tcp: TcpStream, mut conn: Connection, peer_role: &'static str) -> Self {
        conn.set_buffer_limit(Some(SEAL_LIMIT));
        let peer = tcp
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "the peer".into());
        TlsLink {
            tcp,
            shared: Arc::new(Shared {
                session: Mutex::new(Session {
                    conn,
                    pending: Vec::new(),
                    start: 0,
                    eof: false,
                    eof_fed: false,
                    failed: None,
                }),
                recv: Mutex::new(()),
                send: Mutex::new(()),
                peer,
                peer_role,
            }),
            raw: Vec::new(),
            sealed: Vec::new(),
        }
    }

    /// Sends whatever the session has sealed (an alert, say), best effort:
    /// skipped if a writer holds the send lock, so a failing reader never
    /// waits on a blocked writer.
    fn send_pending(&mut self) {
        let Ok(_send) = self.shared.send.try_lock() else {
            return;
        };
        self.sealed.clear();
        {
            let mut s = lock(&self.shared.session);
            while s.conn.wants_write() {
                if s.conn.write_tls(&mut self.sealed).is_err() {
                    break;
                }
            }
        }
        let _ = self.tcp.write_all(&self.sealed);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere leaves the session as it was between calls; the
    // connection then fails on its own terms.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    /// Hands out decrypted bytes, decrypting what already arrived as needed.
    fn drain_into(&mut self, buf: &mut [u8], peer_role: &str) -> Drained {
        let mut filled = 0;
        loop {
            if filled == buf.len() {
                return Drained::Data(filled);
            }
            match self.conn.reader().read(&mut buf[filled..]) {
                Ok(0) => {
                    return if filled > 0 {
                        Drained::Data(filled)
                    } else {
                        Drained::Closed
                    }
                }
                Ok(n) => {
                    filled += n;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if filled > 0 => {
                    self.failed = Some((e.kind(), e.to_string()));
                    return Drained::Data(filled);
                }
                Err(e) => return Drained::Failed(e),
            }
            if let Some((kind, msg)) = self.failed.take() {
                return if filled > 0 {
                    self.failed = Some((kind, msg));
                    Drained::Data(filled)
                } else {
                    Drained::Failed(io::Error::new(kind, msg))
                };
            }
            if self.start < self.pending.len() {
                let mut src = &self.pending[self.start..];
                let before = src.len();
                if let Err(e) = self.conn.read_tls(&mut src) {
                    return Drained::Failed(e);
                }
                self.start += before - src.len();
                if self.start == self.pending.len() {
                    self.pending.clear();
                    self.start = 0;
                }
                if let Err(e) = self.conn.process_new_packets() {
                    let e = io::Error::new(io::ErrorKind::InvalidData, explain(&e, peer_role));
                    if filled > 0 {
                        self.failed = Some((e.kind(), e.to_string()));
                        return Drained::Data(filled);
                    }
                    return Drained::Failed(e);
                }
                continue;
            }
            if self.eof && !self.eof_fed {
                // Tell rustls the socket ended: it then reports a clean close
                // (close_notify seen) or a truncation.
                self.eof_fed = true;
                let _ = self.conn.read_tls(&mut &[][..]);
                continue;
            }
            if filled > 0 {
                return Drained::Data(filled);
            }
            if self.eof_fed {
                return Drained::Failed(io::ErrorKind::UnexpectedEof.into());
            }
            return Drained::Empty;
        }
    }
}

/// A TLS failure in words: which side refused what.
pub(super) fn explain(e: &rustls::Error, peer_role: &str) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::NoCertificatesPresented => format!(
            "the {peer_role} presented no certificate; mutual TLS needs --tls-dir on both ends"
        ),
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            format!("the {peer_role}'s certificate is not signed by this side's CA (ca.pem)")
        }
        E::InvalidCertificate(c) => {
            format!("the {peer_role}'s certificate is not acceptable: {c:?}")
        }
        E::AlertReceived(
            a @ (A::UnknownCA
            | A::BadCertificate
            | A::CertificateRequired
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateExpired
            | A::AccessDenied
            | A::DecryptError),
        ) => format!(
            "the {peer_role} refused this side's certificate (TLS alert {a:?}): \
             are both ends' certificates signed by the same CA?"
        ),
        other => format!("TLS failed: {other}"),
    }
}

impl Read for TlsLink {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let drained = lock(&self.shared.session).drain_into(buf, self.shared.peer_role);
            match drained {
                Drained::Data(n) => return Ok(n),
                Drained::Closed => return Ok(0),
                Drained::Failed(e) => {
                    // Tell the peer why, if rustls has an alert for it.
                    self.send_pending();
                    return Err(e);
                }
                Drained::Empty => {}
            }
            let _recv = lock(&self.shared.recv);
            if self.raw.len() < RAW_CHUNK {
                self.raw.resize(RAW_CHUNK, 0);
            }
            let n = self.tcp.read(&mut self.raw)?;
            let mut s = lock(&self.shared.session);
            if n == 0 {
                s.eof = true;
            } else {
                s.pending.extend_from_slice(&self.raw[..n]);
            }
        }
    }
}

impl Write for TlsLink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _send = lock(&self.shared.send);
        self.sealed.clear();
        let n = {
            let mut s = lock(&self.shared.session);
            let n = s.conn.writer().write(buf)?;
            while s.conn.wants_write() {
                s.conn.write_tls(&mut self.sealed)?;
            }
            n
        };
        self.tcp.write_all(&self.sealed)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Every write puts its records on the socket before it returns.
        Ok(())
    }
}

impl Link for TlsLink {
    fn try_clone_link(&self) -> io::Result<Box<dyn Link>> {
        Ok(Box::new(TlsLink {
            tcp: self.tcp.try_clone()?,
            shared: Arc::clone(&self.shared),
            raw: Vec::new(),
            sealed: Vec::new(),
        }))
    }

    fn shutdown_link(&self, how: Shutdown) {
        if how == Shutdown::Write {
            // A graceful end: say close_notify so the peer can tell it from
            // a cut. Skipped if a writer is blocked mid-write (the link is
            // then being torn down, not closed).
            if let Ok(_send) = self.shared.send.try_lock() {
                let mut out = Vec::new();
                {
                    let mut s = lock(&self.shared.session);
                    s.conn.send_close_notify();
                    while s.conn.wants_write() {
                        if s.conn.write_tls(&mut out).is_err() {
                            break;
                        }
                    }
                }
                let _ = (&self.tcp).write_all(&out);
            }
        }
        // Already shut down or never connected: nothing left to stop.
        let _ = self.tcp.shutdown(how);
    }

    fn set_read_timeout_link(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp.set_read_timeout(t)
    }

    fn peer_on_this_host(&self) -> bool {
        crate::transport::tcp::peer_on_this_host(&self.tcp)
    }

    fn queued_bytes(&self) -> Option<u64> {
        crate::transport::tcp::send_queue(&self.tcp)
    }

    fn set_write_timeout_link(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp.set_write_timeout(t)
    }

    fn peer_name(&self) -> String {
        self.shared.peer.clone()
    }
}
