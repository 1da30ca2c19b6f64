//! Delta pages: a page sent again as the bytes that changed since the copy
//! the destination already holds (QEMU calls its version XBZRLE).
//!
//! A guest that rewrites a few words of a page between rounds (a counter,
//! a timestamp, a list link) dirties the whole page, and precopy sends all
//! 4096 bytes again. The source keeps the last copy it sent of recently
//! sent pages (see `precopy::delta`), and sends the difference instead.
//!
//! ```text
//!  one page's delta: runs of changed bytes, compared 8 bytes at a time
//!  ┌────────────────────┬──────────────────┬─────────────┐
//!  │ unchanged uleb128  │ changed uleb128  │ changed ... │ × n (to the last change)
//!  └────────────────────┴──────────────────┴─────────────┘
//!
//!  Delta payload (frame type Delta, compressible like Pages)
//!  ┌──────────┬───────────┬──────────────────────────────────────────┐
//!  │ round u32│ count u32 │ count × (gfn u64, len u16, delta[len])   │
//!  └──────────┴───────────┴──────────────────────────────────────────┘
//! ```
//!
//! A delta is only ever sent against the copy the destination holds: the
//! round rules of [`super`] put the destination's page at the source's last
//! sent copy when a later round's batch is applied, and a page that went
//! out zero, or left the cache, is sent whole next time.

use ferry_vm::{Gfn, PAGE_SIZE};

/// Largest delta worth sending: past this, the page goes whole.
pub const MAX_DELTA_LEN: usize = PAGE_SIZE / 2;
const ENTRY_HEAD: usize = 10;

fn word(p: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[i * 8..i * 8 + 8]);
    u64::from_ne_bytes(b)
}

fn put_uleb(out: &mut Vec<u8>, mut v: usize) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn get_uleb(d: &[u8], at: &mut usize) -> Result<usize, String> {
    let mut v = 0usize;
    // A page offset needs at most two 7-bit groups; allow three.
    for shift in [0, 7, 14] {
        let b = *d.get(*at).ok_or("delta ends inside a length")?;
        *at += 1;
        v |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("delta length longer than three bytes".into())
}

/// Appends the delta from `old` to `new` (whole pages) to `out`. Returns
/// false, leaving `out` as it was, if it would be longer than `limit`.
pub fn encode(old: &[u8], new: &[u8], out: &mut Vec<u8>, limit: usize) -> bool {
    debug_assert!(old.len() == PAGE_SIZE && new.len() == PAGE_SIZE);
    let start = out.len();
    let words = PAGE_SIZE / 8;
    let (mut i, mut done) = (0usize, 0usize);
    while i < words {
        if word(old, i) == word(new, i) {
            i += 1;
            continue;
        }
        let first = i;
        while i < words && word(old, i) != word(new, i) {
            i += 1;
        }
        let (from, to) = (first * 8, i * 8);
        put_uleb(out, from - done);
        put_uleb(out, to - from);
        out.extend_from_slice(&new[from..to]);
        done = to;
        if out.len() - start > limit {
            out.truncate(start);
            return false;
        }
    }
    true
}

/// Applies `delta` to `page` in place.
pub fn apply(page: &mut [u8], delta: &[u8]) -> Result<(), String> {
    let (mut at, mut pos) = (0usize, 0usize);
    while at < delta.len() {
        let skip = get_uleb(delta, &mut at)?;
        let len = get_uleb(delta, &mut at)?;
        let from = pos + skip;
        let to = from + len;
        if len == 0 || to > page.len() {
            return Err(format!(
                "delta writes bytes {from}..{to} of a {}-byte page",
                page.len()
            ));
        }
        let bytes = delta
            .get(at..at + len)
            .ok_or("delta ends inside its changed bytes")?;
        page[from..to].copy_from_slice(bytes);
        at += len;
        pos = to;
    }
    Ok(())
}

/// A Delta payload being built by a sender.
#[derive(Default)]
pub struct DeltaBatch {
    buf: Vec<u8>,
    count: u32,
}

impl DeltaBatch {
    /// Empties the batch and starts one for `round`.
    pub fn begin(&mut self, round: u32) {
        self.buf.clear();
        self.buf.extend_from_slice(&round.to_le_bytes());
        self.buf.extend_from_slice(&0u32.to_le_bytes());
        self.count = 0;
    }

    /// Adds the delta of `gfn` from `old` to `new` if it is short enough;
    /// returns whether it did.
    pub fn push(&mut self, gfn: Gfn, old: &[u8], new: &[u8]) -> bool {
        let at = self.buf.len();
        self.buf.extend_from_slice(&gfn.0.to_le_bytes());
        self.buf.extend_from_slice(&[0, 0]);
        if !encode(old, new, &mut self.buf, MAX_DELTA_LEN) {
            self.buf.truncate(at);
            return false;
        }
        let len = (self.buf.len() - at - ENTRY_HEAD) as u16;
        self.buf[at + 8..at + ENTRY_HEAD].copy_from_slice(&len.to_le_bytes());
        self.count += 1;
        self.buf[4..8].copy_from_slice(&self.count.to_le_bytes());
        true
    }

    /// Pages in the batch.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the batch holds no page.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.buf
    }
}

/// A received, validated Delta payload.
#[derive(Debug)]
pub struct DeltaView<'a> {
    /// The precopy round it belongs to.
    pub round: u32,
    entries: Vec<(Gfn, &'a [u8])>,
}

impl<'a> DeltaView<'a> {
    /// Pages in it.
    pub fn pages(&self) -> usize {
        self.entries.len()
    }

    /// Each page and its delta, in stream order.
    pub fn entries(&self) -> impl Iterator<Item = (Gfn, &'a [u8])> + '_ {
        self.entries.iter().copied()
    }
}

/// Parses and validates a Delta payload against a guest of `total_pages`.
/// The error is a reason; the caller adds frame type and offset.
pub fn decode_delta(payload: &[u8], total_pages: u64) -> Result<DeltaView<'_>, String> {
    if payload.len() < 8 {
        return Err("too short for a round and a count".into());
    }
    let round = super::bytes::u32_at(payload, 0);
    let count = super::bytes::u32_at(payload, 4) as usize;
    if count == 0 || count > super::MAX_BATCH_PAGES {
        return Err(format!("page count {count} is out of range"));
    }
    let mut entries = Vec::with_capacity(count);
    let mut at = 8usize;
    for _ in 0..count {
        let head = payload
            .get(at..at + ENTRY_HEAD)
            .ok_or("too short for its page entries")?;
        let gfn = super::bytes::u64_at(head, 0);
        let len = usize::from(u16::from_le_bytes([head[8], head[9]]));
        if gfn >= total_pages {
            return Err(format!(
                "delta for gfn {gfn:#x}, outside the guest's {total_pages} pages"
            ));
        }
        if len > MAX_DELTA_LEN {
            return Err(format!("a {len}-byte delta, longer than {MAX_DELTA_LEN}"));
        }
        at += ENTRY_HEAD;
        let delta = payload
            .get(at..at + len)
            .ok_or("too short for its page entries")?;
        entries.push((Gfn(gfn), delta));
        at += len;
    }
    if at != payload.len() {
        return Err(format!("{} bytes after the last entry", payload.len() - at));
    }
    Ok(DeltaView { round, entries })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn page(seed: u8) -> Vec<u8> {
        (0..PAGE_SIZE)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn a_changed_stamp_costs_a_few_bytes() {
        let old = page(1);
        let mut new = old.clone();
        new[8..16].copy_from_slice(&0xdead_beef_u64.to_le_bytes());
        let mut d = Vec::new();
        assert!(encode(&old, &new, &mut d, MAX_DELTA_LEN));
        assert_eq!(d.len(), 2 + 8);
        let mut back = old.clone();
        apply(&mut back, &d).unwrap();
        assert_eq!(back, new);
        // An unchanged page is an empty delta.
        let mut none = Vec::new();
        assert!(encode(&old, &old, &mut none, MAX_DELTA_LEN));
        assert!(none.is_empty());
    }

    #[test]
    fn a_rewritten_page_is_too_long_and_leaves_out_untouched() {
        let mut out = vec![7u8];
        assert!(!encode(&page(1), &page(2), &mut out, MAX_DELTA_LEN));
        assert_eq!(out, vec![7u8]);
    }

    #[test]
    fn bad_deltas_are_refused() {
        let mut p = page(0);
        assert!(apply(&mut p, &[0xff, 0x7f, 8]).is_err()); // past the page
        assert!(apply(&mut p, &[0, 8, 1, 2]).is_err()); // bytes missing
        assert!(apply(&mut p, &[0, 0]).is_err()); // empty run
        assert!(apply(&mut p, &[0x80, 0x80, 0x80, 0x01]).is_err()); // long uleb
    }

    #[test]
    fn batches_round_trip_and_are_validated() {
        let (old, mut new) = (page(3), page(3));
        new[4000] ^= 1;
        let mut b = DeltaBatch::default();
        b.begin(7);
        assert!(b.push(Gfn(5), &old, &new));
        assert!(!b.push(Gfn(6), &page(1), &page(2)));
        assert!(b.push(Gfn(9), &old, &old));
        assert_eq!(b.len(), 2);
        let v = decode_delta(b.payload(), 10).unwrap();
        assert_eq!(v.round, 7);
        let got: Vec<_> = v.entries().map(|(g, d)| (g.0, d.len())).collect();
        assert_eq!(got, vec![(5, 2 + 1 + 8), (9, 0)]);
        assert!(decode_delta(b.payload(), 9)
            .unwrap_err()
            .contains("outside"));
        let p = b.payload();
        assert!(decode_delta(&p[..p.len() - 1], 10).is_err());
        let mut extra = p.to_vec();
        extra.push(0);
        assert!(decode_delta(&extra, 10).is_err());
    }

    proptest! {
        #[test]
        fn any_change_round_trips(
            changes in proptest::collection::vec((0usize..PAGE_SIZE, any::<u8>()), 0..64)
        ) {
            let old = page(9);
            let mut new = old.clone();
            for (at, v) in changes {
                new[at] = v;
            }
            let mut d = Vec::new();
            if encode(&old, &new, &mut d, usize::MAX) {
                let mut back = old.clone();
                apply(&mut back, &d).unwrap();
                prop_assert_eq!(back, new);
            }
        }
    }
}
