//! Child processes: waiting for one with a deadline, and the line a
//! destination (`ferry receive`) prints first, `listening on ADDR`, which
//! the process that started it reads to learn where to send the migration.

use std::io::BufRead;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How a destination's first line starts; the address follows it. The
/// destinations print it and their parents parse it, both from here.
pub const LISTENING_ON: &str = "listening on ";

/// How often [`wait_for`] looks.
const POLL: Duration = Duration::from_millis(20);

/// Why a destination's address could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Its output could not be read.
    #[error("reading its first line: {0}")]
    Read(#[from] std::io::Error),
    /// Its first line (trimmed) is not `listening on ADDR`.
    #[error("it said {0:?}")]
    Said(String),
}

/// Waits up to `limit` for `child` to exit; `None` if it had not (or it
/// could not be asked).
pub fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < until => std::thread::sleep(POLL),
            _ => return None,
        }
    }
}

/// The address a `listening on ADDR` line names.
pub fn listen_address(line: &str) -> Option<&str> {
    line.trim().strip_prefix(LISTENING_ON)
}

/// Reads the first line of a destination's output and returns the address
/// it listens on.
pub fn read_listen_address(out: &mut impl BufRead) -> Result<String, ListenError> {
    let mut line = String::new();
    out.read_line(&mut line)?;
    listen_address(&line)
        .map(str::to_string)
        .ok_or_else(|| ListenError::Said(line.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn the_first_line_names_the_address_or_says_what_it_said() {
        let mut out = "listening on 127.0.0.1:7070\n{\"x\":1}\n".as_bytes();
        assert_eq!(read_listen_address(&mut out).unwrap(), "127.0.0.1:7070");
        let mut out = "error: no such backend\n".as_bytes();
        let err = read_listen_address(&mut out).unwrap_err();
        assert_eq!(err.to_string(), "it said \"error: no such backend\"");
        assert!(
            matches!(read_listen_address(&mut "".as_bytes()), Err(ListenError::Said(s)) if s.is_empty())
        );
    }

    #[test]
    fn a_child_is_waited_for_until_it_exits_or_the_limit() {
        let mut quick = Command::new("true").spawn().unwrap();
        assert!(wait_for(&mut quick, Duration::from_secs(10)).is_some_and(|s| s.success()));
        let mut slow = Command::new("sleep").arg("10").spawn().unwrap();
        let started = Instant::now();
        assert!(wait_for(&mut slow, Duration::from_millis(100)).is_none());
        assert!(started.elapsed() < Duration::from_secs(5));
        let _ = slow.kill();
        let _ = slow.wait();
    }
}
