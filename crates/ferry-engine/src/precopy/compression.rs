//! Which codec a sender uses for its next batch.
//!
//! `auto` compresses only while the link, not the CPU, is the bottleneck.
//! Each sender keeps running estimates (moving averages over its own
//! batches) of:
//!
//! ```text
//!   w    ns the link takes per wire byte (writing, and waiting for the bandwidth cap)
//!   c_a  ns codec a takes per raw byte          r_a  its wire bytes per raw byte
//! ```
//!
//! and sends each batch the way that costs least: raw costs `w` per byte,
//! codec `a` costs `c_a + r_a·w`. Every 32nd batch tries a codec that is not
//! the current choice, so estimates follow the data and the link as they
//! change. Fixed settings (`none`, `lz4`, `zstd`) skip all of this.

use crate::wire::compress::Codec;
use std::fmt;
use std::str::FromStr;

/// What the user asked for.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Never compress.
    #[default]
    None,
    /// Always try this codec (a batch that does not shrink goes raw).
    Fixed(Codec),
    /// Compress while it pays (see the module docs).
    Auto,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Fixed(c) => c.name(),
            Compression::Auto => "auto",
        })
    }
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Fixed(Codec::Lz4)),
            "zstd" => Ok(Compression::Fixed(Codec::Zstd)),
            "auto" => Ok(Compression::Auto),
            _ => Err(format!("unknown compression {s:?} (none, lz4, zstd, auto)")),
        }
    }
}

/// Weight of the newest sample in the moving averages.
const ALPHA: f64 = 0.25;
/// Batches between tries of a codec that is not the current choice.
const PROBE_EVERY: u64 = 32;
const CODECS: [Codec; 2] = [Codec::Lz4, Codec::Zstd];

#[derive(Clone, Copy, Default)]
struct Estimate {
    ns_per_raw_byte: f64,
    ratio: f64,
    known: bool,
}

fn blend(old: f64, new: f64, known: bool) -> f64 {
    if known {
        old + ALPHA * (new - old)
    } else {
        new
    }
}

/// One sender's choice of codec, batch by batch.
pub(super) struct Chooser {
    mode: Compression,
    batches: u64,
    wire_ns_per_byte: f64,
    wire_known: bool,
    codecs: [Estimate; 2],
}

impl Chooser {
    pub fn new(mode: Compression) -> Self {
        Chooser {
            mode,
            batches: 0,
            wire_ns_per_byte: 0.0,
            wire_known: false,
            codecs: [Estimate::default(); 2],
        }
    }

    /// The codec for the next batch, or `None` to send it raw.
    pub fn pick(&mut self) -> Option<Codec> {
        match self.mode {
            Compression::None => None,
            Compression::Fixed(c) => Some(c),
            Compression::Auto => {
                self.batches += 1;
                // Learn every codec once, then try each again now and then.
                if let Some(i) = self.codecs.iter().position(|e| !e.known) {
                    return Some(CODECS[i]);
                }
                let best = self.best();
                let probe = self.batches % PROBE_EVERY;
                match probe as usize {
                    p @ 1..=2 if best != Some(CODECS[p - 1]) => Some(CODECS[p - 1]),
                    3 if best.is_some() => None,
                    _ => best,
                }
            }
        }
    }

    /// The cheapest way to send a byte under the current estimates.
    fn best(&self) -> Option<Codec> {
        let w = self.wire_ns_per_byte;
        let mut best = (w, None);
        for (e, c) in self.codecs.iter().zip(CODECS) {
            let cost = e.ns_per_raw_byte + e.ratio * w;
            if e.known && cost < best.0 {
                best = (cost, Some(c));
            }
        }
        best.1
    }

    /// Records a compression of `raw` bytes to `packed` in `ns`.
    pub fn compressed(&mut self, codec: Codec, raw: usize, packed: usize, ns: u64) {
        let i = CODECS.iter().position(|&c| c == codec).unwrap_or(0);
        let e = &mut self.codecs[i];
        let raw = raw.max(1) as f64;
        e.ns_per_raw_byte = blend(e.ns_per_raw_byte, ns as f64 / raw, e.known);
        e.ratio = blend(e.ratio, (packed as f64 / raw).min(1.0), e.known);
        e.known = true;
    }

    /// Records that `wire` bytes took `ns` to leave (bandwidth cap included).
    pub fn sent(&mut self, wire: usize, ns: u64) {
        let w = ns as f64 / wire.max(1) as f64;
        self.wire_ns_per_byte = blend(self.wire_ns_per_byte, w, self.wire_known);
        self.wire_known = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learn(c: &mut Chooser, wire_ns: f64, lz4: (f64, f64), zstd: (f64, f64)) {
        for _ in 0..20 {
            c.sent(1 << 20, (wire_ns * (1 << 20) as f64) as u64);
            for (codec, (ns, ratio)) in [(Codec::Lz4, lz4), (Codec::Zstd, zstd)] {
                let raw = 1usize << 20;
                c.compressed(
                    codec,
                    raw,
                    (raw as f64 * ratio) as usize,
                    (ns * raw as f64) as u64,
                );
            }
        }
    }

    #[test]
    fn auto_compresses_on_a_slow_link_and_not_on_a_fast_one() {
        // A 128 MiB/s link (7.5 ns a byte): zstd's 2 ns and ratio 0.3 win.
        let mut slow = Chooser::new(Compression::Auto);
        learn(&mut slow, 7.5, (0.8, 0.5), (2.0, 0.3));
        assert_eq!(slow.best(), Some(Codec::Zstd));
        // Loopback at 3 GB/s (0.3 ns a byte): the CPU is the bottleneck.
        let mut fast = Chooser::new(Compression::Auto);
        learn(&mut fast, 0.3, (0.8, 0.5), (2.0, 0.3));
        assert_eq!(fast.best(), None);
        // Incompressible data: nothing pays.
        let mut noise = Chooser::new(Compression::Auto);
        learn(&mut noise, 7.5, (0.3, 1.0), (1.0, 1.0));
        assert_eq!(noise.best(), None);
    }

    #[test]
    fn auto_keeps_trying_the_alternatives() {
        let mut c = Chooser::new(Compression::Auto);
        learn(&mut c, 0.3, (0.8, 0.5), (2.0, 0.3));
        let picks: Vec<_> = (0..PROBE_EVERY).map(|_| c.pick()).collect();
        assert!(picks.contains(&Some(Codec::Lz4)) && picks.contains(&Some(Codec::Zstd)));
        assert!(picks.iter().filter(|p| p.is_none()).count() as u64 >= PROBE_EVERY - 3);
    }

    #[test]
    fn names_parse_and_print() {
        for s in ["none", "lz4", "zstd", "auto"] {
            assert_eq!(s.parse::<Compression>().unwrap().to_string(), s);
        }
        assert!("gzip".parse::<Compression>().is_err());
    }
}
