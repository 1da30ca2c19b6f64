//! What the guest's data pages hold besides the stamp: honest contents for
//! measuring compression.
//!
//! A memstress page is an 8-byte stamp at offset 0; left at that, the other
//! 4088 bytes are zero and any compressor shrinks the page 500×, which says
//! nothing about real memory. The fill is written once, when the source VM
//! is built, over bytes 8..4096 of every data page; the guest never touches
//! it, so it moves with the page and the digest covers it.
//!
//! ```text
//!   zero    all zero (the default; the original memstress page)
//!   random  a xorshift stream per page: does not compress
//!   text    words from a fixed vocabulary with numbers between them:
//!           about 2.5× with zstd level 1 and 1.65× with lz4, like ordinary memory
//! ```

use ferry_vm::PAGE_SIZE;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Bytes at the start of each page the guest owns (the stamp).
pub const STAMP_BYTES: usize = 8;

/// Contents of the data pages.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fill {
    /// Zero bytes.
    #[default]
    Zero,
    /// Incompressible bytes.
    Random,
    /// Text-like bytes that compress about as well as ordinary memory.
    Text,
}

impl fmt::Display for Fill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fill::Zero => "zero",
            Fill::Random => "random",
            Fill::Text => "text",
        })
    }
}

impl FromStr for Fill {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "zero" => Ok(Fill::Zero),
            "random" => Ok(Fill::Random),
            "text" => Ok(Fill::Text),
            _ => Err(format!("unknown fill {s:?} (zero, random, text)")),
        }
    }
}

const WORDS: [&str; 64] = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "memory",
    "page",
    "guest",
    "migration",
    "kernel",
    "buffer",
    "request",
    "thread",
    "value",
    "error",
    "device",
    "queue",
    "table",
    "entry",
    "cache",
    "state",
];

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

impl Fill {
    /// Writes the fill of the page with index `page` (any stable number,
    /// e.g. its frame) into `out`, which is one page; the stamp bytes are
    /// left alone.
    pub fn fill_page(self, page: u64, out: &mut [u8]) {
        debug_assert_eq!(out.len(), PAGE_SIZE);
        let body = &mut out[STAMP_BYTES..];
        let mut s = page.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        match self {
            Fill::Zero => body.fill(0),
            Fill::Random => {
                for chunk in body.chunks_mut(8) {
                    let v = xorshift(&mut s).to_le_bytes();
                    chunk.copy_from_slice(&v[..chunk.len()]);
                }
            }
            Fill::Text => {
                let mut at = 0;
                let mut word = [0u8; 24];
                while at < body.len() {
                    let r = xorshift(&mut s);
                    let len = if r.is_multiple_of(5) {
                        // A number now and then, as logs and records have.
                        digits((r >> 8) % 100_000, &mut word)
                    } else {
                        let w = WORDS[((r >> 8) % WORDS.len() as u64) as usize].as_bytes();
                        word[..w.len()].copy_from_slice(w);
                        w.len()
                    };
                    word[len] = b' ';
                    let n = (len + 1).min(body.len() - at);
                    body[at..at + n].copy_from_slice(&word[..n]);
                    at += n;
                }
            }
        }
    }
}

/// Writes `v` in decimal at the start of `out`; returns its length.
fn digits(mut v: u64, out: &mut [u8]) -> usize {
    let mut tmp = [0u8; 20];
    let mut n = 0;
    loop {
        tmp[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        out[i] = tmp[n - 1 - i];
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page fills are honest inputs: text compresses about as well as
    /// ordinary memory (2-4x with zstd level 1, as the engine compresses),
    /// random not at all.
    #[test]
    fn page_fills_compress_as_documented() {
        let pages = |fill: Fill| {
            let mut all = vec![0u8; 256 * PAGE_SIZE];
            for (i, p) in all.chunks_exact_mut(PAGE_SIZE).enumerate() {
                fill.fill_page(i as u64, p);
            }
            all
        };
        let text = pages(Fill::Text);
        let packed = zstd::bulk::compress(&text, 1).unwrap();
        let ratio = text.len() as f64 / packed.len() as f64;
        assert!((2.0..=4.0).contains(&ratio), "text: {ratio:.2}x with zstd");
        let random = pages(Fill::Random);
        assert!(zstd::bulk::compress(&random, 1).unwrap().len() >= random.len());
        assert!(lz4_flex::compress(&random).len() >= random.len());
    }

    #[test]
    fn names_round_trip_and_fills_differ() {
        for f in [Fill::Zero, Fill::Random, Fill::Text] {
            assert_eq!(f.to_string().parse::<Fill>().unwrap(), f);
        }
        assert!("ones".parse::<Fill>().is_err());
        let mut a = vec![7u8; PAGE_SIZE];
        Fill::Text.fill_page(1, &mut a);
        assert_eq!(
            &a[..STAMP_BYTES],
            &[7; STAMP_BYTES],
            "the stamp is left alone"
        );
        let mut b = vec![0u8; PAGE_SIZE];
        Fill::Text.fill_page(2, &mut b);
        assert_ne!(a[STAMP_BYTES..], b[STAMP_BYTES..], "pages differ");
        let text = String::from_utf8(a[STAMP_BYTES..].to_vec()).unwrap();
        assert!(text.split(' ').any(|w| w.parse::<u64>().is_ok()), "numbers");
        assert!(text.contains("memory") || text.contains("the "), "words");
        let mut r = vec![0u8; PAGE_SIZE];
        Fill::Random.fill_page(1, &mut r);
        assert!(r[STAMP_BYTES..].iter().filter(|&&x| x == 0).count() < 100);
    }
}
