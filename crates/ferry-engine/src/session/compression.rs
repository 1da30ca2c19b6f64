//! Which codec a sender uses for its next batch.
//!
//! `auto` compresses only while the link, not the CPU, is the bottleneck.
//! Each sender measures, per way of sending a batch (raw, lz4, zstd), what
//! one raw byte costs end to end: compressing, waiting for the bandwidth
//! cap, and writing to the socket. It keeps a moving average per way and
//! sends each batch the cheapest way. That single figure takes in whatever
//! the host does to us: a slow link makes raw bytes dear, a busy CPU makes
//! compression dear, and incompressible data makes it pure cost.
//!
//! Each way is tried twice at the start, the first try not counted (it runs
//! on cold caches and a fresh context), then every 16th batch tries a way
//! that is not the current choice, so the averages follow the data and the link as
//! they change. Fixed settings (`none`, `lz4`, `zstd`) skip all of this.

use crate::choices::Compression;
use crate::wire::compress::Codec;

/// Weight of the newest sample in the moving averages.
const ALPHA: f64 = 0.5;
/// Batches between tries of a way that is not the current choice.
const PROBE_EVERY: u64 = 16;
/// ... when the choice wins by more than 2×: trying is then mostly waste.
const PROBE_EVERY_CLEAR: u64 = 128;
/// Samples of each way taken before choosing.
const LEARN_SAMPLES: u32 = 2;
/// The ways of sending a batch: raw, lz4, zstd.
const WAYS: [Option<Codec>; 3] = [None, Some(Codec::Lz4), Some(Codec::Zstd)];

fn way_index(way: Option<Codec>) -> usize {
    WAYS.iter().position(|&w| w == way).unwrap_or(0)
}

/// One sender's choice of codec, batch by batch.
pub(super) struct Chooser {
    mode: Compression,
    batches: u64,
    /// Moving average of ns per raw byte, and samples, per way.
    cost: [(f64, u32); 3],
}

impl Chooser {
    pub fn new(mode: Compression) -> Self {
        Chooser {
            mode,
            batches: 0,
            cost: [(0.0, 0); 3],
        }
    }

    /// The codec for the next batch, or `None` to send it raw.
    pub fn pick(&mut self) -> Option<Codec> {
        match self.mode {
            Compression::None => None,
            Compression::Fixed(c) => Some(c),
            Compression::Auto => {
                self.batches += 1;
                if let Some(i) = self.cost.iter().position(|&(_, n)| n < LEARN_SAMPLES) {
                    return WAYS[i];
                }
                let best = self.best();
                // Now and then, each other way once; seldom when the choice is clear.
                let mut costs: Vec<f64> = self.cost.iter().map(|c| c.0).collect();
                costs.sort_by(f64::total_cmp);
                let every = if costs[0] * 2.0 < costs[1] {
                    PROBE_EVERY_CLEAR
                } else {
                    PROBE_EVERY
                };
                match (self.batches % every) as usize {
                    p @ 1..=2 => {
                        let others: Vec<_> = WAYS.into_iter().filter(|&w| w != best).collect();
                        others[p - 1]
                    }
                    _ => best,
                }
            }
        }
    }

    /// The way with the lowest measured cost per raw byte.
    fn best(&self) -> Option<Codec> {
        let i = (0..WAYS.len())
            .min_by(|&a, &b| self.cost[a].0.total_cmp(&self.cost[b].0))
            .unwrap_or(0);
        WAYS[i]
    }

    /// Records that a batch of `raw` bytes, sent the `way` it was picked
    /// (a compression that did not shrink it counts as that way), took
    /// `ns` from compression to written.
    pub fn finished(&mut self, way: Option<Codec>, raw: usize, ns: u64) {
        let (avg, n) = &mut self.cost[way_index(way)];
        let sample = ns as f64 / raw.max(1) as f64;
        // The first batch each way warms caches and contexts: not counted.
        *avg = match *n {
            0 => *avg,
            1 => sample,
            _ => *avg + ALPHA * (sample - *avg),
        };
        *n = n.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `batches` batches whose cost per raw byte is `ns(way)`.
    fn run(
        c: &mut Chooser,
        batches: usize,
        mut ns: impl FnMut(Option<Codec>) -> f64,
    ) -> Vec<Option<Codec>> {
        (0..batches)
            .map(|_| {
                let way = c.pick();
                c.finished(way, 1 << 20, (ns(way) * (1 << 20) as f64) as u64);
                way
            })
            .collect()
    }

    #[test]
    fn auto_compresses_on_a_slow_link_and_not_on_a_fast_one() {
        // A 128 MiB/s link: raw 7.5 ns a byte; zstd 2 + 0.4 x 7.5.
        let mut slow = Chooser::new(Compression::Auto);
        run(&mut slow, 40, |w| match w {
            None => 7.5,
            Some(Codec::Lz4) => 0.8 + 0.6 * 7.5,
            Some(Codec::Zstd) => 2.0 + 0.4 * 7.5,
        });
        assert_eq!(slow.best(), Some(Codec::Zstd));
        // Loopback at 3 GB/s: the CPU is the bottleneck.
        let mut fast = Chooser::new(Compression::Auto);
        run(&mut fast, 40, |w| match w {
            None => 0.3,
            Some(Codec::Lz4) => 0.8 + 0.6 * 0.3,
            Some(Codec::Zstd) => 2.0 + 0.4 * 0.3,
        });
        assert_eq!(fast.best(), None);
    }

    #[test]
    fn a_cold_first_compression_does_not_decide() {
        let mut c = Chooser::new(Compression::Auto);
        let mut first = true;
        run(&mut c, 40, |w| match w {
            None => 7.5,
            Some(Codec::Lz4) => 0.8 + 0.6 * 7.5,
            Some(Codec::Zstd) if std::mem::take(&mut first) => 25.0,
            Some(Codec::Zstd) => 2.0 + 0.4 * 7.5,
        });
        assert_eq!(c.best(), Some(Codec::Zstd));
    }

    #[test]
    fn auto_keeps_trying_the_alternatives_and_mostly_sends_the_best() {
        let mut c = Chooser::new(Compression::Auto);
        // A close call: probes every 16 batches.
        let picks = run(&mut c, 6 + PROBE_EVERY as usize * 4, |w| match w {
            None => 1.5,
            Some(_) => 2.0,
        });
        let late = &picks[6..];
        assert!(late.contains(&Some(Codec::Lz4)) && late.contains(&Some(Codec::Zstd)));
        let raw = late.iter().filter(|p| p.is_none()).count();
        assert!(raw >= late.len() * (PROBE_EVERY as usize - 2) / PROBE_EVERY as usize);
        // A clear one: probes every 128.
        let mut c = Chooser::new(Compression::Auto);
        let picks = run(&mut c, 6 + PROBE_EVERY_CLEAR as usize, |w| match w {
            None => 0.3,
            Some(_) => 2.0,
        });
        let tried = picks[6..].iter().filter(|p| p.is_some()).count();
        assert_eq!(tried, 2, "{picks:?}");
    }

    #[test]
    fn names_parse_and_print() {
        for s in ["none", "lz4", "zstd", "auto"] {
            assert_eq!(s.parse::<Compression>().unwrap().to_string(), s);
        }
        assert!("gzip".parse::<Compression>().is_err());
    }
}
