//! The messages of a same-host migration, over one UNIX stream socket:
//! a JSON head, then binary blobs (vCPU state, sections), the memory's fds
//! riding on the first byte of the Offer.
//!
//! ```text
//!   frame = u32 head_len | head (JSON) | u32 blobs | (u64 len | bytes)*
//!
//!   source                                destination
//!   Offer {header, offsets} + fds  ──►    maps the files, builds its VM,
//!   (hashes its memory meanwhile)         hashes its view of them
//!                                  ◄──    Accepted | Refused {reason}
//!   Rehash + dirty (while busy)    ──►    rehashes the same pages
//!                                  ◄──    Rehashed
//!   pause, save, harvest
//!   State {digest} + blobs         ──►    restores, rehashes what was dirty
//!                                  ◄──    Ready | Failed {reason}
//!   Go (the source never resumes)  ──►    resumes the guest
//!                                  ◄──    Resumed
//! ```

use super::fds;
use super::LocalError;
use crate::wire::StreamHeader;
use serde::{Deserialize, Serialize};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The protocol's version; both ends must speak the same.
pub const VERSION: u32 = 1;
const MAX_HEAD: u32 = 16 << 20;
const MAX_BLOBS: u32 = 16;
const MAX_BLOB: u64 = 1 << 30;

/// What a message says.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Head {
    /// The VM to move, and where each region starts in its file (the fds
    /// come with this message, one per region).
    Offer {
        /// [`VERSION`].
        version: u32,
        /// The VM, as a stream header describes it (boxed: it dwarfs the
        /// other messages).
        header: Box<StreamHeader>,
        /// Per region: where it starts in its file.
        offsets: Vec<u64>,
        /// The names of the VMM's own fds that follow the regions' files
        /// ([`ferry_backend::Vm::handover_fds`]). Absent when there are
        /// none, so that an older destination reads the offer as before.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        handed: Vec<String>,
    },
    /// The destination mapped the memory and built its VM.
    Accepted,
    /// It cannot take the VM.
    Refused {
        /// Why.
        reason: String,
    },
    /// Pages the running guest dirtied since the last hash (blob: the
    /// dirty bitmap, see [`dirty_blob`]): both ends rehash them, so the
    /// pause has fewer left to hash.
    Rehash,
    /// The destination rehashed them.
    Rehashed,
    /// The paused VM's state (blobs: vCPU state, sections, and the bitmap
    /// of the pages dirtied since the last rehash) and the source's digest
    /// at the pause.
    State {
        /// The source's digest of memory at the pause.
        digest: u64,
    },
    /// The destination loaded the state and its digest matches.
    Ready,
    /// It could not.
    Failed {
        /// Why.
        reason: String,
    },
    /// Resume: the source will not run the guest again.
    Go,
    /// The guest runs at the destination.
    Resumed,
}

impl Head {
    /// Its name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Head::Offer { .. } => "offer",
            Head::Accepted => "accepted",
            Head::Refused { .. } => "refused",
            Head::Rehash => "rehash",
            Head::Rehashed => "rehashed",
            Head::State { .. } => "state",
            Head::Ready => "ready",
            Head::Failed { .. } => "failed",
            Head::Go => "go",
            Head::Resumed => "resumed",
        }
    }
}

/// A dirty set as a blob: its bitmap words, little-endian. Its size is
/// fixed by guest memory (512 KiB for 16 GiB), however scattered the pages.
pub fn dirty_blob(dirty: &ferry_backend::DirtyPages) -> Vec<u8> {
    dirty.words().iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The dirty set of a guest with `pages` frames that [`dirty_blob`] wrote.
pub fn dirty_from(blob: &[u8], pages: u64) -> Result<ferry_backend::DirtyPages, LocalError> {
    let mut dirty = ferry_backend::DirtyPages::new(pages);
    let words = pages.div_ceil(64) as usize;
    if blob.len() != words * 8 {
        return Err(LocalError::Protocol(format!(
            "a dirty bitmap of {} bytes for {pages} pages",
            blob.len()
        )));
    }
    let words: Vec<u64> = blob
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    dirty.merge_words(ferry_backend::Gfn(0), &words);
    Ok(dirty)
}

/// Bounds every read and write on `stream` by `timeout`, so that a peer
/// that stops answering is an error, not a hang.
pub fn set_timeouts(stream: &UnixStream, timeout: std::time::Duration) -> Result<(), LocalError> {
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|source| LocalError::Socket {
            what: "set a timeout on",
            message: "the socket",
            source,
        })
}

/// Sends `head` with `blobs`, and `fds` on its first byte.
pub fn send(
    stream: &UnixStream,
    head: &Head,
    blobs: &[&[u8]],
    fd_list: &[RawFd],
) -> Result<(), LocalError> {
    let json = serde_json::to_vec(head).expect("messages serialize");
    let mut frame = Vec::with_capacity(json.len() + 8);
    frame.extend_from_slice(&(json.len() as u32).to_le_bytes());
    frame.extend_from_slice(&json);
    frame.extend_from_slice(&(blobs.len() as u32).to_le_bytes());
    for b in blobs {
        frame.extend_from_slice(&(b.len() as u64).to_le_bytes());
        frame.extend_from_slice(b);
    }
    fds::send(stream, &frame, fd_list).map_err(|e| LocalError::Socket {
        what: "send",
        message: head.name(),
        source: e,
    })
}

/// What one message brought.
pub(crate) struct Received {
    /// What it says.
    pub head: Head,
    /// Its blobs.
    pub blobs: Vec<Vec<u8>>,
    /// The fds that came with it.
    pub fds: Vec<OwnedFd>,
}

/// Reads one message.
pub(crate) fn recv(stream: &UnixStream) -> Result<Received, LocalError> {
    let io = |e| LocalError::Socket {
        what: "receive",
        message: "a message",
        source: e,
    };
    let mut len = [0u8; 4];
    let fds = fds::recv(stream, &mut len).map_err(io)?;
    let head_len = u32::from_le_bytes(len);
    if head_len > MAX_HEAD {
        return Err(LocalError::Protocol(format!(
            "a message head of {head_len} bytes"
        )));
    }
    let mut json = vec![0u8; head_len as usize];
    read(stream, &mut json).map_err(io)?;
    let head: Head = serde_json::from_slice(&json)
        .map_err(|e| LocalError::Protocol(format!("a message that does not parse: {e}")))?;
    read(stream, &mut len).map_err(io)?;
    let count = u32::from_le_bytes(len);
    if count > MAX_BLOBS {
        return Err(LocalError::Protocol(format!(
            "{count} blobs in one message"
        )));
    }
    let mut blobs = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let mut n = [0u8; 8];
        read(stream, &mut n).map_err(io)?;
        let n = u64::from_le_bytes(n);
        if n > MAX_BLOB {
            return Err(LocalError::Protocol(format!("a blob of {n} bytes")));
        }
        let mut blob = vec![0u8; n as usize];
        read(stream, &mut blob).map_err(io)?;
        blobs.push(blob);
    }
    Ok(Received { head, blobs, fds })
}

fn read(stream: &UnixStream, buf: &mut [u8]) -> std::io::Result<()> {
    std::io::Read::read_exact(&mut &*stream, buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_backend::{DirtyPages, Gfn};

    #[test]
    fn a_dirty_bitmap_round_trips_and_a_wrong_size_is_refused() {
        let mut d = DirtyPages::new(1000);
        for g in [0, 63, 64, 500, 999] {
            d.set(Gfn(g));
        }
        let blob = dirty_blob(&d);
        assert_eq!(blob.len(), 16 * 8);
        let back = dirty_from(&blob, 1000).unwrap();
        assert_eq!(
            back.iter().collect::<Vec<_>>(),
            d.iter().collect::<Vec<_>>()
        );
        assert!(dirty_from(&blob[..8], 1000).is_err());
    }
}
