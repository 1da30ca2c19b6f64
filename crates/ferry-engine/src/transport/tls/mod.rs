//! Mutual TLS on every connection of a migration (rustls, TLS 1.3 only).
//!
//! A directory holds what one host needs: `ca.pem` (the CA both ends trust),
//! `cert.pem` (this host's certificate, for serving and for dialing) and
//! `key.pem`. The destination demands a client certificate from the same CA,
//! and finishes the handshake, so verifies the source, before it reads a
//! byte of the migration. The source checks the destination's certificate
//! against the host part of the address it dials.
//!
//! Mixed pairs fail with words rather than garbage: a TLS destination that
//! sees ferry's plaintext magic answers with an Error frame the plaintext
//! source can read, and a TLS source that gets a plaintext answer decodes
//! the Error frame in it.
//!
//! ```text
//!   link      TlsLink: one session shared by a reader and a writer thread
//!   pki       `ferry certs`: a throwaway CA and one certificate for tests and
//!             demos (feature `pki`, off by default)
//! ```

mod link;
#[cfg(feature = "pki")]
pub mod pki;

pub use link::TlsLink;

use super::set::{refuse, Dial, Listen};
use super::tcp::{accept_by, connect};
use super::Link;
use crate::error::MigrationError;
use crate::error::TransportError;
use crate::wire::{FrameStream, Message, MAGIC};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Longest a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The CA certificate both ends trust.
pub const CA_FILE: &str = "ca.pem";
/// This host's certificate chain.
pub const CERT_FILE: &str = "cert.pem";
/// This host's private key.
pub const KEY_FILE: &str = "key.pem";

/// Errors loading or writing TLS material.
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file exists where a new one would go.
    #[error("{} already exists; remove it or pick another directory", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// A PEM file without what it should hold.
    #[error("{} holds no {what}: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// "certificate" or "private key".
        what: &'static str,
        /// The parser's words.
        reason: String,
    },
    /// rustls refused the material (a key that does not match the
    /// certificate, an unusable CA).
    #[error("the TLS material in {} is unusable: {reason}", dir.display())]
    Config {
        /// The directory.
        dir: PathBuf,
        /// rustls's words.
        reason: String,
    },
    /// The address has no host part to check the certificate against.
    #[error("{addr}: no host name to check the destination's certificate against")]
    ServerName {
        /// The address.
        addr: String,
    },
    /// Generating certificates failed.
    #[error("cannot generate certificates: {0}")]
    Generate(String),
}

/// TLS settings loaded from a directory, for both roles.
#[derive(Clone)]
pub struct TlsConfig {
    dir: PathBuf,
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig").field("dir", &self.dir).finish()
    }
}

/// ring's suites, AES-128-GCM first. Both ends of a migration are ferry,
/// so the client's first choice is what runs; ring's own order puts
/// AES-256-GCM first, whose 14 rounds per block against 10 cost a
/// migration's throughput (every page is sealed and opened once) for a
/// margin no migration stream needs: AES-128-GCM is what TLS 1.3 requires
/// every implementation to offer.
fn provider() -> rustls::crypto::CryptoProvider {
    use rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != TLS13_AES_128_GCM_SHA256.suite());
    p
}

impl TlsConfig {
    /// Loads `ca.pem`, `cert.pem` and `key.pem` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path)
                .map(|b| (path.clone(), b))
                .map_err(|source| TlsError::Read { path, source })
        };
        let (ca_path, ca) = read(CA_FILE)?;
        let (cert_path, cert) = read(CERT_FILE)?;
        let (key_path, key) = read(KEY_FILE)?;
        let roots = Arc::new(root_store(&ca_path, &ca)?);
        let chain = certificates(&cert_path, &cert)?;
        let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| TlsError::Pem {
            path: key_path,
            what: "private key",
            reason: e.to_string(),
        })?;
        let config_err = |e: rustls::Error| TlsError::Config {
            dir: dir.to_path_buf(),
            reason: e.to_string(),
        };
        let provider = Arc::new(provider());
        let versions = &[&rustls::version::TLS13];
        let client = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(versions)
            .map_err(config_err)?
            .with_root_certificates(Arc::clone(&roots))
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(config_err)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()
            .map_err(|e| TlsError::Config {
                dir: dir.to_path_buf(),
                reason: e.to_string(),
            })?;
        let mut server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(config_err)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(config_err)?;
        // Tickets are sent after the handshake, as data the source's link
        // would have to skip; a migration never resumes a session anyway.
        server.send_tls13_tickets = 0;
        Ok(TlsConfig {
            dir: dir.to_path_buf(),
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    /// The directory the material came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Dials `addr` (host:port) over TLS; the destination's certificate
    /// must name its host.
    pub fn dialer(&self, addr: &str) -> Result<TlsDialer, TlsError> {
        let host = host_of(addr).ok_or_else(|| TlsError::ServerName {
            addr: addr.to_string(),
        })?;
        let name = ServerName::try_from(host.to_string()).map_err(|_| TlsError::ServerName {
            addr: addr.to_string(),
        })?;
        Ok(TlsDialer {
            addr: addr.to_string(),
            name,
            config: Arc::clone(&self.client),
        })
    }

    /// Serves TLS on `listener`.
    pub fn listener(&self, listener: TcpListener) -> TlsListener {
        TlsListener {
            tcp: listener,
            config: Arc::clone(&self.server),
        }
    }
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |reason: String| TlsError::Pem {
        path: path.to_path_buf(),
        what: "certificate",
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_err("no CERTIFICATE section".into()));
    }
    Ok(certs)
}

fn root_store(path: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certificates(path, pem)? {
        roots.add(c).map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            what: "usable CA certificate",
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// "host" of "host:port", "[::1]:port" or "::1" style addresses.
fn host_of(addr: &str) -> Option<&str> {
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        let s = addr.trim_start_matches('[');
        return Some(match sa {
            SocketAddr::V4(_) => s.rsplit_once(':').map_or(s, |(h, _)| h),
            SocketAddr::V6(_) => s.split_once(']').map_or(s, |(h, _)| h),
        });
    }
    let (host, _) = addr.rsplit_once(':')?;
    (!host.is_empty()).then_some(host)
}

/// Dials a destination over TLS for every connection of a migration.
pub struct TlsDialer {
    addr: String,
    name: ServerName<'static>,
    config: Arc<ClientConfig>,
}

impl Dial for TlsDialer {
    fn dial(&self) -> Result<Box<dyn Link>, TransportError> {
        let tcp = connect(self.addr.as_str())?;
        let conn =
            ClientConnection::new(Arc::clone(&self.config), self.name.clone()).map_err(|e| {
                TransportError::Tls {
                    peer: self.addr.clone(),
                    reason: e.to_string(),
                }
            })?;
        handshake(tcp, conn.into(), "destination").map(|l| Box::new(l) as Box<dyn Link>)
    }

    fn tls(&self) -> bool {
        true
    }
}

/// A TCP listener that admits only TLS peers with a certificate from the CA.
pub struct TlsListener {
    tcp: TcpListener,
    config: Arc<ServerConfig>,
}

impl TlsListener {
    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

impl Listen for TlsListener {
    fn accept_link(&self, deadline: Option<Instant>) -> Result<Box<dyn Link>, TransportError> {
        let tcp = accept_by(&self.tcp, deadline)?;
        let peer = tcp
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "the source".into());
        if speaks_plaintext_ferry(&tcp) {
            let reason = "the source connected without TLS, and this destination requires it: \
                          start the source with --tls-dir";
            let mut io = FrameStream::new(Box::new(tcp) as Box<dyn Link>);
            // Unread, the preamble and Hello are still in the socket.
            let _ = io.read_preamble();
            refuse(&mut io, &MigrationError::Refused(reason.into()));
            return Err(TransportError::Tls {
                peer,
                reason: reason.into(),
            });
        }
        let conn = rustls::ServerConnection::new(Arc::clone(&self.config)).map_err(|e| {
            TransportError::Tls {
                peer: peer.clone(),
                reason: e.to_string(),
            }
        })?;
        handshake(tcp, conn.into(), "source").map(|l| Box::new(l) as Box<dyn Link>)
    }

    fn tls(&self) -> bool {
        true
    }
}

/// Whether the first bytes on `tcp` are ferry's plaintext magic (waits up
/// to [`HANDSHAKE_TIMEOUT`] for them).
fn speaks_plaintext_ferry(tcp: &TcpStream) -> bool {
    let mut first = [0u8; 8];
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    if tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).is_err() {
        return false;
    }
    loop {
        match tcp.peek(&mut first) {
            Ok(n) if n == first.len() => return first == MAGIC,
            Ok(0) => return false,
            Ok(n) if first[..n] != MAGIC[..n] => return false,
            Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(_) => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Runs the handshake on a blocking socket, within [`HANDSHAKE_TIMEOUT`].
fn handshake(
    mut tcp: TcpStream,
    mut conn: Connection,
    peer_role: &'static str,
) -> Result<TlsLink, TransportError> {
    let peer = tcp
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| format!("the {peer_role}"));
    let fail = |reason: String| TransportError::Tls {
        peer: peer.clone(),
        reason,
    };
    let io_fail = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => fail(format!(
            "no TLS handshake from the {peer_role} within {} s",
            HANDSHAKE_TIMEOUT.as_secs()
        )),
        _ => fail(format!("the handshake failed: {e}")),
    };
    tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|_| tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT)))
        .map_err(io_fail)?;
    // The first bytes the peer sends, to explain a peer that is not TLS.
    let mut first = Recorder {
        tcp: &mut tcp,
        seen: Vec::new(),
    };
    while conn.is_handshaking() {
        while conn.wants_write() {
            conn.write_tls(&mut *first.tcp).map_err(io_fail)?;
        }
        if !conn.is_handshaking() {
            break;
        }
        let n = conn.read_tls(&mut first).map_err(io_fail)?;
        if n == 0 {
            return Err(fail(format!(
                "the {peer_role} closed the connection during the TLS handshake"
            )));
        }
        if let Err(e) = conn.process_new_packets() {
            // Send rustls's alert so the peer learns why, then let the peer
            // close first so the alert is not lost to a reset.
            let _ = conn.write_tls(&mut *first.tcp);
            let reason = match plaintext_answer(&first.seen) {
                Some(said) => format!(
                    "the {peer_role} answered without TLS (is it running without --tls-dir?){said}"
                ),
                None => link::explain(&e, peer_role),
            };
            linger(first.tcp);
            return Err(fail(reason));
        }
    }
    while conn.wants_write() {
        conn.write_tls(&mut tcp).map_err(io_fail)?;
    }
    tcp.set_read_timeout(None)
        .and_then(|_| tcp.set_write_timeout(None))
        .map_err(io_fail)?;
    Ok(TlsLink::new(tcp, conn, peer_role))
}

/// If `seen` is not a TLS record but a ferry Error frame, ": <its reason>";
/// if it is some other non-TLS answer, "".
fn plaintext_answer(seen: &[u8]) -> Option<String> {
    // A TLS record starts with a content type 20-24 and major version 3.
    if seen.len() < 2 || ((20..=24).contains(&seen[0]) && seen[1] == 3) {
        return None;
    }
    let mut io = FrameStream::new(io::Cursor::new(seen.to_vec()));
    let said = io
        .read_frame()
        .ok()
        .and_then(|(kind, off)| Message::decode(kind, io.payload(), off).ok());
    Some(match said {
        Some(Message::Error(reason)) => format!(": it said \"{reason}\""),
        _ => String::new(),
    })
}

/// Half-closes `tcp` and reads until the peer closes (at most a second), so
/// an alert or Error frame just sent is read rather than reset away.
fn linger(tcp: &TcpStream) {
    let _ = tcp.shutdown(std::net::Shutdown::Write);
    let _ = tcp.set_read_timeout(Some(Duration::from_millis(100)));
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut sink = [0u8; 4096];
    while Instant::now() < deadline {
        match (&*tcp).read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
}

/// Reads from the socket, keeping the first 4 KiB seen.
struct Recorder<'a> {
    tcp: &'a mut TcpStream,
    seen: Vec<u8>,
}

impl Read for Recorder<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.tcp.read(buf)?;
        let keep = n.min(4096usize.saturating_sub(self.seen.len()));
        self.seen.extend_from_slice(&buf[..keep]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_128_gcm_is_offered_first_and_no_suite_is_dropped() {
        use rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
        let ours = provider().cipher_suites;
        let ring = rustls::crypto::ring::default_provider().cipher_suites;
        assert_eq!(ours[0].suite(), TLS13_AES_128_GCM_SHA256.suite());
        assert_eq!(ours.len(), ring.len());
        assert!(ring
            .iter()
            .all(|s| ours.iter().any(|o| o.suite() == s.suite())));
    }

    #[test]
    fn host_of_addresses() {
        assert_eq!(host_of("127.0.0.1:7070"), Some("127.0.0.1"));
        assert_eq!(host_of("[::1]:7070"), Some("::1"));
        assert_eq!(host_of("dest.example:7070"), Some("dest.example"));
        assert_eq!(host_of(":7070"), None);
        assert_eq!(host_of("nohost"), None);
    }

    #[test]
    fn a_tls_record_is_not_a_plaintext_answer() {
        assert_eq!(plaintext_answer(&[22, 3, 3, 0, 10]), None);
        assert_eq!(plaintext_answer(&[21, 3, 3, 0, 2]), None);
        assert_eq!(plaintext_answer(b"HTTP/1.1 400"), Some(String::new()));
    }
}
