//! The frame codec: a 12-byte header (type, flags, length, check) in front
//! of every payload. Kept apart from buffering ([`super::channel`]) so the
//! codec can be tested on plain byte slices.
//!
//! **The check.** Most frames carry a CRC-32 of their first 8 header bytes
//! and payload. An uncompressed Pages frame carries the *page check*
//! instead, so that its page data is hashed once, not twice: the
//! destination needs each page's xxh3 for the memory digest anyway
//! ([`crate::digest`]), so the check is built from those hashes. The
//! payload is cut into 4 KiB chunks counted from its end (a Pages payload
//! ends with its page data, so each chunk there is one page), with any
//! shorter lead chunk first; the check is the low 32 bits of
//! `xxh3_64(header[0..8] ‖ h[0] ‖ h[1] ‖ …)` over the chunks' xxh3 hashes
//! (little-endian u64s). A flipped bit anywhere changes a chunk's hash and
//! so the check, as with the CRC; the receiver keeps the hashes
//! (`verify` fills them in) and the digest reuses them.

use super::compress::{FLAG_LZ4, FLAG_ZSTD};
use super::{StreamError, MAX_FRAME_LEN};
use crate::digest::{hash_u64s, page_hash};
use ferry_vm::PAGE_SIZE;
use std::fmt;
use xxhash_rust::xxh3::Xxh3;

/// Bytes of a frame header.
pub const FRAME_HEADER_LEN: usize = 12;

/// What a frame carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Source → destination: the [`super::StreamHeader`] as JSON.
    Header = 1,
    /// Destination → source: header accepted, VM created; flags.
    Accept = 2,
    /// Source → destination: a batch of pages.
    Pages = 3,
    /// Source → destination: the opaque vCPU state from `Vm::save_vcpus`.
    VcpuState = 4,
    /// Source → destination: the source is paused, everything is sent.
    Switchover = 5,
    /// Destination → source: the guest runs on the destination.
    Resumed = 6,
    /// Source → destination: digest of the source's actual memory.
    Digest = 7,
    /// Destination → source: whether the digests match.
    Verified = 8,
    /// Destination → source: what the guest reported after switchover.
    Report = 9,
    /// Either way: the sender gives up, with a message.
    Error = 10,
    /// Source → destination, first frame of every connection: which
    /// migration (session) and which channel of it this connection is.
    Hello = 11,
    /// Destination → source: the connection is taken; the version spoken.
    Welcome = 12,
    /// Either way on the main channel: still alive, and how many
    /// page-data bytes this side has moved so far.
    Heartbeat = 13,
    /// Source → destination on each data connection: a round is complete
    /// on this connection, with the pages it carried there.
    RoundEnd = 14,
    /// Source → destination on a data connection: pages sent again as what
    /// changed since the copy the destination holds (see [`super::delta`]).
    Delta = 15,
    /// Source → destination on the main channel, at a postcopy
    /// switchover: runs of pages the destination does not hold as they are
    /// now; it drops any copy it has, and fetches them on demand.
    Missing = 16,
    /// Destination → source on the priority connection: a vCPU waits for
    /// these pages. The answer is a Pages frame on the same connection.
    PageRequest = 17,
    /// Destination → source on the main channel of a postcopy
    /// recovery, after Missing frames listing every page it still lacks:
    /// the list is complete, with this many pages.
    Recover = 18,
    /// Source → destination on the main channel of a precopy, after
    /// Verified(match): the source stays paused, the guest is the
    /// destination's. Without it the destination pauses its copy, so a
    /// lost verdict never leaves two copies running.
    Commit = 19,
    /// Source → destination at the switchover, after VcpuState: the
    /// devices' state sections (see [`crate::wire::sections`]).
    Sections = 20,
    /// Source → destination at the switchover, before Sections: a part of
    /// the sections' payload, which Sections ends (capability
    /// `section-parts`).
    SectionsPart = 21,
    /// Source → destination on the main channel during the precopy
    /// rounds: a chunk of a live section's state (capability
    /// `live-sections`, see [`crate::wire::sections::encode_live`]).
    LiveSection = 22,
}

impl FrameKind {
    /// The type for a header byte, if known.
    pub fn from_u8(byte: u8) -> Option<Self> {
        use FrameKind::*;
        Some(match byte {
            1 => Header,
            2 => Accept,
            3 => Pages,
            4 => VcpuState,
            5 => Switchover,
            6 => Resumed,
            7 => Digest,
            8 => Verified,
            9 => Report,
            10 => Error,
            11 => Hello,
            12 => Welcome,
            13 => Heartbeat,
            14 => RoundEnd,
            15 => Delta,
            16 => Missing,
            17 => PageRequest,
            18 => Recover,
            19 => Commit,
            20 => Sections,
            21 => SectionsPart,
            22 => LiveSection,
            _ => return None,
        })
    }

    /// Name for messages.
    pub fn name(self) -> &'static str {
        use FrameKind::*;
        match self {
            Header => "Header",
            Accept => "Accept",
            Pages => "Pages",
            VcpuState => "VcpuState",
            Switchover => "Switchover",
            Resumed => "Resumed",
            Digest => "Digest",
            Verified => "Verified",
            Report => "Report",
            Error => "Error",
            Hello => "Hello",
            Welcome => "Welcome",
            Heartbeat => "Heartbeat",
            RoundEnd => "RoundEnd",
            Delta => "Delta",
            Missing => "Missing",
            PageRequest => "PageRequest",
            Recover => "Recover",
            Commit => "Commit",
            Sections => "Sections",
            SectionsPart => "SectionsPart",
            LiveSection => "LiveSection",
        }
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A decoded frame header, before the payload is read.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct FrameHead {
    /// The type byte as sent (checked against [`FrameKind`] after the CRC).
    pub kind_byte: u8,
    /// Payload length.
    pub len: u32,
    /// CRC stored in the header.
    pub crc: u32,
    /// Stream offset of the header's first byte.
    pub offset: u64,
}

impl FrameHead {
    /// The known type, or [`StreamError::UnknownFrame`].
    pub fn kind(&self) -> Result<FrameKind, StreamError> {
        FrameKind::from_u8(self.kind_byte).ok_or(StreamError::UnknownFrame {
            kind: self.kind_byte,
            offset: self.offset,
        })
    }

    fn kind_name(&self) -> String {
        match FrameKind::from_u8(self.kind_byte) {
            Some(k) => k.name().to_string(),
            None => format!("type-{}", self.kind_byte),
        }
    }
}

/// Starts the CRC of a frame: its first 8 header bytes.
fn crc_start(head8: &[u8; 8]) -> crc32fast::Hasher {
    let mut h = crc32fast::Hasher::new();
    h.update(head8);
    h
}

/// Whether a frame of this type and flags carries the page check (see the
/// module's doc) instead of a CRC.
fn uses_page_check(kind_byte: u8, flags: u8) -> bool {
    kind_byte == FrameKind::Pages as u8 && flags == 0
}

/// Appends the xxh3 of each chunk of `bytes`: a lead of `len % 4096` bytes
/// (if any), then 4 KiB chunks to the end.
fn chunk_hashes(bytes: &[u8], out: &mut Vec<u64>) {
    let lead = bytes.len() % PAGE_SIZE;
    if lead > 0 {
        out.push(page_hash(&bytes[..lead]));
    }
    out.extend(bytes[lead..].chunks_exact(PAGE_SIZE).map(page_hash));
}

/// Chunk hashes of `parts` concatenated. A last part of whole pages (the
/// page data after a Pages frame's head) is hashed in place; only the parts
/// before it are joined, and only when there are several.
fn parts_chunk_hashes(parts: &[&[u8]], out: &mut Vec<u64>) {
    match parts.split_last() {
        Some((last, front)) if last.len() % PAGE_SIZE == 0 => {
            match front {
                [] => {}
                [one] => chunk_hashes(one, out),
                more => chunk_hashes(&more.concat(), out),
            }
            chunk_hashes(last, out);
        }
        _ => chunk_hashes(&parts.concat(), out),
    }
}

/// The page check of a frame whose header starts `head8` and whose
/// payload's chunks hash to `hashes`.
fn page_check(head8: &[u8; 8], hashes: &[u64]) -> u32 {
    let mut h = Xxh3::new();
    h.update(head8);
    hash_u64s(&mut h, hashes);
    h.digest() as u32
}

fn head8(kind: u8, flags: u8, len: u32) -> [u8; 8] {
    let l = len.to_le_bytes();
    [kind, flags, 0, 0, l[0], l[1], l[2], l[3]]
}

/// Encodes the header of a frame whose payload is `parts` concatenated.
pub fn encode_header(
    kind: FrameKind,
    parts: &[&[u8]],
) -> Result<[u8; FRAME_HEADER_LEN], StreamError> {
    encode_header_with_flags(kind, 0, parts)
}

/// Like [`encode_header`], with frame flags (compression, on Pages only).
pub fn encode_header_with_flags(
    kind: FrameKind,
    flags: u8,
    parts: &[&[u8]],
) -> Result<[u8; FRAME_HEADER_LEN], StreamError> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(total)
        .ok()
        .filter(|&l| l <= MAX_FRAME_LEN)
        .ok_or(StreamError::TooLong {
            len: total as u64,
            max: MAX_FRAME_LEN,
            offset: 0,
        })?;
    let h8 = head8(kind as u8, flags, len);
    let check = if uses_page_check(kind as u8, flags) {
        let mut hashes = Vec::new();
        parts_chunk_hashes(parts, &mut hashes);
        page_check(&h8, &hashes)
    } else {
        let mut crc = crc_start(&h8);
        for p in parts {
            crc.update(p);
        }
        crc.finalize()
    };
    let mut out = [0u8; FRAME_HEADER_LEN];
    out[..8].copy_from_slice(&h8);
    out[8..].copy_from_slice(&check.to_le_bytes());
    Ok(out)
}

/// Decodes a frame header read at stream `offset`. Checks the length limit
/// and the reserved bytes, but not the CRC (that needs the payload).
pub(crate) fn decode_header(
    bytes: &[u8; FRAME_HEADER_LEN],
    offset: u64,
) -> Result<FrameHead, StreamError> {
    let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if len > MAX_FRAME_LEN {
        return Err(StreamError::TooLong {
            len: u64::from(len),
            max: MAX_FRAME_LEN,
            offset,
        });
    }
    Ok(FrameHead {
        kind_byte: bytes[0],
        len,
        crc: u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
        offset,
    })
}

/// Checks `payload` against the header's check, then its type and flags.
/// For a frame with the page check, `hashes` ends up holding its chunks'
/// hashes (the last ones are its pages'); otherwise it is left empty.
pub(crate) fn verify(
    head: &FrameHead,
    raw_head: &[u8; FRAME_HEADER_LEN],
    payload: &[u8],
    hashes: &mut Vec<u64>,
) -> Result<FrameKind, StreamError> {
    let mut h8 = [0u8; 8];
    h8.copy_from_slice(&raw_head[..8]);
    hashes.clear();
    let computed = if uses_page_check(raw_head[0], raw_head[1]) {
        chunk_hashes(payload, hashes);
        page_check(&h8, hashes)
    } else {
        let mut crc = crc_start(&h8);
        crc.update(payload);
        crc.finalize()
    };
    if computed != head.crc {
        return Err(StreamError::Checksum {
            kind: head.kind_name(),
            offset: head.offset,
            stored: head.crc,
            computed,
        });
    }
    let kind = head.kind()?;
    let flags_ok = match raw_head[1] {
        0 => true,
        FLAG_LZ4 | FLAG_ZSTD => matches!(kind, FrameKind::Pages | FrameKind::Delta),
        _ => false,
    };
    if !flags_ok || raw_head[2..4] != [0, 0] {
        return Err(StreamError::Malformed {
            kind,
            offset: head.offset,
            reason: format!("unsupported flags {:02x?}", &raw_head[1..4]),
        });
    }
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(kind: FrameKind, payload: &[u8]) -> Result<FrameKind, StreamError> {
        let raw = encode_header(kind, &[payload])?;
        let head = decode_header(&raw, 0)?;
        assert_eq!(head.len as usize, payload.len());
        verify(&head, &raw, payload, &mut Vec::new())
    }

    #[test]
    fn every_kind_round_trips() {
        for b in 0..=255u8 {
            if let Some(k) = FrameKind::from_u8(b) {
                assert_eq!(k as u8, b);
                assert_eq!(round_trip(k, b"payload").unwrap(), k);
            }
        }
    }

    #[test]
    fn split_parts_check_equals_whole() {
        for kind in [FrameKind::Pages, FrameKind::Delta] {
            let a = encode_header(kind, &[b"abc", b"def"]).unwrap();
            let b = encode_header(kind, &[b"abcdef"]).unwrap();
            assert_eq!(a, b);
        }
        // A head of any length, then whole pages: hashed in place.
        let head: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let pages = vec![7u8; 3 * PAGE_SIZE];
        let whole = [head.as_slice(), &pages].concat();
        let split = encode_header(FrameKind::Pages, &[&head[..100], &head[100..], &pages]);
        assert_eq!(
            split.unwrap(),
            encode_header(FrameKind::Pages, &[&whole]).unwrap()
        );
    }

    /// An uncompressed Pages frame's check is built from its pages' own
    /// hashes, which the receiver keeps for the digest; a flipped bit in
    /// any page is refused at the frame, with its offset.
    #[test]
    fn a_pages_frame_is_checked_by_its_page_hashes() {
        let head = vec![1u8; 20];
        let mut pages = vec![0u8; 2 * PAGE_SIZE];
        pages[5] = 9;
        pages[PAGE_SIZE + 7] = 3;
        let raw = encode_header(FrameKind::Pages, &[&head, &pages]).unwrap();
        let mut payload = [head.as_slice(), &pages].concat();
        let head_at = decode_header(&raw, 96).unwrap();
        let mut hashes = Vec::new();
        verify(&head_at, &raw, &payload, &mut hashes).unwrap();
        assert_eq!(hashes.len(), 3, "a 20-byte lead and two pages");
        assert_eq!(hashes[1], page_hash(&pages[..PAGE_SIZE]));
        assert_eq!(hashes[2], page_hash(&pages[PAGE_SIZE..]));
        for at in [3, 20 + 5, 20 + PAGE_SIZE + 4095] {
            payload[at] ^= 0x10;
            let err = verify(&head_at, &raw, &payload, &mut hashes).unwrap_err();
            assert!(
                err.to_string().contains("Pages frame at stream offset 96"),
                "{err}"
            );
            payload[at] ^= 0x10;
        }
        // A compressed Pages frame keeps the CRC: no page hashes.
        let lz4 = encode_header_with_flags(FrameKind::Pages, FLAG_LZ4, &[b"xyz"]).unwrap();
        let h = decode_header(&lz4, 0).unwrap();
        verify(&h, &lz4, b"xyz", &mut hashes).unwrap();
        assert!(hashes.is_empty());
    }

    #[test]
    fn flipped_payload_bit_is_a_checksum_error() {
        let raw = encode_header(FrameKind::Digest, &[b"0123456789abcdef"]).unwrap();
        let head = decode_header(&raw, 40).unwrap();
        let err = verify(&head, &raw, b"0123456789abcdeg", &mut Vec::new()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("Digest frame at stream offset 40"), "{msg}");
    }

    #[test]
    fn compression_flags_only_on_pages() {
        for (kind, flags, ok) in [
            (FrameKind::Pages, FLAG_LZ4, true),
            (FrameKind::Pages, FLAG_ZSTD, true),
            (FrameKind::Pages, 0x80, false),
            (FrameKind::Digest, FLAG_LZ4, false),
        ] {
            let raw = encode_header_with_flags(kind, flags, &[b"x"]).unwrap();
            let head = decode_header(&raw, 0).unwrap();
            let verified = verify(&head, &raw, b"x", &mut Vec::new());
            assert_eq!(verified.is_ok(), ok, "{kind} {flags:#x}");
        }
    }

    #[test]
    fn oversized_length_is_refused() {
        let mut raw = encode_header(FrameKind::Pages, &[b""]).unwrap();
        raw[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_header(&raw, 7),
            Err(StreamError::TooLong { offset: 7, .. })
        ));
    }

    #[test]
    fn unknown_type_with_valid_crc_is_reported_as_unknown() {
        let h8 = head8(200, 0, 0);
        let crc = crc_start(&h8).finalize();
        let mut raw = [0u8; FRAME_HEADER_LEN];
        raw[..8].copy_from_slice(&h8);
        raw[8..].copy_from_slice(&crc.to_le_bytes());
        let head = decode_header(&raw, 3).unwrap();
        assert!(matches!(
            verify(&head, &raw, b"", &mut Vec::new()),
            Err(StreamError::UnknownFrame {
                kind: 200,
                offset: 3
            })
        ));
    }
}
