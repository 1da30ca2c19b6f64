//! The bitmap family: one bit per guest frame (or page-table entry), in
//! 64-bit words, frame 0 in bit 0 of word 0. Three kinds, by who writes:
//!
//! * [`DirtyPages`] is a plain bitmap over every guest frame, owned by one thread:
//!   what the engine holds between a harvest and the pages it sends.
//! * [`SharedDirtyBitmap`] is written concurrently (by vCPU threads, ring
//!   harvesters, or the soft MMU's write-fault path) and harvested with no MMU
//!   walk and no atomic read-modify-write per word (two banks, switched at
//!   harvest): the shared-bitmap half of the fast-write-protection seed.
//! * [`PageBits`] is a set that many threads add to and remove from at once,
//!   one atomic operation per frame: the destination's received and
//!   known-zero sets, filled by one receiver thread per data connection.

//!
//! [`ones`] walks the set bits of one word; every scan of a bitmap in ferry
//! (these sets, and the soft MMU's present and writable entry bitmaps) goes
//! through it.

use crate::types::Gfn;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The indices of the set bits of `word`, which is word `index` of its
/// bitmap, in ascending order.
#[inline]
pub fn ones(index: usize, word: u64) -> impl Iterator<Item = usize> {
    let mut bits = word;
    std::iter::from_fn(move || {
        if bits == 0 {
            return None;
        }
        let i = index * 64 + bits.trailing_zeros() as usize;
        bits &= bits - 1;
        Some(i)
    })
}

/// A set of guest frames that many threads change at once.
#[derive(Debug)]
pub struct PageBits {
    words: Vec<AtomicU64>,
    pages: u64,
}

impl PageBits {
    /// An empty set over `pages` frames.
    pub fn new(pages: u64) -> Self {
        PageBits {
            words: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            pages,
        }
    }

    /// The set of every frame.
    pub fn all(pages: u64) -> Self {
        let set = Self::new(pages);
        for g in 0..pages.div_ceil(64) {
            let rem = pages - g * 64;
            let word = if rem >= 64 { u64::MAX } else { (1 << rem) - 1 };
            set.words[g as usize].store(word, Ordering::Relaxed);
        }
        set
    }

    /// Number of frames the set ranges over.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    fn at(&self, gfn: Gfn) -> Option<(&AtomicU64, u64)> {
        (gfn.0 < self.pages).then(|| (&self.words[(gfn.0 / 64) as usize], 1 << (gfn.0 % 64)))
    }

    /// Adds `gfn`; returns whether it was new. Frames past the end are ignored.
    /// Release: whoever sees the frame in the set (with [`Self::contains`])
    /// also sees what was written before it was added, e.g. the page's
    /// contents when the set says which pages are present.
    pub fn insert(&self, gfn: Gfn) -> bool {
        self.at(gfn)
            .is_some_and(|(w, bit)| w.fetch_or(bit, Ordering::Release) & bit == 0)
    }

    /// Removes `gfn`.
    pub fn remove(&self, gfn: Gfn) {
        if let Some((w, bit)) = self.at(gfn) {
            w.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// Whether `gfn` is in the set (Acquire: see [`Self::insert`]).
    pub fn contains(&self, gfn: Gfn) -> bool {
        self.at(gfn)
            .is_some_and(|(w, bit)| w.load(Ordering::Acquire) & bit != 0)
    }

    /// Frames in the set.
    pub fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    /// The first frame in the set at or after `from`, if any.
    pub fn next_from(&self, from: Gfn) -> Option<Gfn> {
        if from.0 >= self.pages {
            return None;
        }
        let mut i = (from.0 / 64) as usize;
        let mut word = self.words[i].load(Ordering::Relaxed) & (u64::MAX << (from.0 % 64));
        loop {
            if word != 0 {
                return Some(Gfn(i as u64 * 64 + u64::from(word.trailing_zeros())));
            }
            i += 1;
            word = self.words.get(i)?.load(Ordering::Relaxed);
        }
    }

    /// Frames in the set, ascending (a snapshot word by word).
    pub fn iter(&self) -> impl Iterator<Item = Gfn> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(i, w)| ones(i, w.load(Ordering::Relaxed)).map(|g| Gfn(g as u64)))
    }
}

/// A set of guest frames, one bit per frame, frames numbered from 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirtyPages {
    words: Vec<u64>,
    pages: u64,
}

impl DirtyPages {
    /// An empty set over `pages` frames.
    pub fn new(pages: u64) -> Self {
        DirtyPages {
            words: vec![0; pages.div_ceil(64) as usize],
            pages,
        }
    }

    /// The set of every frame.
    pub fn all(pages: u64) -> Self {
        let mut set = Self::new(pages);
        set.words.iter_mut().for_each(|w| *w = u64::MAX);
        set.trim_tail();
        set
    }

    fn trim_tail(&mut self) {
        let rem = self.pages % 64;
        if rem != 0 {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u64 << rem) - 1;
            }
        }
    }

    /// Number of frames the set ranges over.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Adds `gfn`. Frames past the end are ignored, so a bogus frame reported by a
    /// dirty ring cannot grow the set.
    pub fn set(&mut self, gfn: Gfn) {
        if gfn.0 < self.pages {
            self.words[(gfn.0 / 64) as usize] |= 1 << (gfn.0 % 64);
        }
    }

    /// Whether `gfn` is in the set.
    pub fn contains(&self, gfn: Gfn) -> bool {
        gfn.0 < self.pages && self.words[(gfn.0 / 64) as usize] & (1 << (gfn.0 % 64)) != 0
    }

    /// ORs in a bitmap whose bit 0 is frame `first` (KVM's per-slot log layout).
    /// `first` must be a multiple of 64, as every slot base in ferry's layouts is.
    pub fn merge_words(&mut self, first: Gfn, words: &[u64]) {
        assert_eq!(first.0 % 64, 0, "slot base {first} is not 64-frame aligned");
        let base = (first.0 / 64) as usize;
        for (dst, src) in self.words[base..].iter_mut().zip(words) {
            *dst |= *src;
        }
        self.trim_tail();
    }

    /// ORs in another set of the same size.
    pub fn merge(&mut self, other: &DirtyPages) {
        self.merge_words(Gfn(0), &other.words);
    }

    /// Number of frames in the set.
    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// Empties the set.
    pub fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }

    /// The raw words, frame 0 in bit 0 of word 0.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Frames in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = Gfn> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(i, &w)| ones(i, w).map(|g| Gfn(g as u64)))
    }

    /// Runs of consecutive frames as `(first, count)`, ascending. Used to batch
    /// page copies.
    pub fn runs(&self) -> Vec<(Gfn, u64)> {
        let mut runs: Vec<(Gfn, u64)> = Vec::new();
        for gfn in self.iter() {
            match runs.last_mut() {
                Some((first, len)) if first.0 + *len == gfn.0 => *len += 1,
                _ => runs.push((gfn, 1)),
            }
        }
        runs
    }
}

/// A dirty bitmap shared between writers and a harvester, double-buffered.
///
/// Writers set bits in the *active* bank with `fetch_or`. A harvest flips the
/// active bank with one store, waits until no writer is still inside the old
/// bank, then reads and clears the old bank with plain loads and stores: no
/// atomic read-modify-write per word, which is what made the single-bank
/// exchange (one `xchg` per 64 frames) the bottleneck. This is the "double
/// dirty bitmaps switched during fetching" the fast-write-protection seed
/// proposes instead of `xchg`.
///
/// The hand-off is Dekker-style, all `SeqCst`: a writer announces itself in
/// the bank's writer count, then re-checks the active bank; the harvester
/// flips the bank, then reads the old bank's writer count. Either the writer
/// sees the flip (and retries on the new bank) or the harvester sees the
/// writer (and waits for it), so a bit is never set in a bank already read.
#[derive(Debug)]
pub struct SharedDirtyBitmap {
    banks: [Vec<AtomicU64>; 2],
    writers: [AtomicU64; 2],
    active: AtomicUsize,
    harvest: Mutex<()>,
    pages: u64,
}

impl SharedDirtyBitmap {
    /// An empty bitmap over `pages` frames.
    pub fn new(pages: u64) -> Self {
        let bank = || (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        SharedDirtyBitmap {
            banks: [bank(), bank()],
            writers: [AtomicU64::new(0), AtomicU64::new(0)],
            active: AtomicUsize::new(0),
            harvest: Mutex::new(()),
            pages,
        }
    }

    /// Number of frames covered.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Marks `gfn` dirty. Returns true if it was clean since the last harvest.
    #[inline]
    pub fn mark(&self, gfn: Gfn) -> bool {
        if gfn.0 >= self.pages {
            return false;
        }
        let bit = 1u64 << (gfn.0 % 64);
        let word = (gfn.0 / 64) as usize;
        loop {
            let bank = self.active.load(Ordering::SeqCst);
            self.writers[bank].fetch_add(1, Ordering::SeqCst);
            if self.active.load(Ordering::SeqCst) == bank {
                let old = self.banks[bank][word].fetch_or(bit, Ordering::AcqRel);
                self.writers[bank].fetch_sub(1, Ordering::Release);
                return old & bit == 0;
            }
            // A harvest flipped the bank under us: leave it, use the new one.
            self.writers[bank].fetch_sub(1, Ordering::Release);
        }
    }

    /// Whether `gfn` is marked and not yet harvested.
    pub fn is_marked(&self, gfn: Gfn) -> bool {
        if gfn.0 >= self.pages {
            return false;
        }
        let bank = self.active.load(Ordering::SeqCst);
        self.banks[bank][(gfn.0 / 64) as usize].load(Ordering::Acquire) & (1 << (gfn.0 % 64)) != 0
    }

    /// Moves every marked frame into `into` and clears the bitmap. Returns the
    /// number of frames harvested. Concurrent harvests are serialized.
    pub fn harvest_into(&self, into: &mut DirtyPages) -> u64 {
        assert_eq!(into.pages, self.pages, "harvest into a set of another size");
        let _one_harvester = self.harvest.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.active.load(Ordering::SeqCst);
        self.active.store(1 - old, Ordering::SeqCst);
        let mut spins = 0u32;
        while self.writers[old].load(Ordering::SeqCst) != 0 {
            // A writer descheduled mid-mark holds us up; let it run.
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // No writer can touch the old bank now: plain loads and stores.
        let mut count = 0;
        for (dst, src) in into.words.iter_mut().zip(&self.banks[old]) {
            let bits = src.load(Ordering::Relaxed);
            if bits != 0 {
                src.store(0, Ordering::Relaxed);
                count += u64::from(bits.count_ones());
                *dst |= bits;
            }
        }
        // Order the clearing stores before the bank is handed back to writers
        // by the next flip (which is SeqCst, after this fence).
        std::sync::atomic::fence(Ordering::Release);
        count
    }

    /// Clears every bit.
    pub fn clear(&self) {
        let _one_harvester = self.harvest.lock().unwrap_or_else(|e| e.into_inner());
        for bank in &self.banks {
            bank.iter().for_each(|w| w.store(0, Ordering::Release));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn next_from_finds_the_next_member() {
        let bits = PageBits::new(200);
        assert_eq!(bits.next_from(Gfn(0)), None);
        bits.insert(Gfn(5));
        bits.insert(Gfn(130));
        assert_eq!(bits.next_from(Gfn(0)), Some(Gfn(5)));
        assert_eq!(bits.next_from(Gfn(5)), Some(Gfn(5)));
        assert_eq!(bits.next_from(Gfn(6)), Some(Gfn(130)));
        assert_eq!(bits.next_from(Gfn(131)), None);
        assert_eq!(bits.next_from(Gfn(999)), None);
    }

    #[test]
    fn page_bits_from_many_threads() {
        let bits = std::sync::Arc::new(PageBits::new(1000));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let bits = std::sync::Arc::clone(&bits);
                std::thread::spawn(move || {
                    (t..1000)
                        .step_by(4)
                        .filter(|&g| bits.insert(Gfn(g)))
                        .count()
                })
            })
            .collect();
        let new: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(new, 1000);
        assert_eq!(bits.count(), 1000);
        assert!(!bits.insert(Gfn(5)), "already there");
        bits.remove(Gfn(5));
        assert!(!bits.contains(Gfn(5)));
        assert!(!bits.insert(Gfn(1000)), "past the end is ignored");
        assert_eq!(PageBits::all(70).count(), 70);
        assert_eq!(PageBits::all(70).iter().last(), Some(Gfn(69)));
        assert_eq!(bits.iter().count(), 999);
        let all = PageBits::all(70);
        assert!(all.contains(Gfn(69)) && !all.contains(Gfn(70)));
    }

    use super::*;
    use std::sync::Arc;

    #[test]
    fn set_count_iter() {
        let mut d = DirtyPages::new(130);
        for g in [0, 5, 63, 64, 129, 500] {
            d.set(Gfn(g));
        }
        assert_eq!(d.count(), 5);
        let v: Vec<u64> = d.iter().map(|g| g.0).collect();
        assert_eq!(v, vec![0, 5, 63, 64, 129]);
        assert!(d.contains(Gfn(129)) && !d.contains(Gfn(128)));
    }

    #[test]
    fn all_is_trimmed() {
        let d = DirtyPages::all(70);
        assert_eq!(d.count(), 70);
        assert_eq!(d.iter().last(), Some(Gfn(69)));
    }

    #[test]
    fn runs_group_consecutive_frames() {
        let mut d = DirtyPages::new(256);
        for g in [1, 2, 3, 10, 63, 64, 65] {
            d.set(Gfn(g));
        }
        assert_eq!(d.runs(), vec![(Gfn(1), 3), (Gfn(10), 1), (Gfn(63), 3)]);
    }

    #[test]
    fn merge_words_at_slot_base() {
        let mut d = DirtyPages::new(256);
        d.merge_words(Gfn(128), &[0b101, 1]);
        let v: Vec<u64> = d.iter().map(|g| g.0).collect();
        assert_eq!(v, vec![128, 130, 192]);
    }

    #[test]
    fn shared_bitmap_loses_nothing_under_concurrent_harvest() {
        let pages = 1 << 16;
        let shared = Arc::new(SharedDirtyBitmap::new(pages));
        let writers: Vec<_> = (0..2)
            .map(|t| {
                let s = Arc::clone(&shared);
                std::thread::spawn(move || {
                    for g in (t..pages).step_by(2) {
                        s.mark(Gfn(g));
                    }
                })
            })
            .collect();
        let mut seen = DirtyPages::new(pages);
        while !writers.iter().all(|w| w.is_finished()) {
            shared.harvest_into(&mut seen);
        }
        for w in writers {
            w.join().unwrap();
        }
        shared.harvest_into(&mut seen);
        assert_eq!(seen.count(), pages);
    }
}
