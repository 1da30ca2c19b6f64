//! Where a migration goes (`--to`) or comes from (`--listen`), as QEMU's
//! migration URIs name it:
//!
//! | form | meaning |
//! |---|---|
//! | `HOST:PORT` or `tcp:HOST:PORT` | TCP (TLS with `--tls-dir`) |
//! | `unix:PATH` | a UNIX socket at PATH |
//! | `fd:N,M,...` | connected sockets this process inherited as fds N, M, ... (an orchestrator opened them): the main channel first, then each data connection, then the priority connection of a migration that may switch to postcopy |

use ferry_engine::transport::{listen_unix, HeldConnections, UnixDialer};
use ferry_engine::{Dial, Listen, TcpDialer, TlsConfig};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// A parsed `--to` or `--listen`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `host:port`.
    Tcp(String),
    /// A UNIX socket's path.
    Unix(PathBuf),
    /// Inherited connected sockets.
    Fds(Vec<RawFd>),
}

impl std::str::FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a path (unix:/run/ferry.sock)".into());
            }
            return Ok(Endpoint::Unix(path.into()));
        }
        if let Some(list) = s.strip_prefix("fd:") {
            let fds = list
                .split(',')
                .map(|n| match n.trim().parse::<RawFd>() {
                    Ok(fd) if fd > 2 => Ok(fd),
                    _ => Err(format!(
                        "fd:{list}: '{n}' is not an inherited fd (a number above 2)"
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Endpoint::Fds(fds));
        }
        Ok(Endpoint::Tcp(
            s.strip_prefix("tcp:").unwrap_or(s).to_string(),
        ))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(addr) => f.write_str(addr),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            Endpoint::Fds(fds) => {
                let list: Vec<String> = fds.iter().map(ToString::to_string).collect();
                write!(f, "fd:{}", list.join(","))
            }
        }
    }
}

/// The fds, owned from here on; one that is not open, that the list names
/// twice, or that an earlier migration of this process took (and closed:
/// the number may name another file by now), is refused by number. A
/// refused list takes none of its fds: each stays open, and may be handed
/// over again.
fn take(fds: &[RawFd]) -> Result<Vec<OwnedFd>, String> {
    static TAKEN: std::sync::Mutex<Vec<RawFd>> = std::sync::Mutex::new(Vec::new());
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    for (i, &fd) in fds.iter().enumerate() {
        if taken.contains(&fd) {
            return Err(format!(
                "fd {fd} was handed to an earlier migration of this process, which closed it"
            ));
        }
        if fds[..i].contains(&fd) {
            return Err(format!("fd {fd} is named twice"));
        }
        // SAFETY: F_GETFD only reads the fd's flags; an fd that is not
        // open fails with EBADF.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(format!("fd {fd} is not open in this process"));
        }
    }
    taken.extend_from_slice(fds);
    Ok(fds
        .iter()
        .map(|&fd| {
            // SAFETY: the fd was inherited for this migration, is open and
            // named once (checked above) and is taken once (TAKEN): this
            // OwnedFd is its only owner.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .collect())
}

impl Endpoint {
    /// How a source reaches the destination here; TLS only over TCP.
    pub fn dialer(&self, tls: Option<&TlsConfig>) -> Result<Box<dyn Dial>, String> {
        match (self, tls) {
            (Endpoint::Tcp(addr), None) => Ok(Box::new(TcpDialer(addr.clone()))),
            (Endpoint::Tcp(addr), Some(tls)) => tls
                .dialer(addr)
                .map(|d| Box::new(d) as Box<dyn Dial>)
                .map_err(|e| ferry_vm::error_chain(&e)),
            (_, Some(_)) => Err(format!("--tls-dir runs over TCP, not {self}")),
            (Endpoint::Unix(path), None) => Ok(Box::new(UnixDialer(path.clone()))),
            (Endpoint::Fds(fds), None) => HeldConnections::from_fds(take(fds)?)
                .map(|h| Box::new(h) as Box<dyn Dial>)
                .map_err(|e| e.to_string()),
        }
    }

    /// Where a destination waits for a migration, and how to name it in
    /// the "listening on" line; TLS only over TCP.
    pub fn listener(&self, tls: Option<&TlsConfig>) -> Result<(Box<dyn Listen>, String), String> {
        if tls.is_some() && !matches!(self, Endpoint::Tcp(_)) {
            return Err(format!("--tls-dir runs over TCP, not {self}"));
        }
        match self {
            Endpoint::Tcp(addr) => {
                let tcp =
                    ferry_engine::listen(addr.as_str()).map_err(|e| ferry_vm::error_chain(&e))?;
                let local = tcp
                    .local_addr()
                    .map_err(|e| format!("cannot read the listening address: {e}"))?
                    .to_string();
                Ok(match tls {
                    Some(t) => (Box::new(t.listener(tcp)), local),
                    None => (Box::new(tcp), local),
                })
            }
            Endpoint::Unix(path) => {
                let l = listen_unix(path).map_err(|e| ferry_vm::error_chain(&e))?;
                Ok((Box::new(l), self.to_string()))
            }
            Endpoint::Fds(fds) => {
                let held = HeldConnections::from_fds(take(fds)?).map_err(|e| e.to_string())?;
                Ok((Box::new(held), self.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_parse_and_print_back() {
        for s in ["127.0.0.1:7070", "unix:/run/ferry.sock", "fd:3,4,5"] {
            let e: Endpoint = s.parse().unwrap();
            assert_eq!(e.to_string(), s);
        }
        assert_eq!(
            "tcp:host:1".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("host:1".into())
        );
        assert!("fd:1"
            .parse::<Endpoint>()
            .unwrap_err()
            .contains("'1' is not an inherited fd"));
        assert!("fd:3,x".parse::<Endpoint>().is_err());
        assert!("unix:".parse::<Endpoint>().is_err());
    }

    /// A list with one closed fd takes none: the open one stays open and
    /// can still be handed over whole.
    #[test]
    fn a_refused_list_takes_none_of_its_fds() {
        use std::os::fd::IntoRawFd;
        let open = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        // Past any fd limit: never open, whatever other tests open meanwhile.
        let closed = RawFd::MAX - 7;
        let err = take(&[open, closed]).unwrap_err();
        assert!(err.contains(&format!("fd {closed} is not open")), "{err}");
        let err = take(&[open, open]).unwrap_err();
        assert!(err.contains("named twice"), "{err}");
        // SAFETY: F_GETFD only reads the fd's flags.
        assert!(unsafe { libc::fcntl(open, libc::F_GETFD) } >= 0, "closed");
        let owned = take(&[open]).unwrap();
        assert_eq!(owned.len(), 1);
        drop(owned);
        assert!(take(&[open]).unwrap_err().contains("earlier migration"));
    }
}
