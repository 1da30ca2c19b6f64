//! Page batches: how guest memory travels.
//!
//! A batch holds up to [`MAX_BATCH_PAGES`] pages taken from one or more runs
//! of consecutive frames, so a scattered dirty set still goes out in large
//! frames. Zero pages travel as one bit in the zero bitmap and no data: an
//! idle guest's first pass is then mostly bitmap, and the destination need not
//! even touch those pages (`ferry_vm::is_zero_page` tells them).

use ferry_vm::{is_zero_page, Gfn, PAGE_SIZE};

/// Most pages in one batch (16 MiB of data; the frame limit leaves room).
pub const MAX_BATCH_PAGES: usize = 4096;
const RUN_BYTES: usize = 12;

/// A batch being assembled by the source.
pub struct PageBatch {
    cap: usize,
    runs: Vec<(Gfn, u32)>,
    data: Vec<u8>,
    pages: usize,
    head: Vec<u8>,
    data_pages: usize,
    zero_pages: usize,
}

impl PageBatch {
    /// An empty batch of at most `cap_pages` pages (clamped to 1..=MAX_BATCH_PAGES).
    pub fn new(cap_pages: usize) -> Self {
        let cap = cap_pages.clamp(1, MAX_BATCH_PAGES);
        PageBatch {
            cap,
            runs: Vec::new(),
            data: vec![0; cap * PAGE_SIZE],
            pages: 0,
            head: Vec::new(),
            data_pages: 0,
            zero_pages: 0,
        }
    }

    /// Pages the batch can hold.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Pages in the batch.
    pub fn len(&self) -> usize {
        self.pages
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// Pages that still fit.
    pub fn room(&self) -> usize {
        self.cap - self.pages
    }

    /// Zero pages found by [`Self::seal`].
    pub fn zero_pages(&self) -> usize {
        self.zero_pages
    }

    /// Adds `pages` frames from `first` (at most [`Self::room`]) and returns
    /// the buffer their contents must be copied into.
    pub fn push_run(&mut self, first: Gfn, pages: usize) -> &mut [u8] {
        let pages = pages.min(self.room());
        match self.runs.last_mut() {
            Some((start, n)) if start.0 + u64::from(*n) == first.0 => *n += pages as u32,
            _ => self.runs.push((first, pages as u32)),
        }
        let at = self.pages * PAGE_SIZE;
        self.pages += pages;
        &mut self.data[at..self.pages * PAGE_SIZE]
    }

    /// Finds zero pages, builds the round, run table and bitmap, and packs
    /// the non-zero pages to the front of the data buffer.
    pub fn seal(&mut self, round: u32) {
        let mut zero = Vec::with_capacity(self.pages);
        let mut out = 0;
        for i in 0..self.pages {
            let at = i * PAGE_SIZE;
            let z = is_zero_page(&self.data[at..at + PAGE_SIZE]);
            if !z {
                if out != i {
                    self.data.copy_within(at..at + PAGE_SIZE, out * PAGE_SIZE);
                }
                out += 1;
            }
            zero.push(z);
        }
        self.data_pages = out;
        self.write_head(round, &zero);
    }

    /// The round of a sealed batch.
    pub fn round(&self) -> u32 {
        u32::from_le_bytes([self.head[0], self.head[1], self.head[2], self.head[3]])
    }

    /// Round, run table and zero bitmap for the current runs.
    fn write_head(&mut self, round: u32, zero: &[bool]) {
        self.head.clear();
        self.head.extend_from_slice(&round.to_le_bytes());
        self.head
            .extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        for (gfn, n) in &self.runs {
            self.head.extend_from_slice(&gfn.0.to_le_bytes());
            self.head.extend_from_slice(&n.to_le_bytes());
        }
        let bitmap_at = self.head.len();
        self.head.resize(bitmap_at + zero.len().div_ceil(8), 0);
        for (i, _) in zero.iter().enumerate().filter(|(_, &z)| z) {
            self.head[bitmap_at + i / 8] |= 1 << (i % 8);
        }
        self.zero_pages = zero.iter().filter(|&&z| z).count();
    }

    /// Calls `keep` with every page of a sealed batch, in order (`None` for
    /// a zero page), drops the pages it returns false for, and seals again.
    pub fn retain(&mut self, mut keep: impl FnMut(Gfn, Option<&[u8]>) -> bool) {
        let round = self.round();
        let bitmap_at = 8 + self.runs.len() * RUN_BYTES;
        let bitmap = self.head[bitmap_at..].to_vec();
        let old_runs = std::mem::take(&mut self.runs);
        let mut zero = Vec::with_capacity(self.pages);
        let (mut index, mut data_in, mut data_out) = (0usize, 0usize, 0usize);
        for (first, n) in old_runs {
            for k in 0..u64::from(n) {
                let gfn = Gfn(first.0 + k);
                let z = bitmap[index / 8] & (1 << (index % 8)) != 0;
                index += 1;
                let at = (!z).then(|| {
                    data_in += 1;
                    (data_in - 1) * PAGE_SIZE
                });
                if !keep(gfn, at.map(|a| &self.data[a..a + PAGE_SIZE])) {
                    continue;
                }
                match self.runs.last_mut() {
                    Some((start, len)) if start.0 + u64::from(*len) == gfn.0 => *len += 1,
                    _ => self.runs.push((gfn, 1)),
                }
                zero.push(z);
                if let Some(a) = at {
                    if a != data_out * PAGE_SIZE {
                        self.data
                            .copy_within(a..a + PAGE_SIZE, data_out * PAGE_SIZE);
                    }
                    data_out += 1;
                }
            }
        }
        self.pages = zero.len();
        self.data_pages = data_out;
        self.write_head(round, &zero);
    }

    /// Bytes of the sealed payload.
    pub fn payload_len(&self) -> usize {
        self.head.len() + self.data_pages * PAGE_SIZE
    }

    /// The sealed payload as two parts: round, run table and bitmap, then
    /// page data.
    pub fn parts(&self) -> [&[u8]; 2] {
        [&self.head, &self.data[..self.data_pages * PAGE_SIZE]]
    }

    /// Empties the batch for reuse.
    pub fn clear(&mut self) {
        self.runs.clear();
        self.pages = 0;
        self.data_pages = 0;
        self.zero_pages = 0;
        self.head.clear();
    }
}

/// A piece of a received batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Segment<'a> {
    /// A zero page.
    Zero(Gfn),
    /// Consecutive non-zero pages starting at `first`.
    Data {
        /// First frame.
        first: Gfn,
        /// Their contents, a multiple of the page size.
        bytes: &'a [u8],
    },
}

impl Segment<'_> {
    /// The first frame and how many pages the segment covers.
    pub fn range(&self) -> (Gfn, u64) {
        match self {
            Segment::Zero(g) => (*g, 1),
            Segment::Data { first, bytes } => (*first, (bytes.len() / PAGE_SIZE) as u64),
        }
    }
}

/// A received, validated batch.
#[derive(Debug)]
pub struct BatchView<'a> {
    /// The precopy round the batch belongs to.
    pub round: u32,
    runs: Vec<(Gfn, u32)>,
    bitmap: &'a [u8],
    data: &'a [u8],
    pages: usize,
    /// The xxh3 of each non-zero page, in payload order, where the frame's
    /// check already computed them.
    data_hashes: Option<&'a [u64]>,
}

impl<'a> BatchView<'a> {
    /// Takes the page hashes the frame check computed
    /// ([`super::FrameStream::page_hashes`]: the last of them are the
    /// pages'), so that the pages need not be hashed again.
    pub fn with_page_hashes(mut self, chunk_hashes: Option<&'a [u64]>) -> Self {
        let data_pages = self.data.len() / PAGE_SIZE;
        self.data_hashes = chunk_hashes
            .filter(|h| h.len() >= data_pages)
            .map(|h| &h[h.len() - data_pages..]);
        self
    }

    /// The hash of the `k`th non-zero page in payload order, if the frame
    /// check computed it.
    pub fn data_page_hash(&self, k: usize) -> Option<u64> {
        self.data_hashes.and_then(|h| h.get(k).copied())
    }

    /// Pages in the batch.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Zero pages in the batch.
    pub fn zero_pages(&self) -> usize {
        self.pages - self.data.len() / PAGE_SIZE
    }

    fn is_zero(&self, i: usize) -> bool {
        self.bitmap[i / 8] & (1 << (i % 8)) != 0
    }

    /// Calls `f` with every zero page and every stretch of consecutive
    /// non-zero pages, in stream order.
    pub fn visit<E>(&self, mut f: impl FnMut(Segment<'a>) -> Result<(), E>) -> Result<(), E> {
        let (mut index, mut data_at) = (0usize, 0usize);
        for &(first, n) in &self.runs {
            let mut k = 0u64;
            while k < u64::from(n) {
                if self.is_zero(index) {
                    f(Segment::Zero(Gfn(first.0 + k)))?;
                    index += 1;
                    k += 1;
                    continue;
                }
                let start = k;
                while k < u64::from(n) && !self.is_zero(index) {
                    index += 1;
                    k += 1;
                }
                let len = (k - start) as usize * PAGE_SIZE;
                let bytes = &self.data[data_at..data_at + len];
                data_at += len;
                f(Segment::Data {
                    first: Gfn(first.0 + start),
                    bytes,
                })?;
            }
        }
        Ok(())
    }
}

/// Parses and validates a Pages payload against a guest of `total_pages`.
/// The error is a reason; the caller adds frame type and offset.
pub fn decode_batch(payload: &[u8], total_pages: u64) -> Result<BatchView<'_>, String> {
    const HEAD: usize = 8;
    if payload.len() < HEAD {
        return Err("too short for a round and a run count".into());
    }
    let round = super::bytes::u32_at(payload, 0);
    let run_count = super::bytes::u32_at(payload, 4) as usize;
    if run_count == 0 || run_count > MAX_BATCH_PAGES {
        return Err(format!("run count {run_count} is out of range"));
    }
    let table_end = HEAD + run_count * RUN_BYTES;
    if payload.len() < table_end {
        return Err(format!("too short for {run_count} runs"));
    }
    let mut runs = Vec::with_capacity(run_count);
    let mut pages = 0usize;
    for r in 0..run_count {
        let at = HEAD + r * RUN_BYTES;
        let first = super::bytes::u64_at(payload, at);
        let n = super::bytes::u32_at(payload, at + 8);
        let end = first.checked_add(u64::from(n));
        if n == 0 || !matches!(end, Some(e) if e <= total_pages) {
            return Err(format!(
                "run of {n} pages at gfn {first:#x} is outside the guest's {total_pages} pages"
            ));
        }
        pages += n as usize;
        if pages > MAX_BATCH_PAGES {
            return Err(format!("more than {MAX_BATCH_PAGES} pages in one batch"));
        }
        runs.push((Gfn(first), n));
    }
    let bitmap_end = table_end + pages.div_ceil(8);
    let bitmap = payload
        .get(table_end..bitmap_end)
        .ok_or("too short for its zero bitmap")?;
    let zeros: usize = (0..pages)
        .filter(|i| bitmap[i / 8] & (1 << (i % 8)) != 0)
        .count();
    let data = &payload[bitmap_end..];
    let expected = (pages - zeros) * PAGE_SIZE;
    if data.len() != expected {
        return Err(format!(
            "{} bytes of page data for {} non-zero pages (expected {expected})",
            data.len(),
            pages - zeros
        ));
    }
    Ok(BatchView {
        round,
        runs,
        bitmap,
        data,
        pages,
        data_hashes: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(batch: &PageBatch) -> Vec<u8> {
        batch.parts().concat()
    }

    #[test]
    fn batch_round_trip_with_zero_pages_and_runs() {
        let mut b = PageBatch::new(8);
        b.push_run(Gfn(10), 3)
            .copy_from_slice(&[[1u8; PAGE_SIZE], [0; PAGE_SIZE], [3; PAGE_SIZE]].concat());
        b.push_run(Gfn(13), 1).fill(4); // merges with the run before
        b.push_run(Gfn(40), 2).fill(0);
        assert_eq!(b.room(), 2);
        b.seal(5);
        assert_eq!(b.zero_pages(), 3);
        let bytes = payload(&b);
        let view = decode_batch(&bytes, 64).unwrap();
        assert_eq!(view.pages(), 6);
        assert_eq!(view.round, 5);
        assert_eq!(bytes.len(), b.payload_len());
        let mut seen = Vec::new();
        view.visit(|s| {
            seen.push(match s {
                Segment::Zero(g) => (g.0, 0, 0),
                Segment::Data { first, bytes } => (first.0, bytes.len() / PAGE_SIZE, bytes[0]),
            });
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(
            seen,
            vec![(10, 1, 1), (11, 0, 0), (12, 2, 3), (40, 0, 0), (41, 0, 0)]
        );
    }

    #[test]
    fn retain_drops_pages_and_reseals() {
        let mut b = PageBatch::new(8);
        b.push_run(Gfn(10), 4).copy_from_slice(
            &[
                [1u8; PAGE_SIZE],
                [0; PAGE_SIZE],
                [3; PAGE_SIZE],
                [4; PAGE_SIZE],
            ]
            .concat(),
        );
        b.push_run(Gfn(20), 1).fill(5);
        b.seal(3);
        let mut seen = Vec::new();
        b.retain(|g, page| {
            seen.push((g.0, page.map(|p| p[0])));
            g.0 != 12 && g.0 != 10
        });
        assert_eq!(
            seen,
            vec![
                (10, Some(1)),
                (11, None),
                (12, Some(3)),
                (13, Some(4)),
                (20, Some(5))
            ]
        );
        assert_eq!((b.len(), b.zero_pages()), (3, 1));
        let bytes = payload(&b);
        let view = decode_batch(&bytes, 64).unwrap();
        assert_eq!(view.round, 3);
        let mut got = Vec::new();
        view.visit(|s| {
            match s {
                Segment::Zero(g) => got.push((g.0, 0)),
                Segment::Data { first, bytes } => {
                    for (i, p) in bytes.chunks(PAGE_SIZE).enumerate() {
                        got.push((first.0 + i as u64, p[0]));
                    }
                }
            }
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(got, vec![(11, 0), (13, 4), (20, 5)]);
    }

    #[test]
    fn batch_outside_guest_or_with_bad_lengths_is_refused() {
        let mut b = PageBatch::new(4);
        b.push_run(Gfn(62), 2).fill(1);
        b.seal(0);
        let bytes = payload(&b);
        assert!(decode_batch(&bytes, 64).is_ok());
        assert!(decode_batch(&bytes, 63).unwrap_err().contains("outside"));
        assert!(decode_batch(&bytes[..bytes.len() - 1], 64).is_err());
        assert!(decode_batch(&[0, 0, 0, 0, 0, 0, 0, 0], 64).is_err());
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_batch(&huge, 64).is_err());
    }
}
