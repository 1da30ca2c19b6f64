//! Page tables and the arena that holds them.
//!
//! Tables live in one arena allocated up front and are named by a `u32` index
//! instead of a pointer. The arena's size is the most tables the guest-physical
//! range can ever need (one per aligned range per level, plus slack for faults
//! that lose an install race), so it never grows and a table index stays valid
//! for the life of the MMU. A walker never sees a table reused under it:
//! a zap unlinks tables under the exclusive lock but returns them to the arena
//! only after the remote flush that follows, which every vCPU acknowledges
//! between walks; a table that lost an install race was never published.
//!
//! Per-table metadata, as in the TDP MMU plus the fast-write-protection seed:
//!
//! ```text
//!  entries[512]        AtomicU64 page-table entries (see pte.rs)
//!  present_bits[8]     one bit per present entry: the present-only iterator
//!                      jumps from one set bit to the next
//!  writable_bits[8]    "possibly writable": every writable leaf has its bit
//!  writable            count of set writable bits
//!  wp_gen              write-protect generation the table was last synced to
//!  lock                serialises lazy write-protect with writable installs
//! ```

use crate::pte::{self, ENTRIES};
use ferry_vm::bitmap::ones;
use std::alloc::Layout;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

const WORDS: usize = ENTRIES / 64;

/// One page table. All fields are atomics, so all-zero bytes are a valid empty
/// table (the arena relies on that).
#[repr(C, align(64))]
pub struct Table {
    /// The entries.
    pub entries: [AtomicU64; ENTRIES],
    present_bits: [AtomicU64; WORDS],
    writable_bits: [AtomicU64; WORDS],
    present: AtomicU32,
    writable: AtomicU32,
    level: AtomicU8,
    lock: AtomicBool,
    base_gfn: AtomicU64,
    /// Write-protect generation this table was last synced to.
    pub wp_gen: AtomicU64,
}

impl Table {
    /// Level (1 = holds 4 KiB leaves, 4 = root).
    #[inline]
    pub fn level(&self) -> u8 {
        self.level.load(Ordering::Relaxed)
    }

    /// First frame covered.
    #[inline]
    pub fn base_gfn(&self) -> u64 {
        self.base_gfn.load(Ordering::Relaxed)
    }

    /// Number of present entries.
    pub fn present_count(&self) -> u32 {
        self.present.load(Ordering::Acquire)
    }

    /// Number of possibly-writable entries.
    pub fn writable_count(&self) -> u32 {
        self.writable.load(Ordering::Acquire)
    }

    /// Word `w` of the present bitmap.
    #[inline]
    pub fn present_word(&self, w: usize) -> u64 {
        self.present_bits[w].load(Ordering::Acquire)
    }

    /// Installs `new` in an empty entry. Fails (returning the current value) if
    /// the entry is not empty any more.
    pub fn install(&self, i: usize, new: u64) -> Result<(), u64> {
        self.entries[i].compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire)?;
        self.present_bits[i / 64].fetch_or(1 << (i % 64), Ordering::AcqRel);
        self.present.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Clears a present entry; returns its old value. The caller must have
    /// excluded concurrent writers of this entry (exclusive lock or FROZEN).
    pub fn clear(&self, i: usize) -> u64 {
        let old = self.entries[i].swap(0, Ordering::AcqRel);
        if pte::is_present(old) || old == pte::FROZEN {
            self.present_bits[i / 64].fetch_and(!(1 << (i % 64)), Ordering::AcqRel);
            self.present.fetch_sub(1, Ordering::AcqRel);
        }
        self.forget_writable(i);
        old
    }

    /// Records that entry `i` may become writable. Must precede setting
    /// `WRITABLE` in the entry, under [`Table::lock`].
    pub fn note_writable(&self, i: usize) {
        let bit = 1u64 << (i % 64);
        if self.writable_bits[i / 64].fetch_or(bit, Ordering::AcqRel) & bit == 0 {
            self.writable.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Drops entry `i` from the possibly-writable bitmap (its entry was just
    /// write-protected by a walk).
    pub fn forget_writable(&self, i: usize) {
        let bit = 1u64 << (i % 64);
        if self.writable_bits[i / 64].load(Ordering::Acquire) & bit != 0
            && self.writable_bits[i / 64].fetch_and(!bit, Ordering::AcqRel) & bit != 0
        {
            self.writable.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Takes the table's write-protect lock (a spin lock: it is held for at
    /// most one table's worth of bit clearing).
    pub fn lock(&self) -> TableGuard<'_> {
        let mut spins = 0u32;
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            crate::spin::back_off(&mut spins, 64);
        }
        TableGuard(self)
    }

    /// Clears `WRITABLE` in every possibly-writable entry, using the bitmap
    /// so clean entries are never touched. Returns how many entries it visited.
    /// Caller holds [`Table::lock`], or no fault can reach the table any more
    /// (a zap retiring it): each bitmap word is taken by exchange, so a
    /// concurrent lock-free sync and a retire clear and count every bit once.
    pub fn write_protect_possibly_writable(&self) -> u64 {
        let mut visited = 0;
        for w in 0..WORDS {
            // A plain load first: most words of a table are clean, and an
            // exchange would take the cache line for nothing.
            if self.writable_bits[w].load(Ordering::Acquire) == 0 {
                continue;
            }
            let bits = self.writable_bits[w].swap(0, Ordering::AcqRel);
            self.writable.fetch_sub(bits.count_ones(), Ordering::AcqRel);
            for i in ones(w, bits) {
                self.entries[i].fetch_and(!pte::WRITABLE, Ordering::AcqRel);
                visited += 1;
            }
        }
        visited
    }

    /// Present entry indices in ascending order, from the present bitmap.
    pub fn present_indices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..WORDS).flat_map(move |w| ones(w, self.present_word(w)))
    }
}

/// Holds a table's write-protect lock.
pub struct TableGuard<'a>(&'a Table);

impl Drop for TableGuard<'_> {
    fn drop(&mut self) {
        self.0.lock.store(false, Ordering::Release);
    }
}

/// Errors of the arena.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArenaError {
    /// Every table is in use; the bound computed from the guest size was wrong.
    #[error("page-table arena of {0} tables is exhausted")]
    Exhausted(u32),
}

/// All tables of one MMU.
pub struct Arena {
    tables: Box<[Table]>,
    next: AtomicU32,
    free: Mutex<Vec<u32>>,
    in_use: AtomicU32,
}

impl Arena {
    /// An arena big enough for every table a guest of `frames` frames can
    /// need, plus `slack` for tables allocated by racing faults.
    pub fn for_frames(frames: u64, slack: u32) -> Self {
        let mut count = 1u64; // root
        for level in 1..pte::ROOT_LEVEL {
            count += frames.div_ceil(pte::frames_per_entry(level + 1)) + 1;
        }
        Self::with_capacity(count as u32 + slack)
    }

    fn with_capacity(capacity: u32) -> Self {
        let layout = Layout::array::<Table>(capacity as usize).expect("arena layout fits");
        let tables = if capacity == 0 {
            Vec::new().into_boxed_slice()
        } else {
            // Large zeroed allocations come from mmap, so untouched tables
            // cost no memory. The layout has non-zero size.
            // SAFETY: every field of `Table` is an atomic or bool, valid as all
            // zero bytes, so this is `capacity` valid tables; the Box takes
            // ownership and frees it with the same layout.
            unsafe {
                let ptr = std::alloc::alloc_zeroed(layout).cast::<Table>();
                if ptr.is_null() {
                    std::alloc::handle_alloc_error(layout);
                }
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, capacity as usize))
            }
        };
        Arena {
            tables,
            next: AtomicU32::new(0),
            free: Mutex::new(Vec::new()),
            in_use: AtomicU32::new(0),
        }
    }

    /// The table with index `i`.
    #[inline]
    pub fn get(&self, i: u32) -> &Table {
        &self.tables[i as usize]
    }

    /// Tables the arena can hold.
    pub fn capacity(&self) -> u32 {
        self.tables.len() as u32
    }

    /// Tables currently allocated.
    pub fn in_use(&self) -> u32 {
        self.in_use.load(Ordering::Acquire)
    }

    /// Allocates an empty table at `level` covering frames from `base_gfn`,
    /// synced to write-protect generation `gen`.
    pub fn alloc(&self, level: u8, base_gfn: u64, gen: u64) -> Result<u32, ArenaError> {
        let popped = self.free.lock().expect("arena free list").pop();
        let i = match popped {
            Some(i) => i,
            None => {
                let i = self.next.fetch_add(1, Ordering::AcqRel);
                if i >= self.capacity() {
                    self.next.fetch_sub(1, Ordering::AcqRel);
                    return Err(ArenaError::Exhausted(self.capacity()));
                }
                i
            }
        };
        let t = self.get(i);
        t.level.store(level, Ordering::Relaxed);
        t.base_gfn.store(base_gfn, Ordering::Relaxed);
        t.wp_gen.store(gen, Ordering::Release);
        self.in_use.fetch_add(1, Ordering::AcqRel);
        Ok(i)
    }

    /// Returns an empty table to the arena. The table must not be reachable.
    pub fn free(&self, i: u32) {
        self.free_all(std::iter::once(i));
    }

    /// Returns empty tables to the arena under one lock of the free list.
    /// The tables must not be reachable.
    pub fn free_all(&self, tables: impl IntoIterator<Item = u32>) {
        let mut free = self.free.lock().expect("arena free list");
        let before = free.len();
        for i in tables {
            let t = self.get(i);
            debug_assert_eq!(t.present_count(), 0, "freeing a table with present entries");
            debug_assert_eq!(t.writable_count(), 0);
            free.push(i);
        }
        self.in_use
            .fetch_sub((free.len() - before) as u32, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_and_clear_track_bitmaps() {
        let arena = Arena::for_frames(1 << 20, 4);
        let i = arena.alloc(1, 0, 0).unwrap();
        let t = arena.get(i);
        t.install(3, pte::leaf(3, 1, false)).unwrap();
        t.install(300, pte::leaf(300, 1, false)).unwrap();
        assert!(t.install(3, pte::leaf(3, 1, false)).is_err());
        assert_eq!(t.present_indices().collect::<Vec<_>>(), vec![3, 300]);
        {
            let _g = t.lock();
            t.note_writable(300);
            t.entries[300].fetch_or(pte::WRITABLE, Ordering::AcqRel);
            assert_eq!(t.writable_count(), 1);
            assert_eq!(t.write_protect_possibly_writable(), 1);
        }
        assert!(!pte::is_writable(t.entries[300].load(Ordering::Acquire)));
        t.clear(3);
        t.clear(300);
        assert_eq!(t.present_count(), 0);
        arena.free(i);
        assert_eq!(arena.alloc(2, 512, 1).unwrap(), i, "freed table is reused");
    }

    #[test]
    fn arena_bound_is_enforced() {
        let arena = Arena::with_capacity(2);
        arena.alloc(4, 0, 0).unwrap();
        arena.alloc(3, 0, 0).unwrap();
        assert_eq!(arena.alloc(2, 0, 0), Err(ArenaError::Exhausted(2)));
    }
}
