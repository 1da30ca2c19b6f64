//! The source's cache of last-sent pages for delta re-sends (`--delta`).
//!
//! Direct-mapped (page `gfn` may only live in slot `gfn mod slots`), split
//! into stripes with a lock each so the sender threads rarely meet. Pages
//! enter in the dirty rounds, as QEMU's XBZRLE does: the first pass sends
//! every page once and most are never sent again, so caching them would
//! only slow the pass that moves the most bytes.
//!
//! ```text
//!   sender, dirty round, page p of a batch:
//!     p cached  → delta(cached, p) short? → Delta frame, cache := p
//!                                  long?  → stays in Pages, cache := p
//!     p not cached → Pages; cache := p if the slot is free or its page is stale
//!     p zero    → Pages (one bit), slot forgets p
//! ```
//!
//! A slot's page is stale once a whole round passed without it being sent.
//! Until then a newcomer does not evict it: a guest sweeping more memory
//! than the cache holds would otherwise evict every page just before its
//! next send (a cyclic scan defeats plain replacement), while keeping the
//! residents gives the cache's worth of hits every round.

use crate::wire::delta::DeltaBatch;
use crate::wire::PageBatch;
use ferry_vm::{Gfn, PAGE_SIZE};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const STRIPES: usize = 64;
const EMPTY: u64 = u64::MAX;

struct Stripe {
    tags: Vec<u64>,
    /// The round each slot's page was last sent in.
    rounds: Vec<u32>,
    pages: Vec<u8>,
}

/// Bounded cache of the last copy sent of recently re-sent pages.
pub(crate) struct DeltaCache {
    slots: u64,
    stripes: Vec<Mutex<Stripe>>,
    /// Pages sent as a delta.
    pub hits: AtomicU64,
    /// Dirty-round pages sent whole: not cached, or too changed.
    pub misses: AtomicU64,
    /// Bytes of delta entries sent in place of whole pages.
    pub delta_bytes: AtomicU64,
}

impl DeltaCache {
    /// A cache of `bytes` (rounded down to whole pages, at least one per
    /// stripe).
    pub fn new(bytes: u64) -> Self {
        let per_stripe = (bytes / PAGE_SIZE as u64 / STRIPES as u64).max(1) as usize;
        DeltaCache {
            slots: (per_stripe * STRIPES) as u64,
            stripes: (0..STRIPES)
                .map(|_| {
                    Mutex::new(Stripe {
                        tags: vec![EMPTY; per_stripe],
                        rounds: vec![0; per_stripe],
                        pages: vec![0; per_stripe * PAGE_SIZE],
                    })
                })
                .collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            delta_bytes: AtomicU64::new(0),
        }
    }

    /// Bytes the cache holds pages in.
    pub fn bytes(&self) -> u64 {
        self.slots * PAGE_SIZE as u64
    }

    /// Moves every page of the sealed `batch` that delta-encodes well into
    /// `deltas` (begun for the batch's round), and remembers every non-zero
    /// page as sent.
    pub fn split(&self, batch: &mut PageBatch, deltas: &mut DeltaBatch) {
        let before = deltas.payload().len();
        let round = batch.round();
        batch.retain(|gfn, page| self.visit(gfn, page, round, deltas));
        self.delta_bytes
            .fetch_add((deltas.payload().len() - before) as u64, Ordering::Relaxed);
    }

    /// One page: false if it went into `deltas`.
    fn visit(&self, gfn: Gfn, page: Option<&[u8]>, round: u32, deltas: &mut DeltaBatch) -> bool {
        let slot = gfn.0 % self.slots;
        let (stripe, i) = (
            (slot % STRIPES as u64) as usize,
            (slot / STRIPES as u64) as usize,
        );
        let mut s = self.stripes[stripe]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let Some(page) = page else {
            if s.tags[i] == gfn.0 {
                s.tags[i] = EMPTY;
            }
            return true;
        };
        let Stripe {
            tags,
            rounds,
            pages,
        } = &mut *s;
        let mine = tags[i] == gfn.0;
        if !mine && tags[i] != EMPTY && rounds[i] + 1 >= round {
            // Another page's copy, still in use: keep it.
            self.misses.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let cached = &mut pages[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
        let hit = mine && deltas.push(gfn, cached, page);
        cached.copy_from_slice(page);
        tags[i] = gfn.0;
        rounds[i] = round;
        if hit {
            self.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        !hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::delta::{apply, decode_delta};

    fn batch(round: u32, pages: &[(u64, u8)]) -> PageBatch {
        let mut b = PageBatch::new(pages.len());
        for &(g, v) in pages {
            let buf = b.push_run(Gfn(g), 1);
            buf.fill(0);
            buf[0] = v;
            buf[100] = v;
        }
        b.seal(round);
        b
    }

    #[test]
    fn second_sends_become_deltas_and_zero_pages_forget() {
        let cache = DeltaCache::new(1 << 20);
        let mut d = DeltaBatch::default();
        let mut b = batch(1, &[(1, 1), (2, 2), (3, 3)]);
        d.begin(1);
        cache.split(&mut b, &mut d);
        assert_eq!((b.len(), d.len()), (3, 0), "first sends go whole");
        let mut b = batch(2, &[(1, 9), (2, 0), (3, 3)]);
        d.begin(2);
        cache.split(&mut b, &mut d);
        assert_eq!((b.len(), d.len()), (1, 2), "page 2 went zero, so stays");
        let view = decode_delta(d.payload(), 8).unwrap();
        let mut old = vec![0u8; PAGE_SIZE];
        old[0] = 1;
        old[100] = 1;
        let (g, delta) = view.entries().next().unwrap();
        assert_eq!(g, Gfn(1));
        apply(&mut old, delta).unwrap();
        assert_eq!((old[0], old[100]), (9, 9));
        // Page 2 was forgotten when it went zero: its next send is whole.
        let mut b = batch(3, &[(2, 5)]);
        d.begin(3);
        cache.split(&mut b, &mut d);
        assert_eq!((b.len(), d.len()), (1, 0));
        assert_eq!(cache.hits.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn residents_stay_until_stale_then_give_way() {
        let cache = DeltaCache::new(0); // one slot per stripe
        assert_eq!(cache.bytes(), (STRIPES * PAGE_SIZE) as u64);
        let other = STRIPES as u64; // the same slot as page 0
        let mut d = DeltaBatch::default();
        let mut send = |round, gfn, v| {
            d.begin(round);
            let mut b = batch(round, &[(gfn, v)]);
            cache.split(&mut b, &mut d);
            d.len()
        };
        assert_eq!(send(1, 0, 1), 0); // page 0 moves in
        assert_eq!(send(1, other, 1), 0); // the slot is in use: not cached
        assert_eq!(send(2, 0, 2), 1, "page 0 kept its slot");
        assert_eq!(send(3, other, 2), 0); // page 0 sent in round 2: kept
        assert_eq!(send(4, other, 3), 0); // stale by now: the other moves in
        assert_eq!(send(5, other, 4), 1);
        assert_eq!(send(5, 0, 5), 0, "page 0 lost its slot and goes whole");
    }
}
