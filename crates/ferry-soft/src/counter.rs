//! Event counters that many vCPUs bump at once without sharing a cache line.
//!
//! A fault path that did `fetch_add` on one shared counter per event paid a
//! cache-line transfer between cores on every fault. Each counter here has
//! one padded shard per vCPU slot (modulo [`SHARDS`]); reading sums them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Shards per counter.
pub const SHARDS: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Shard(AtomicU64);

/// A sharded event counter.
#[derive(Default)]
pub struct Counter {
    shards: [Shard; SHARDS],
}

impl Counter {
    /// Adds `n`, on the shard of vCPU `vcpu` (None: a host thread).
    #[inline]
    pub fn add(&self, vcpu: Option<usize>, n: u64) {
        let s = vcpu.map_or(SHARDS - 1, |v| v % SHARDS);
        self.shards[s].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The total so far.
    pub fn get(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_sum_to_the_total() {
        let c = Counter::default();
        for v in 0..40 {
            c.add(Some(v), 2);
        }
        c.add(None, 1);
        assert_eq!(c.get(), 81);
    }
}
