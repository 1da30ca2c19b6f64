//! Whole-tree MMU operations: zap, eager split, write-protect-all, and the
//! dirty-log life cycle built from them.
//!
//! Each runs the one iterator of iter.rs, so the iteration switch
//! (present-only vs full scan) applies to all of them, and each issues its
//! remote TLB flush only after dropping the exclusive lock.

use crate::config::{Iteration, SplitMode, WriteProtect};
use crate::error::SoftError;
use crate::iter::{Next, Walker};
use crate::mmu::Mmu;
use crate::pte::{self, ROOT_LEVEL};
use ferry_vm::bitmap::ones;
use ferry_vm::DirtyPages;
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What a tree operation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WalkStats {
    /// Iterator loop steps.
    pub steps: u64,
    /// Tables entered by the iterator.
    pub tables: u64,
    /// Entries changed (zapped, split or protected).
    pub changed: u64,
    /// Steps that landed on a non-present entry.
    pub empty_steps: u64,
}

impl WalkStats {
    fn add(&mut self, w: &Walker<'_>, changed: u64) {
        self.steps += w.steps;
        self.tables += w.tables;
        self.empty_steps += w.empty_steps;
        self.changed += changed;
    }
}

/// Timing of one harvest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HarvestTiming {
    /// Frames harvested.
    pub pages: u64,
    /// Nanoseconds taking the bitmap (atomic exchange).
    pub get_ns: u64,
    /// Nanoseconds write-protecting (and chunked splitting).
    pub protect_ns: u64,
}

impl Mmu {
    fn walker(&self) -> Walker<'_> {
        Walker::new(&self.arena, self.mech.iteration)
    }

    /// Empties the subtree under table `t` (which must be unreachable),
    /// clearing only its present entries, and collects its tables into
    /// `retired`. They go back to the arena only after the remote flush that
    /// follows (see [`Mmu::free_retired`]), because a vCPU's lock-free walk may
    /// still be reading them until it acknowledges that flush.
    fn retire_subtree(&self, t: u32, retired: &mut Vec<u32>) {
        let table = self.arena.get(t);
        let level = table.level();
        for w in 0..pte::ENTRIES / 64 {
            for i in ones(w, table.present_word(w)) {
                let old = table.clear(i);
                if pte::is_present(old) && !pte::is_leaf(old, level) {
                    self.retire_subtree(pte::child(old), retired);
                }
            }
        }
        // No table lock needed on an unlinked table (see the method's doc).
        table.write_protect_possibly_writable();
        retired.push(t);
    }

    fn zap_entry(&self, table: &crate::table::Table, i: usize, level: u8, retired: &mut Vec<u32>) {
        let old = table.clear(i);
        if pte::is_present(old) && !pte::is_leaf(old, level) {
            self.retire_subtree(pte::child(old), retired);
        }
    }

    /// Returns retired tables to the arena. Call only after a remote flush
    /// issued after they became unreachable: every vCPU has then passed an
    /// access boundary, so no walk still holds them (the flush is the grace
    /// period, as RCU is for KVM's TDP MMU).
    fn free_retired(&self, retired: &mut Vec<u32>) {
        if !retired.is_empty() {
            self.arena.free_all(retired.drain(..));
        }
    }

    /// Zaps the whole tree as KVM's `__tdp_mmu_zap_root`: one pass per level
    /// from 4 KiB up to the root's entries, each pass iterating with
    /// `min_level` = its level and zapping the entries at that level. Then
    /// flushes TLBs. Returns iterator steps per pass.
    pub fn zap_all(&self) -> [WalkStats; ROOT_LEVEL as usize] {
        let mut passes = [WalkStats::default(); ROOT_LEVEL as usize];
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        {
            let _excl = self.write_lock();
            for zap_level in 1..=ROOT_LEVEL {
                let mut w = self.walker();
                let mut zapped = 0;
                w.walk(self.root, zap_level, 0, u64::MAX, &mut |v| {
                    if v.level > zap_level {
                        return Next::Descend;
                    }
                    self.zap_entry(v.table, v.index, v.level, &mut retired);
                    zapped += 1;
                    Next::Skip
                });
                passes[zap_level as usize - 1].add(&w, zapped);
            }
        }
        self.flush.flush_remote(None);
        self.free_retired(&mut retired);
        passes
    }

    /// Zaps every leaf lying wholly inside frames `start..end` (tables stay).
    pub fn zap_range(&self, start: u64, end: u64) -> WalkStats {
        let mut stats = WalkStats::default();
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        {
            let _excl = self.write_lock();
            let mut w = self.walker();
            let mut zapped = 0;
            w.walk(self.root, 1, start, end, &mut |v| {
                if !pte::is_leaf(v.entry, v.level) {
                    return Next::Descend;
                }
                let span = pte::frames_per_entry(v.level);
                if v.gfn >= start && v.gfn + span <= end {
                    self.zap_entry(v.table, v.index, v.level, &mut retired);
                    zapped += 1;
                }
                Next::Skip
            });
            stats.add(&w, zapped);
        }
        self.flush.flush_remote(None);
        self.free_retired(&mut retired);
        stats
    }

    /// Splits every huge leaf in frames `start..end` into 4 KiB leaves (with
    /// the same permission, or read-only while dirty logging), under the exclusive lock, then flushes once (all the
    /// chunk's breaks share one flush).
    pub fn split_range(&self, start: u64, end: u64) -> Result<WalkStats, SoftError> {
        let mut stats = WalkStats::default();
        {
            let _excl = self.write_lock();
            let gen = self.gen.load(Ordering::Acquire);
            let mut w = self.walker();
            let mut split = 0;
            let mut failure = None;
            w.walk(self.root, 2, start, end, &mut |v| {
                if v.level < 2 || !pte::is_leaf(v.entry, v.level) {
                    return Next::Descend;
                }
                let child_level = v.level - 1;
                let child = match self.arena.alloc(child_level, v.gfn, gen) {
                    Ok(c) => c,
                    Err(e) => {
                        failure = Some(e);
                        return Next::Skip;
                    }
                };
                let table = self.arena.get(child);
                let span = pte::frames_per_entry(child_level);
                // Split for dirty logging: the 4 KiB leaves start write-protected,
                // which is what the next write-protect-all would do anyway.
                let writable = pte::is_writable(v.entry) && !self.logging();
                for i in 0..pte::ENTRIES {
                    if writable {
                        table.note_writable(i);
                    }
                    let _ =
                        table.install(i, pte::leaf(v.gfn + i as u64 * span, child_level, writable));
                }
                // The parent's writable bit, if any, now describes a table.
                let old = v.table.clear(v.index);
                debug_assert_eq!(old, v.entry);
                v.table
                    .install(v.index, pte::table(child))
                    .expect("exclusive lock: entry cannot change");
                split += 1;
                Next::Descend // a 1 GiB split yields 2 MiB leaves to split next
            });
            stats.add(&w, split);
            self.counters.eager_splits.add(None, split);
            if let Some(e) = failure {
                return Err(e.into());
            }
        }
        if stats.changed > 0 {
            self.flush.flush_remote(None);
        }
        Ok(stats)
    }

    /// Write-protects all guest memory for the next dirty-log round.
    /// Generation mode: O(1), bump the generation and kick the vCPUs.
    /// Walk mode: visit every leaf and clear its writable bit.
    pub fn write_protect_all(&self) -> WalkStats {
        let mut stats = WalkStats::default();
        match self.mech.write_protect {
            WriteProtect::Generation => {
                self.gen.fetch_add(1, Ordering::SeqCst);
            }
            WriteProtect::Walk => {
                let _excl = self.write_lock();
                let mut w = self.walker();
                let mut protected = 0;
                w.walk(self.root, 1, 0, u64::MAX, &mut |v| {
                    if !pte::is_leaf(v.entry, v.level) {
                        return Next::Descend;
                    }
                    if pte::is_writable(v.entry) {
                        v.table.entries[v.index].fetch_and(!pte::WRITABLE, Ordering::AcqRel);
                        v.table.forget_writable(v.index);
                        protected += 1;
                    }
                    Next::Skip
                });
                stats.add(&w, protected);
                self.counters.protected_entries.add(None, protected);
            }
        }
        self.flush.flush_remote(None);
        stats
    }

    /// Starts dirty logging: clears the log, splits huge leaves if eager,
    /// write-protects everything.
    pub fn start_dirty_log(&self) -> Result<(), SoftError> {
        self.dirty_bitmap().clear();
        self.logging.store(true, Ordering::SeqCst);
        if self.mech.split == SplitMode::Eager {
            self.split_range(0, self.frames())?;
        }
        self.write_protect_all();
        Ok(())
    }

    /// Stops dirty logging. Leaves stay 4 KiB (no collapse).
    pub fn stop_dirty_log(&self) {
        self.logging.store(false, Ordering::SeqCst);
    }

    /// Moves every frame marked since the last harvest into `into` (atomic
    /// exchange of the shared bitmap, no walk), then re-arms: write-protect-all,
    /// and in chunked mode the paced splitting of the next chunks.
    pub fn harvest(&self, into: &mut DirtyPages) -> Result<HarvestTiming, SoftError> {
        let t0 = Instant::now();
        let pages = self.dirty_bitmap().harvest_into(into);
        let t1 = Instant::now();
        self.write_protect_all();
        if let SplitMode::Chunked {
            chunk_pages,
            pace_us,
        } = self.mech.split
        {
            let chunk = chunk_pages.max(512).next_multiple_of(512);
            let mut start = 0;
            while start < self.frames() {
                let end = (start + chunk).min(self.frames());
                if self.split_range(start, end)?.changed > 0 && pace_us > 0 {
                    std::thread::sleep(Duration::from_micros(pace_us));
                }
                start = end;
            }
        }
        Ok(HarvestTiming {
            pages,
            get_ns: (t1 - t0).as_nanos() as u64,
            protect_ns: t1.elapsed().as_nanos() as u64,
        })
    }

    /// Present leaves and tables reachable from the root (a full count, for
    /// tests and reports).
    pub fn census(&self) -> Census {
        let _excl = self.write_lock();
        let mut w = Walker::new(&self.arena, Iteration::PresentOnly);
        let mut c = Census::default();
        w.walk(self.root, 1, 0, u64::MAX, &mut |v| {
            c.present += 1;
            if pte::is_leaf(v.entry, v.level) {
                c.leaves[v.level as usize - 1] += 1;
                if pte::is_writable(v.entry) {
                    c.writable += 1;
                }
            }
            Next::Descend
        });
        c.tables = w.tables;
        c
    }
}

/// Counts of what the tree holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Census {
    /// Present entries (leaves and table pointers).
    pub present: u64,
    /// Leaves per level (4K, 2M, 1G, -).
    pub leaves: [u64; 4],
    /// Writable leaves.
    pub writable: u64,
    /// Tables, root included.
    pub tables: u64,
}
