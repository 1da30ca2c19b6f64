//! The protocol of ferry's control socket (`ferry run --control`,
//! `--qmp`): one JSON object per line, in one of two
//! dialects told apart per line. ferry's own (`{"cmd": ...}`, [`Request`])
//! and QMP's (`{"execute": ...}`, [`QmpCommand`]), so that tools written
//! for QEMU's monitor can drive ferry too.
//!
//! This crate only parses: what a request means for a VM is the
//! server's business. Parsing never panics, whatever the bytes (a fuzz
//! target holds it to that).

#![warn(missing_docs)]

mod lines;
mod qmp;

pub use lines::{MigrateRequest, Request, SnapshotRequest};
pub use qmp::{Capability, ParamUpdate, QmpCommand, QmpError, COMMANDS};

use serde_json::Value;

/// A parsed request line.
#[derive(Debug)]
pub enum Parsed {
    /// ferry's dialect.
    Lines(Request),
    /// QMP's dialect: the `id` to echo, and the command or why it is
    /// refused.
    Qmp {
        /// The request's `id`, echoed in the reply.
        id: Option<Value>,
        /// The command, or why it is refused.
        command: Result<QmpCommand, QmpError>,
    },
}

/// Parses one line. An error is for the ferry dialect (a line that is not
/// JSON, or a `cmd` request that does not parse); a QMP request's error
/// is inside [`Parsed::Qmp`], so that it can carry its `id`.
pub fn parse(line: &str) -> Result<Parsed, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))?;
    match value {
        Value::Object(map) if map.contains_key("execute") => Ok(Parsed::Qmp {
            id: map.get("id").cloned(),
            command: qmp::parse(&map),
        }),
        other => serde_json::from_value(other)
            .map(Parsed::Lines)
            .map_err(|e| format!("bad request: {e}")),
    }
}
