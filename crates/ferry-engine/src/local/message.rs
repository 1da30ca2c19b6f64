//! The messages of a same-host migration, over one UNIX stream socket:
//! a JSON head, then binary blobs (vCPU state, sections), the memory's fds
//! riding on the first byte of the Offer, the VMM's own fds on the first
//! byte of the Handover.
//!
//! ```text
//!   frame = u32 head_len | head (JSON) | u32 blobs | (u64 len | bytes)*
//!
//!   source                                destination
//!   Offer {versions, header,       ──►    picks the version
//!          offsets} + memory fds
//!   (hashes its memory meanwhile)  ◄──    Agreed {version}       (3 on)
//!   Handover {handed} + its fds    ──►    (3 on; possibly none)
//!                                         maps the files, builds its VM,
//!                                         hashes its view of them
//!                                  ◄──    Accepted {version} | Refused {reason}
//!   Rehash + dirty (while busy)    ──►    rehashes the same pages
//!                                  ◄──    Rehashed
//!   pause, save, harvest
//!   State {digest} + blobs         ──►    restores, rehashes what was dirty
//!                                  ◄──    Ready | Failed {reason}
//!   Go (the source never resumes)  ──►    resumes the guest
//!                                  ◄──    Resumed
//! ```
//!
//! **Versions.** A same-host upgrade is exactly two releases meeting, and
//! so is its rollback, so each end speaks its version and those before it
//! down to [`MIN_VERSION`]. The Offer's `version` is the lowest the source
//! speaks and `max_version` its highest; the destination picks the highest
//! both speak and says which, in Agreed (version 3 on) or Accepted. A
//! version-1 destination reads only `version` (1), and answers a plain
//! Accepted; a version-1 source sends no `max_version`, and gets one.
//! - 1: the dirty set travels as a bitmap, its size fixed by memory
//!   (512 KiB for 16 GiB), however few pages are dirty.
//! - 2: as runs of pages, its size fixed by what is dirty
//!   ([`dirty_blob`]).
//! - 3: the VMM's own fds ([`ferry_vm::Vm::handover_fds`]) travel only
//!   once the version is agreed, in a Handover of their own. A version-2
//!   source sent them with the Offer, named in its `handed`, and a
//!   destination that predates them (version 1, as release `76c7980`)
//!   refuses an Offer with more fds than regions: a rollback to it failed
//!   for every VMM that hands fds over. A source now offers the memory's
//!   fds alone; a version-1 or -2 destination answers Accepted at once
//!   and is handed nothing (its VMM opens its files by path), a version-3
//!   one answers Agreed and gets the Handover. A destination still takes
//!   a version-2 source's `handed` fds from its Offer.

use super::fds;
use super::LocalError;
use crate::wire::StreamHeader;
use serde::{Deserialize, Serialize};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The protocol's newest version, which this ferry speaks.
pub const VERSION: u32 = 3;
/// The oldest version this ferry speaks. Kept at 1, not `VERSION - 1`: a
/// same-host rollback meets release `76c7980`, which speaks only 1, and
/// versions 2 and 3 change the encoding of one blob and the order of the
/// handshake, which cost nothing to keep.
pub const MIN_VERSION: u32 = 1;
/// The first version in which the VMM's own fds travel in a
/// [`Head::Handover`] after [`Head::Agreed`], not with the Offer.
pub const HANDOVER_VERSION: u32 = 3;
const MAX_HEAD: u32 = 16 << 20;
const MAX_BLOBS: u32 = 16;
const MAX_BLOB: u64 = 1 << 30;

/// What a message says.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Head {
    /// The VM to move, and where each region starts in its file (the fds
    /// come with this message, one per region, and from a version-2 source
    /// one per name in `handed` after them).
    Offer {
        /// The oldest version the source speaks ([`MIN_VERSION`]): a
        /// version-1 destination requires it to be 1.
        version: u32,
        /// The newest version the source speaks; absent from a version-1
        /// source, which speaks only `version`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_version: Option<u32>,
        /// The VM, as a stream header describes it (boxed: it dwarfs the
        /// other messages).
        header: Box<StreamHeader>,
        /// Per region: where it starts in its file.
        offsets: Vec<u64>,
        /// The names of the VMM's own fds that follow the regions' files
        /// ([`ferry_vm::Vm::handover_fds`]), from a version-2 source only:
        /// from version 3 on they travel in [`Head::Handover`], once the
        /// destination has said it speaks it. Absent when there are none,
        /// so that a version-1 destination reads the offer as before.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        handed: Vec<String>,
    },
    /// The destination takes an offer in `version` (3 or later), and waits
    /// for the Handover before it builds its VM. An older destination
    /// never sends it: it answers the Offer with Accepted or Refused.
    Agreed {
        /// The version both speak from here on.
        version: u32,
    },
    /// The VMM's own fds, by name, in the order they come with this
    /// message (possibly none): sent only after Agreed.
    Handover {
        /// Their names ([`ferry_vm::Vm::handover_fds`]).
        handed: Vec<String>,
    },
    /// The destination mapped the memory and built its VM.
    Accepted {
        /// The version both speak from here on; absent when the offer had
        /// no `max_version` (the version is then the offer's `version`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<u32>,
    },
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
            Head::Agreed { .. } => "agreed",
            Head::Handover { .. } => "handover",
            Head::Accepted { .. } => "accepted",
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

/// The version both ends speak, from an offer's `version` and
/// `max_version`: the highest in both ranges, or why there is none.
pub fn negotiate(version: u32, max_version: Option<u32>) -> Result<u32, String> {
    negotiate_in(version, max_version, MIN_VERSION..=VERSION)
}

/// [`negotiate`] for a destination that speaks `ours` (a release's range:
/// `negotiate` is this ferry's).
pub fn negotiate_in(
    version: u32,
    max_version: Option<u32>,
    ours: std::ops::RangeInclusive<u32>,
) -> Result<u32, String> {
    let (lo, hi) = (*ours.start(), *ours.end());
    let max = max_version.unwrap_or(version).max(version);
    let chosen = max.min(hi);
    if chosen < version.max(lo) {
        return Err(format!(
            "the source speaks versions {version} to {max} of the same-host protocol, \
             this ferry {lo} to {hi}"
        ));
    }
    Ok(chosen)
}

/// Whether, in `version`, the VMM's own fds travel in a Handover after
/// Agreed (3 on) rather than with the Offer.
pub fn hands_over_after_agreeing(version: u32) -> bool {
    version >= HANDOVER_VERSION
}

/// A dirty set as a blob in `version`'s encoding:
/// - 1: the bitmap's words, little-endian; 512 KiB for 16 GiB of memory
///   however few pages are dirty;
/// - 2: runs of pages, each `u64 first | u64 count` little-endian, so
///   that its size (and the pause's) follows what is dirty, not memory.
pub fn dirty_blob(dirty: &ferry_vm::DirtyPages, version: u32) -> Vec<u8> {
    if version < 2 {
        return dirty.words().iter().flat_map(|w| w.to_le_bytes()).collect();
    }
    let runs = dirty.runs();
    let mut blob = Vec::with_capacity(runs.len() * 16);
    for (first, count) in runs {
        blob.extend_from_slice(&first.0.to_le_bytes());
        blob.extend_from_slice(&count.to_le_bytes());
    }
    blob
}

/// The runs of dirty pages, in ascending order, in a blob that
/// [`dirty_blob`] wrote in `version`'s encoding for a guest of `pages`.
pub fn dirty_from(
    blob: &[u8],
    pages: u64,
    version: u32,
) -> Result<Vec<(ferry_vm::Gfn, u64)>, LocalError> {
    let u64_at = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
    if version < 2 {
        let words = pages.div_ceil(64) as usize;
        if blob.len() != words * 8 {
            return Err(LocalError::Protocol(format!(
                "a dirty bitmap of {} bytes for {pages} pages",
                blob.len()
            )));
        }
        let words: Vec<u64> = blob.chunks_exact(8).map(u64_at).collect();
        let mut dirty = ferry_vm::DirtyPages::new(pages);
        dirty.merge_words(ferry_vm::Gfn(0), &words);
        return Ok(dirty.runs());
    }
    if !blob.len().is_multiple_of(16) {
        return Err(LocalError::Protocol(format!(
            "dirty runs of {} bytes, not a multiple of 16",
            blob.len()
        )));
    }
    let mut runs = Vec::with_capacity(blob.len() / 16);
    let mut next = 0u64;
    for run in blob.chunks_exact(16) {
        let (first, count) = (u64_at(&run[..8]), u64_at(&run[8..]));
        let end = first.checked_add(count).filter(|&e| e <= pages);
        if count == 0 || first < next || end.is_none() {
            return Err(LocalError::Protocol(format!(
                "a dirty run of {count} pages at page {first}: runs must be non-empty, \
                 ascending and within the guest's {pages} pages"
            )));
        }
        next = first + count;
        runs.push((ferry_vm::Gfn(first), count));
    }
    Ok(runs)
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
pub struct Received {
    /// What it says.
    pub head: Head,
    /// Its blobs.
    pub blobs: Vec<Vec<u8>>,
    /// The fds that came with it.
    pub fds: Vec<OwnedFd>,
}

/// Reads one message, and the fds that came with it.
pub fn recv(stream: &UnixStream) -> Result<Received, LocalError> {
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
    use ferry_vm::{DirtyPages, Gfn};

    fn some_pages() -> DirtyPages {
        let mut d = DirtyPages::new(1000);
        for g in [0, 1, 2, 63, 64, 500, 999] {
            d.set(Gfn(g));
        }
        d
    }

    #[test]
    fn a_dirty_set_round_trips_in_both_versions_and_a_wrong_size_is_refused() {
        let d = some_pages();
        let bitmap = dirty_blob(&d, 1);
        assert_eq!(bitmap.len(), 16 * 8);
        let runs = dirty_blob(&d, 2);
        // 0-2, 63-64, 500, 999: sized by what is dirty.
        assert_eq!(runs.len(), 4 * 16);
        for (blob, version) in [(&bitmap, 1), (&runs, 2)] {
            assert_eq!(dirty_from(blob, 1000, version).unwrap(), d.runs());
            assert!(dirty_from(&blob[..8], 1000, version).is_err());
        }
    }

    #[test]
    fn dirty_runs_out_of_range_overlapping_or_empty_are_refused() {
        let run = |first: u64, count: u64| {
            let mut b = first.to_le_bytes().to_vec();
            b.extend_from_slice(&count.to_le_bytes());
            b
        };
        let refused = |blob: Vec<u8>| {
            let e = dirty_from(&blob, 1000, 2).unwrap_err().to_string();
            assert!(e.contains("within the guest's 1000 pages"), "{e}");
        };
        refused(run(999, 2));
        refused(run(5, 0));
        refused(run(u64::MAX, 2));
        refused([run(10, 5), run(12, 1)].concat());
        assert_eq!(dirty_from(&[], 1000, 2).unwrap(), vec![]);
    }

    #[test]
    fn versions_meet_at_the_highest_both_speak_or_are_refused_naming_both() {
        // A version-1 source sends no max_version.
        assert_eq!(negotiate(1, None), Ok(1));
        assert_eq!(negotiate(MIN_VERSION, Some(VERSION)), Ok(VERSION));
        // A newer source: its range reaches down to this one's.
        assert_eq!(negotiate(VERSION, Some(VERSION + 5)), Ok(VERSION));
        let e = negotiate(VERSION + 1, Some(VERSION + 2)).unwrap_err();
        assert!(
            e.contains(&format!("this ferry {MIN_VERSION} to {VERSION}")),
            "{e}"
        );
        assert!(negotiate(0, None).is_err());
    }

    /// A release's same-host protocol: what its source offers and the
    /// range its destination speaks.
    struct Release {
        /// Its newest version.
        version: u32,
        /// The Offer's `version` and `max_version`.
        offers: (u32, Option<u32>),
        /// The versions its destination speaks.
        speaks: (u32, u32),
    }

    const RELEASES: [Release; 3] = [
        Release {
            version: 1,
            offers: (1, None),
            speaks: (1, 1),
        },
        Release {
            version: 2,
            offers: (1, Some(2)),
            speaks: (1, 2),
        },
        Release {
            version: 3,
            offers: (MIN_VERSION, Some(VERSION)),
            speaks: (MIN_VERSION, VERSION),
        },
    ];

    /// The version a source offering `offers` and a destination speaking
    /// `speaks` meet at. A version-1 destination reads only the Offer's
    /// `version`, so its `max_version` is never looked at.
    fn meet(offers: (u32, Option<u32>), speaks: (u32, u32)) -> Result<u32, String> {
        let max = if speaks.1 == 1 { None } else { offers.1 };
        negotiate_in(offers.0, max, speaks.0..=speaks.1)
    }

    #[test]
    fn every_pair_of_releases_meets_and_only_3_with_3_hands_fds_over_after_agreeing() {
        assert_eq!(VERSION, 3, "add the new release to RELEASES");
        // Rows: the source's release; columns: the destination's.
        let want = [[1, 1, 1], [1, 2, 2], [1, 2, 3]];
        for (s, source) in RELEASES.iter().enumerate() {
            for (d, dest) in RELEASES.iter().enumerate() {
                let pair = format!("source {} to destination {}", source.version, dest.version);
                let v = meet(source.offers, dest.speaks).unwrap();
                assert_eq!(v, want[s][d], "{pair}");
                assert_eq!(
                    hands_over_after_agreeing(v),
                    (source.version, dest.version) == (3, 3),
                    "{pair}"
                );
            }
        }
        // This ferry's own negotiate is the version-3 release's.
        assert_eq!(negotiate(1, Some(2)), Ok(2));
        assert_eq!(negotiate(1, None), Ok(1));
        assert_eq!(negotiate(MIN_VERSION, Some(VERSION)), Ok(3));
    }

    #[test]
    fn a_later_source_that_drops_version_1_is_refused_by_releases_1_and_2_by_name() {
        let later = (3, Some(4));
        for release in &RELEASES[..2] {
            let (lo, hi) = release.speaks;
            let e = meet(later, release.speaks).unwrap_err();
            assert!(
                e.contains(&format!("this ferry {lo} to {hi}")),
                "release {}: {e}",
                release.version
            );
        }
        assert_eq!(meet(later, RELEASES[2].speaks), Ok(3));
    }

    #[test]
    fn agreed_and_handover_read_and_write_as_json() {
        let agreed = serde_json::to_string(&Head::Agreed { version: 3 }).unwrap();
        assert_eq!(agreed, r#"{"kind":"agreed","version":3}"#);
        let handover: Head =
            serde_json::from_str(r#"{"kind":"handover","handed":["disk0","tap0"]}"#).unwrap();
        assert!(matches!(&handover, Head::Handover { handed } if handed == &["disk0", "tap0"]));
        assert_eq!(handover.name(), "handover");
    }

    #[test]
    fn a_version_1_peer_reads_and_writes_the_messages_it_knows() {
        // What a version-1 destination answers, and a version-1 source
        // reads from a destination that saw no max_version.
        let plain: Head = serde_json::from_str(r#"{"kind":"accepted"}"#).unwrap();
        assert!(matches!(plain, Head::Accepted { version: None }));
        let to_old = serde_json::to_string(&Head::Accepted { version: None }).unwrap();
        assert_eq!(to_old, r#"{"kind":"accepted"}"#);
    }
}
