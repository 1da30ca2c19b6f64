//! The wire format: a versioned preamble followed by typed, length-prefixed,
//! checksummed frames, over any `Read + Write` byte stream.
//!
//! Why frames and not one big blob: precopy sends memory in rounds over
//! several connections, and postcopy must interleave pages the destination
//! asks for with the background copy. Typed frames make that a new frame
//! type, not a new format. Why any `Read + Write`: an authenticated or
//! encrypted transport (TLS, a vsock, a pipe through ssh) is then a wrapper
//! around the connection, not a change to the engine.
//!
//! ```text
//!  preamble (source → destination, first bytes of every connection, 16 bytes)
//!  ┌──────────────────────┬─────────────────┬─────────────────┐
//!  │ magic "FERRYMIG" (8) │ max_version u32 │ min_version u32 │   little-endian
//!  └──────────────────────┴─────────────────┴─────────────────┘
//!    v1 wrote 0 where min_version is; 0 means "max_version only". The
//!    destination picks the highest version both speak and says which in
//!    Welcome, or refuses with an Error frame naming both ranges.
//!
//!  frame (both directions; flags: 0, or a compression codec on Pages, see compress)
//!  ┌─────────┬──────────┬──────────────┬─────────────┬───────────┬───────────────────┐
//!  │ type u8 │ flags u8 │ reserved u16 │ length u32  │ crc32 u32 │ payload (length)  │
//!  └─────────┴──────────┴──────────────┴─────────────┴───────────┴───────────────────┘
//!    crc32 (crc32fast) covers the first 8 header bytes and the payload, except
//!    on an uncompressed Pages frame, whose check is built from its pages'
//!    xxh3 hashes (the digest's), so page data is hashed once (see frame);
//!    a frame longer than MAX_FRAME_LEN is refused before anything is allocated.
//!
//!  Pages payload (one batch, up to MAX_BATCH_PAGES pages, possibly many runs)
//!  ┌──────────┬───────────────┬──────────────────────────────────┬──────────────┬──────────────────┐
//!  │ round u32│ run_count u32 │ run_count × (gfn u64, pages u32) │ zero bitmap  │ 4096 B per page  │
//!  │          │               │                                  │ 1 bit a page │ that is NOT zero │
//!  └──────────┴───────────────┴──────────────────────────────────┴──────────────┴──────────────────┘
//!
//!  connections of one migration: every one opens with preamble + Hello(session, channel)
//!   main (channel 0)                            data (channels 1..=N)
//!   Header(json) ─────────────►                 Pages(round r) × any ──────►
//!               ◄───────────── Accept | Error   RoundEnd(r, pages here) ───►
//!   Heartbeat ◄──────────────► Heartbeat          … every round, on every data connection
//!   [pause] VcpuState, Sections,                  destination waits until every data
//!           Switchover(final round) ──────────►
//!               ◄───────────── Resumed            connection has ended the final round
//!   Digest ───────────────────►
//!               ◄───────────── Verified(match)
//!   Commit ───────────────────►                 (precopy; without it the
//!               ◄───────────── Report(json)      destination pauses its copy)
//! ```
//!
//! Within a round, batches on different connections arrive in any order; a
//! page appears at most once in a round. The destination applies a round-r
//! batch only once every connection has ended round r − 1, so a later round
//! always wins for a page. Either side may send `Error(text)` on the main
//! channel instead of the frame it owes, and then closes. A peer that does
//! not know a frame type reports it as an error rather than skipping it,
//! because silently skipping memory is how pages get lost.

mod bytes;
pub mod capabilities;
pub mod channel;
pub mod compress;
pub mod delta;
pub mod frame;
pub mod header;
pub mod messages;
pub mod pages;
pub mod sections;

pub use channel::{FrameStream, ReadFrame, Replay};
pub use frame::FrameKind;
pub use header::{CreateVm, ExpectedVm, HeaderError, Region, StreamHeader};
pub use messages::{FinalReport, MemoryDigest, Message};
pub use pages::{decode_batch, BatchView, PageBatch, MAX_BATCH_PAGES};
pub use sections::SectionError;

use thiserror::Error;

/// "2", or "1 to 3".
fn versions(min: u32, max: u32) -> String {
    if min >= max {
        max.to_string()
    } else {
        format!("{min} to {max}")
    }
}

/// First eight bytes of every ferry migration stream.
pub const MAGIC: [u8; 8] = *b"FERRYMIG";
/// Version of the wire format this ferry writes and reads: 2 added the
/// connection set (Hello, Welcome, Heartbeat, RoundEnd) and round-numbered
/// batches; 3 added Commit, without which a v2 destination would keep its
/// guest running when the source never heard its verdict; 4 names the VMM
/// in the header instead of a backend kind, and the Report no longer
/// carries the guest's counters; 5 checks an uncompressed Pages frame by
/// its pages' hashes instead of a CRC; 6 exchanges named capabilities (the
/// header asks, Accept answers: see [`capabilities`]), so that an optional
/// feature added later needs no new version. A peer outside
/// `MIN_VERSION..=VERSION` is refused with a message naming both ranges.
/// docs/compatibility.md says what may change within a version.
pub const VERSION: u32 = 6;
/// Oldest version this ferry speaks: the one before [`VERSION`], so that a
/// fleet upgrades one host at a time, old source to new destination and
/// back.
pub const MIN_VERSION: u32 = 5;
/// Bytes of the preamble.
pub const PREAMBLE_LEN: usize = 16;
/// Largest frame payload accepted: a full page batch plus its run table fits
/// with room to spare; a corrupt length field cannot make us allocate more.
pub const MAX_FRAME_LEN: u32 = 32 << 20;

/// Errors reading or writing the stream.
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum StreamError {
    /// The first bytes are not ferry's magic.
    #[error("not a ferry migration stream (first bytes {found:02x?})")]
    BadMagic {
        /// What was there instead.
        found: [u8; 8],
    },
    /// The peer opened with a TLS handshake, and this side does not use TLS.
    #[error("the peer speaks TLS, and this side was started without --tls-dir")]
    TlsPeer,
    /// No format version both ends speak.
    #[error("the peer speaks stream version {}, this ferry speaks {}", versions(*.peer_min, *.peer_max), versions(MIN_VERSION, VERSION))]
    Version {
        /// Oldest version the peer speaks.
        peer_min: u32,
        /// Newest version the peer speaks.
        peer_max: u32,
    },
    /// A frame whose payload or header does not match its checksum.
    #[error(
        "checksum mismatch in {kind} frame at stream offset {offset}: \
         stored {stored:#010x}, computed {computed:#010x}"
    )]
    Checksum {
        /// Frame type as read (may itself be the corrupt byte).
        kind: String,
        /// Stream offset of the frame header.
        offset: u64,
        /// Check in the header (CRC, or a Pages frame's page check).
        stored: u32,
        /// Check of what arrived.
        computed: u32,
    },
    /// The stream ended in the middle of something.
    #[error("stream truncated at offset {offset}: the peer closed it inside {what}")]
    Truncated {
        /// Bytes read before the end.
        offset: u64,
        /// What was being read.
        what: &'static str,
    },
    /// A frame type this ferry does not know.
    #[error("unknown frame type {kind} at stream offset {offset}")]
    UnknownFrame {
        /// The type byte.
        kind: u8,
        /// Stream offset of the frame header.
        offset: u64,
    },
    /// A length field over [`MAX_FRAME_LEN`].
    #[error(
        "frame at stream offset {offset} claims {len} bytes, more than the \
         {max}-byte limit (corrupt length field?)"
    )]
    TooLong {
        /// Claimed length.
        len: u64,
        /// The limit.
        max: u32,
        /// Stream offset of the frame header.
        offset: u64,
    },
    /// A frame that passed its checksum but whose content is wrong.
    #[error("malformed {kind} frame at stream offset {offset}: {reason}")]
    Malformed {
        /// Frame type.
        kind: FrameKind,
        /// Stream offset of the frame header.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The transport failed.
    #[error("migration stream I/O failed")]
    Io(#[source] std::io::Error),
}
