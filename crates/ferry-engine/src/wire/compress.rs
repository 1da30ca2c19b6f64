//! Per-batch compression of page data, marked by a frame flag.
//!
//! ```text
//!  compressed Pages payload
//!  ┌──────────────┬──────────────────────────────────────────────┐
//!  │ raw_len u32  │ lz4 block or zstd frame of the raw payload   │
//!  └──────────────┴──────────────────────────────────────────────┘
//!    flag 0x01: lz4 (lz4_flex block format)   flag 0x02: zstd (level 1)
//! ```
//!
//! The receiver checks `raw_len` against [`MAX_FRAME_LEN`] before it
//! allocates anything, and decompresses into a buffer of exactly that size,
//! failing if the data would need more: a small frame cannot expand into a
//! decompression bomb. A batch whose compressed form is not smaller than the
//! raw one goes raw.

use super::MAX_FRAME_LEN;

/// Frame flag: the payload is lz4-compressed.
pub const FLAG_LZ4: u8 = 0x01;
/// Frame flag: the payload is zstd-compressed.
pub const FLAG_ZSTD: u8 = 0x02;
/// zstd level: the fastest, since the point is to beat a slow link with
/// little CPU.
const ZSTD_LEVEL: i32 = 1;

pub use crate::choices::Codec;

impl Codec {
    /// The frame flag marking this codec.
    pub fn flag(self) -> u8 {
        match self {
            Codec::Lz4 => FLAG_LZ4,
            Codec::Zstd => FLAG_ZSTD,
        }
    }
}

/// Reusable compression state of one sender thread.
pub struct Compressor {
    raw: Vec<u8>,
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

impl Default for Compressor {
    fn default() -> Self {
        Compressor {
            raw: Vec::new(),
            zstd: zstd::bulk::Compressor::new(ZSTD_LEVEL).ok(),
        }
    }
}

impl Compressor {
    /// Compresses the payload `parts` with `codec` into `out`. Returns false
    /// (and leaves `out` unspecified) when that would not make it smaller.
    pub fn compress(&mut self, codec: Codec, parts: &[&[u8]], out: &mut Vec<u8>) -> bool {
        self.raw.clear();
        parts.iter().for_each(|p| self.raw.extend_from_slice(p));
        let raw_len = self.raw.len();
        out.clear();
        out.extend_from_slice(&(raw_len as u32).to_le_bytes());
        let packed = match codec {
            Codec::Lz4 => {
                out.resize(4 + lz4_flex::block::get_maximum_output_size(raw_len), 0);
                lz4_flex::block::compress_into(&self.raw, &mut out[4..]).ok()
            }
            Codec::Zstd => {
                let Some(z) = self.zstd.as_mut() else {
                    return false;
                };
                out.resize(4 + zstd::zstd_safe::compress_bound(raw_len), 0);
                z.compress_to_buffer(&self.raw, &mut out[4..]).ok()
            }
        };
        match packed {
            Some(n) if 4 + n < raw_len => {
                out.truncate(4 + n);
                true
            }
            _ => false,
        }
    }
}

/// Most an lz4 block expands: one literal token byte can stand for 255
/// more bytes of a match.
const LZ4_MAX_RATIO: u64 = 255;

/// Decompresses a payload carrying `flags` into `out`; the reason on error.
pub fn decompress(flags: u8, payload: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    if payload.len() < 4 {
        return Err("compressed payload too short for its length".into());
    }
    // Before the buffer is sized: a bad frame must not cost its claimed
    // length in zeroed memory.
    if flags != FLAG_LZ4 && flags != FLAG_ZSTD {
        return Err(format!("unknown compression flags {flags:#04x}"));
    }
    let raw_len = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
    if raw_len > MAX_FRAME_LEN {
        return Err(format!(
            "compressed payload claims {raw_len} bytes, more than the {MAX_FRAME_LEN}-byte limit"
        ));
    }
    // lz4 cannot expand a block more than 255-fold: a larger claim is a
    // lie, refused before its buffer is zeroed.
    let packed = (payload.len() - 4) as u64;
    if flags == FLAG_LZ4 && u64::from(raw_len) > packed * LZ4_MAX_RATIO + 16 {
        return Err(format!(
            "lz4 payload of {packed} bytes claims {raw_len} bytes, more than lz4 can expand to"
        ));
    }
    let raw_len = raw_len as usize;
    out.clear();
    let got = match flags {
        FLAG_LZ4 => {
            out.resize(raw_len, 0);
            lz4_flex::block::decompress_into(&payload[4..], out).map_err(|e| format!("lz4: {e}"))?
        }
        _ => {
            // zstd has no small maximum ratio, but its frame states its
            // content size (our compressor always writes it): a claim the
            // frame does not make is refused, and the output is written
            // into reserved, never zeroed, capacity, so a frame that fails
            // midway costs no more than what it really decoded.
            match zstd::zstd_safe::get_frame_content_size(&payload[4..]) {
                Ok(Some(n)) if n == raw_len as u64 => {}
                Ok(Some(n)) => {
                    return Err(format!(
                        "zstd frame holds {n} bytes, the payload claims {raw_len}"
                    ))
                }
                Ok(None) | Err(_) => {
                    return Err("zstd frame does not state its content size".into())
                }
            }
            out.reserve_exact(raw_len);
            zstd::bulk::Decompressor::new()
                .and_then(|mut d| d.decompress_to_buffer(&payload[4..], out))
                .map_err(|e| format!("zstd: {e}"))?
        }
    };
    if got != raw_len {
        return Err(format!(
            "decompressed to {got} bytes, the frame says {raw_len}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> Vec<u8> {
        b"the quick brown fox jumps over the lazy dog 0123 "
            .iter()
            .cycle()
            .take(n)
            .copied()
            .collect()
    }

    #[test]
    fn both_codecs_round_trip_split_parts() {
        let (a, b) = (text(1000), text(70_000));
        let mut c = Compressor::default();
        for codec in [Codec::Lz4, Codec::Zstd] {
            let mut packed = Vec::new();
            assert!(c.compress(codec, &[&a, &b], &mut packed));
            assert!(packed.len() < (a.len() + b.len()) / 4);
            let mut out = Vec::new();
            decompress(codec.flag(), &packed, &mut out).unwrap();
            assert_eq!(out, [a.clone(), b.clone()].concat());
        }
    }

    #[test]
    fn incompressible_data_goes_raw() {
        let mut s = 0x1234_5678_9abc_def0u64;
        let noise: Vec<u8> = (0..8192)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        let mut packed = Vec::new();
        assert!(!Compressor::default().compress(Codec::Lz4, &[&noise], &mut packed));
    }

    #[test]
    fn bombs_and_garbage_are_refused() {
        let mut out = Vec::new();
        let mut bomb = (MAX_FRAME_LEN + 1).to_le_bytes().to_vec();
        bomb.extend_from_slice(&[0; 16]);
        let err = decompress(FLAG_ZSTD, &bomb, &mut out).unwrap_err();
        assert!(err.contains("more than"), "{err}");
        assert!(out.capacity() < 1 << 20, "nothing allocated for a bomb");
        // Real data that expands beyond what the frame declares.
        let mut packed = Vec::new();
        assert!(Compressor::default().compress(Codec::Zstd, &[&text(100_000)], &mut packed));
        packed[..4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(decompress(FLAG_ZSTD, &packed, &mut out).is_err());
        assert!(decompress(FLAG_LZ4, &[5, 0, 0, 0, 0xff], &mut out).is_err());
        assert!(decompress(0x80, &[0, 0, 0, 0], &mut out).is_err());
        assert!(decompress(FLAG_LZ4, &[1], &mut out).is_err());
        // A few lz4 bytes that claim 32 MiB: refused before any buffer.
        let mut out = Vec::new();
        let mut claim = (32u32 << 20).to_le_bytes().to_vec();
        claim.extend_from_slice(&[0x1f; 8]);
        let err = decompress(FLAG_LZ4, &claim, &mut out).unwrap_err();
        assert!(err.contains("more than lz4 can expand"), "{err}");
        assert!(out.capacity() < 1 << 20, "nothing allocated for the claim");
        // Unknown flags: refused before the claimed length is allocated.
        assert!(decompress(0x80, &claim, &mut out).is_err());
        assert!(out.capacity() < 1 << 20);
    }

    /// A zstd payload whose length prefix claims more than its frame
    /// holds, or whose frame hides its size, is refused before any buffer
    /// is sized; a frame that lies about its size is never zero-filled.
    #[test]
    fn zstd_claims_are_checked_against_the_frame() {
        let mut packed = Vec::new();
        assert!(Compressor::default().compress(Codec::Zstd, &[&text(100_000)], &mut packed));
        let mut out = Vec::new();
        let mut claim = packed.clone();
        claim[..4].copy_from_slice(&(32u32 << 20).to_le_bytes());
        let err = decompress(FLAG_ZSTD, &claim, &mut out).unwrap_err();
        assert!(err.contains("holds 100000 bytes"), "{err}");
        assert!(out.capacity() < 1 << 20, "nothing allocated for the claim");
        // A frame header with no content size (descriptor 0: single
        // segment off, no size field).
        let mut hidden = 4096u32.to_le_bytes().to_vec();
        hidden.extend_from_slice(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x50, 0x01, 0x00, 0x00]);
        let err = decompress(FLAG_ZSTD, &hidden, &mut out).unwrap_err();
        assert!(err.contains("content size"), "{err}");
        // The honest frame still decodes, after the refusals.
        decompress(FLAG_ZSTD, &packed, &mut out).unwrap();
        assert_eq!(out, text(100_000));
    }
}
