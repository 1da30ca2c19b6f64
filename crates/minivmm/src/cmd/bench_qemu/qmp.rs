//! A QMP client: QEMU's monitor protocol over a UNIX socket, one command
//! at a time (asynchronous events that come in between are kept, for
//! [`Qmp::last_event_unix_ms`]).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Errors talking to QEMU's monitor.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket could not be reached, read or written.
    #[error("QMP {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// QEMU closed the monitor.
    #[error("QMP {0}: QEMU closed the monitor")]
    Closed(String),
    /// QEMU answered with an error.
    #[error("QMP {command}: {message}")]
    Command { command: String, message: String },
    /// A line that is not JSON.
    #[error("QMP {path}: not JSON: {line:?}")]
    Garbled { path: String, line: String },
}

/// The longest QEMU may take to answer a command.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// A connected monitor.
pub struct Qmp {
    path: String,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// The events read so far.
    events: Vec<Value>,
}

impl Qmp {
    /// Connects to `path` (retrying until QEMU has made it, up to
    /// `patience`) and enters command mode.
    pub fn connect(path: &Path, patience: Duration) -> Result<Qmp, QmpError> {
        let name = path.display().to_string();
        let io = |source| QmpError::Io {
            path: name.clone(),
            source,
        };
        let deadline = Instant::now() + patience;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => return Err(io(e)),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        // A QEMU that stops answering fails the run rather than hanging it.
        stream.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
        let writer = stream.try_clone().map_err(io)?;
        let mut qmp = Qmp {
            path: name.clone(),
            reader: BufReader::new(stream),
            writer,
            events: Vec::new(),
        };
        qmp.read()?; // the greeting
        qmp.cmd("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    fn read(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|source| QmpError::Io {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Err(QmpError::Closed(self.path.clone()));
        }
        serde_json::from_str(&line).map_err(|_| QmpError::Garbled {
            path: self.path.clone(),
            line,
        })
    }

    /// Runs `command` with `args` and returns its `return` value.
    pub fn cmd(&mut self, command: &str, args: Value) -> Result<Value, QmpError> {
        let msg = json!({ "execute": command, "arguments": args });
        writeln!(self.writer, "{msg}").map_err(|source| QmpError::Io {
            path: self.path.clone(),
            source,
        })?;
        loop {
            let reply = self.read()?;
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                return Err(QmpError::Command {
                    command: command.into(),
                    message: e["desc"].as_str().unwrap_or("unknown error").into(),
                });
            }
            // An event: not the answer.
            if reply.get("event").is_some() {
                self.events.push(reply);
            }
        }
    }

    /// When QEMU last sent `event` (`STOP`: the VM paused), by its own
    /// stamp: the host's CLOCK_REALTIME, in ms since the epoch. Only
    /// events read while waiting for answers count.
    pub fn last_event_unix_ms(&self, event: &str) -> Option<f64> {
        let e = self.events.iter().rev().find(|e| e["event"] == event)?;
        let t = &e["timestamp"];
        Some(t["seconds"].as_f64()? * 1e3 + t["microseconds"].as_f64()? / 1e3)
    }
}
