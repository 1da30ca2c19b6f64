//! The soft MMU: guest-physical to host translation through 4-level radix
//! tables, the fault paths, and the dirty log.
//!
//! Concurrency follows the TDP MMU. A TLB miss that needs no fault walks with
//! no lock at all, as the hardware walker does (tables are reused only after
//! a flush grace period, see `walk_lockless`). vCPU faults hold the MMU lock *shared*
//! and change entries with compare-exchange, so faults on different pages run
//! in parallel. Structural changes that free tables (zap) or rewrite many
//! entries (eager split, walk-based write-protect) hold it *exclusively*. Nobody
//! waits for a remote TLB flush while holding the lock exclusively, and a vCPU
//! waiting for the lock keeps acknowledging flushes, so the flush handshake
//! (tlb.rs) cannot deadlock against the lock.
//!
//! ```text
//!  access ─► TLB hit ─► done
//!     └──► lock-free walk: present leaf with the permission ─► fill TLB
//!     └──► walk (lock shared): per table: lazy write-protect if its generation is stale
//!            missing entry  ─► map (huge leaf if allowed, else tables down to 4K)
//!            write on RO 4K ─► write fault: mark dirty, make writable
//!            write on RO huge while logging ─► split on fault: freeze, flush, empty child
//! ```
//!
//! The fault that makes a page writable while logging marks it in the shared
//! dirty bitmap *before* the vCPU stores, and a harvest takes the bitmap
//! *before* it write-protects, so a write is either in this harvest or faults
//! again and lands in the next one.

use crate::config::{Mechanisms, WriteProtect};
use crate::counter::Counter;
use crate::error::SoftError;
use crate::fault::{FaultFlags, MemoryFault, Residency};
use crate::mmu_lock::{MmuLock, ReadGuard, WriteGuard};
use crate::pte::{self, ROOT_LEVEL};
use crate::table::{Arena, Table};
use crate::tlb::FlushDomain;
use ferry_vm::Gpa;
use ferry_vm::{DirtyPages, Gfn, SharedDirtyBitmap};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Counters of MMU events.
#[derive(Default, Debug)]
pub struct MmuCounters {
    /// Faults on a missing entry.
    pub missing_faults: Counter,
    /// Write faults on a present read-only leaf.
    pub write_faults: Counter,
    /// Huge leaves broken by a write fault.
    pub fault_splits: Counter,
    /// Huge leaves split eagerly.
    pub eager_splits: Counter,
    /// Tables write-protected lazily (generation mode).
    pub lazy_syncs: Counter,
    /// Entries write-protected (either mode).
    pub protected_entries: Counter,
    /// Walks that had to restart (frozen entry, lost race).
    pub retries: Counter,
}

/// A snapshot of [`MmuCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MmuStats {
    /// Faults on a missing entry.
    pub missing_faults: u64,
    /// Write faults on a present read-only leaf.
    pub write_faults: u64,
    /// Huge leaves broken by a write fault.
    pub fault_splits: u64,
    /// Huge leaves split eagerly.
    pub eager_splits: u64,
    /// Tables write-protected lazily.
    pub lazy_syncs: u64,
    /// Entries write-protected.
    pub protected_entries: u64,
    /// Walk restarts.
    pub retries: u64,
    /// Remote TLB flushes.
    pub flushes: u64,
    /// Tables in use.
    pub tables: u32,
}

/// Result of a translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The vCPU may cache the translation as writable.
    pub writable: bool,
    /// This fault marked the page dirty for the first time in this round
    /// (what a dirty quota charges).
    pub dirtied: bool,
    /// The access faulted (on hardware: a VM exit to the hypervisor), as
    /// opposed to a plain table walk.
    pub fault: bool,
}

enum Step {
    Done(Translation),
    Retry,
}

/// The software second-level MMU of one address space.
pub struct Mmu {
    pub(crate) arena: Arena,
    pub(crate) root: u32,
    pub(crate) lock: MmuLock,
    frames: u64,
    pub(crate) mech: Mechanisms,
    pub(crate) gen: AtomicU64,
    pub(crate) logging: AtomicBool,
    dirty: Arc<SharedDirtyBitmap>,
    /// The pages vCPUs touched since the last harvest, while `tracking`
    /// (the soft MMU's accessed bits; see [`Mmu::harvest_accessed`]).
    accessed: SharedDirtyBitmap,
    tracking: AtomicBool,
    pub(crate) flush: FlushDomain,
    pub(crate) counters: MmuCounters,
    residency: OnceLock<Arc<Residency>>,
    /// Tables a zap unlinked, waiting for its flush before they are freed
    /// (kept here so a zap does not allocate).
    pub(crate) retired: Mutex<Vec<u32>>,
}

impl Mmu {
    /// An MMU for guest frames `0..frames`, with `vcpus` vCPU slots.
    pub fn new(frames: u64, vcpus: usize, mech: Mechanisms) -> Result<Self, SoftError> {
        let arena = Arena::for_frames(frames, 256 + 4 * vcpus as u32);
        let root = arena.alloc(ROOT_LEVEL, 0, 0)?;
        Ok(Mmu {
            arena,
            root,
            lock: MmuLock::new(vcpus),
            frames,
            mech,
            gen: AtomicU64::new(0),
            logging: AtomicBool::new(false),
            dirty: Arc::new(SharedDirtyBitmap::new(frames)),
            accessed: SharedDirtyBitmap::new(frames),
            tracking: AtomicBool::new(false),
            flush: FlushDomain::new(vcpus),
            counters: MmuCounters::default(),
            residency: OnceLock::new(),
            retired: Mutex::new(Vec::new()),
        })
    }

    /// Guest frames covered.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The mechanism switches.
    pub fn mechanisms(&self) -> Mechanisms {
        self.mech
    }

    /// The dirty bitmap the write-fault path marks and the engine harvests.
    pub fn dirty_bitmap(&self) -> &Arc<SharedDirtyBitmap> {
        &self.dirty
    }

    /// The remote-flush domain of the vCPUs.
    pub fn flush_domain(&self) -> &FlushDomain {
        &self.flush
    }

    /// Whether dirty logging is on.
    pub fn logging(&self) -> bool {
        self.logging.load(Ordering::Acquire)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> MmuStats {
        let c = &self.counters;
        let l = Counter::get;
        MmuStats {
            missing_faults: l(&c.missing_faults),
            write_faults: l(&c.write_faults),
            fault_splits: l(&c.fault_splits),
            eager_splits: l(&c.eager_splits),
            lazy_syncs: l(&c.lazy_syncs),
            protected_entries: l(&c.protected_entries),
            retries: l(&c.retries),
            flushes: self.flush.flushes(),
            tables: self.arena.in_use(),
        }
    }

    /// Starts tracking which pages the vCPUs touch: forgets what was
    /// marked, and flushes every TLB, so that each page's next access
    /// walks (and is marked).
    pub fn start_access_log(&self) {
        self.accessed.clear();
        self.tracking.store(true, Ordering::SeqCst);
        self.flush.flush_remote(None);
    }

    /// Stops tracking accesses.
    pub fn stop_access_log(&self) {
        self.tracking.store(false, Ordering::SeqCst);
    }

    /// A vCPU's TLB miss on `gfn`: its accessed bit, while tracking. Read
    /// before it is set: a hot page misses again and again in a period,
    /// and a load leaves the bitmap's shared lines alone where a mark
    /// would write them from every vCPU.
    #[inline]
    pub(crate) fn note_access(&self, gfn: u64) {
        if self.tracking.load(Ordering::Relaxed) && !self.accessed.is_marked(Gfn(gfn)) {
            self.accessed.mark(Gfn(gfn));
        }
    }

    /// Moves the pages touched since the last harvest into `into`, then
    /// flushes every TLB: a vCPU marks a page only as it walks to it, as
    /// hardware sets an accessed bit, so a translation it still caches
    /// would hide its next touches. A touch between the exchange and the
    /// flush through a cached translation is missed (as KVM's aging misses
    /// one between its clear and its flush): a hint, not a proof. Not from
    /// a vCPU thread: the flush waits for every online vCPU to acknowledge.
    pub fn harvest_accessed(&self, into: &mut DirtyPages) -> u64 {
        let n = self.accessed.harvest_into(into);
        self.flush.flush_remote(None);
        n
    }

    /// Takes the lock shared. A vCPU that has to wait keeps acknowledging
    /// remote flushes, so a flusher holding the lock shared can finish.
    pub(crate) fn read_lock(&self, vcpu: Option<usize>) -> ReadGuard<'_> {
        self.lock.read(vcpu, || {
            if let Some(v) = vcpu {
                self.flush.ack_deferred(v);
            }
        })
    }

    /// Takes the lock exclusively.
    pub(crate) fn write_lock(&self) -> WriteGuard<'_> {
        self.lock.write()
    }

    /// Translates `gfn` for an access by `vcpu` (None for a host thread),
    /// faulting it in as needed. Returns whether the translation may be cached
    /// writable.
    pub fn translate(
        &self,
        vcpu: Option<usize>,
        gfn: Gfn,
        write: bool,
    ) -> Result<Translation, SoftError> {
        if gfn.0 >= self.frames {
            return Err(SoftError::OutOfRange(gfn.0));
        }
        if vcpu.is_some() {
            if let Some(t) = self.walk_lockless(vcpu, gfn.0, write) {
                return Ok(t);
            }
        }
        loop {
            let step = {
                let _shared = self.read_lock(vcpu);
                self.walk(vcpu, gfn.0, write)?
            };
            match step {
                Step::Done(t) => return Ok(t),
                Step::Retry => {
                    self.counters.retries.add(vcpu, 1);
                    if let Some(v) = vcpu {
                        self.flush.ack_deferred(v);
                    }
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Postcopy: from now on a missing-page fault on a page that is not
    /// present in `residency` fails with [`SoftError::MemoryFault`] instead of
    /// mapping it, and pages are mapped 4 KiB at a time. Set once.
    pub fn set_residency(&self, residency: Arc<Residency>) -> Result<(), SoftError> {
        self.residency
            .set(residency)
            .map_err(|_| SoftError::Options("residency is already set".into()))
    }

    /// Level of the leaf a missing fault at `gfn` may install at `level`.
    fn map_level(&self, gfn: u64, level: u8) -> u8 {
        if self.logging.load(Ordering::Acquire) || self.residency.get().is_some() {
            return 1;
        }
        let mut l = self.mech.leaf.level().min(level);
        while l > 1 {
            let span = pte::frames_per_entry(l);
            let base = gfn & !(span - 1);
            if base + span <= self.frames {
                break;
            }
            l -= 1;
        }
        l
    }

    /// Brings `table` up to write-protect generation `gen` (lazy
    /// write-protect: only possibly-writable entries are touched).
    #[inline]
    pub(crate) fn sync_table(&self, vcpu: Option<usize>, table: &Table, gen: u64) {
        if self.mech.write_protect != WriteProtect::Generation
            || table.wp_gen.load(Ordering::Acquire) >= gen
        {
            return;
        }
        let _locked = table.lock();
        if table.wp_gen.load(Ordering::Acquire) >= gen {
            return;
        }
        let n = table.write_protect_possibly_writable();
        table.wp_gen.store(gen, Ordering::Release);
        self.counters.lazy_syncs.add(vcpu, 1);
        self.counters.protected_entries.add(vcpu, n);
    }

    fn mark_dirty(&self, gfn: u64) -> bool {
        self.logging.load(Ordering::Acquire) && self.dirty.mark(Gfn(gfn))
    }

    /// A TLB miss that needs no fault, served as a hardware page walker
    /// serves it: loads only, no MMU lock. Returns `None` when the access must
    /// take the fault path (missing or frozen entry, write to a read-only leaf).
    ///
    /// Only a vCPU in the flush domain may walk without the lock: tables are
    /// returned to the arena only after a remote flush that every online vCPU
    /// acknowledges at an access boundary, and a walk never spans a boundary,
    /// so no table this walk reads is reused under it. Anything it caches that
    /// was changed meanwhile is dropped at that same acknowledgement, before
    /// the changer's flush returns. Stale tables are still write-protected on
    /// the way down, so a writable translation is only ever one that a write
    /// fault of the current generation made writable.
    #[inline]
    fn walk_lockless(&self, vcpu: Option<usize>, gfn: u64, write: bool) -> Option<Translation> {
        let gen = self.gen.load(Ordering::Acquire);
        let mut t = self.root;
        let mut level = ROOT_LEVEL;
        loop {
            let table = self.arena.get(t);
            self.sync_table(vcpu, table, gen);
            let e = table.entries[pte::index(gfn, level)].load(Ordering::Acquire);
            if !pte::is_present(e) {
                return None; // missing, or FROZEN (which is not present)
            }
            if !pte::is_leaf(e, level) {
                t = pte::child(e);
                level -= 1;
                continue;
            }
            let writable = pte::is_writable(e);
            if write && !writable {
                return None;
            }
            return Some(Translation {
                writable,
                dirtied: false,
                fault: false,
            });
        }
    }

    fn walk(&self, vcpu: Option<usize>, gfn: u64, write: bool) -> Result<Step, SoftError> {
        let gen = self.gen.load(Ordering::Acquire);
        let mut t = self.root;
        let mut level = ROOT_LEVEL;
        loop {
            let table = self.arena.get(t);
            self.sync_table(vcpu, table, gen);
            let i = pte::index(gfn, level);
            let e = table.entries[i].load(Ordering::Acquire);
            if e == pte::FROZEN {
                return Ok(Step::Retry);
            }
            let span = pte::frames_per_entry(level);
            let base = gfn & !(span - 1);
            if !pte::is_present(e) {
                if level > self.map_level(gfn, level) {
                    let child = self.arena.alloc(level - 1, base, gen)?;
                    if table.install(i, pte::table(child)).is_err() {
                        self.arena.free(child);
                    }
                    continue;
                }
                if let Some(r) = self.residency.get() {
                    if !r.is_present(Gfn(gfn)) {
                        return Err(SoftError::MemoryFault(MemoryFault {
                            gpa: Gpa(gfn << 12),
                            size: 4096,
                            flags: FaultFlags { write },
                        }));
                    }
                }
                self.counters.missing_faults.add(vcpu, 1);
                if !write {
                    if table.install(i, pte::leaf(base, level, false)).is_err() {
                        continue;
                    }
                    return Ok(Step::Done(Translation {
                        writable: false,
                        dirtied: false,
                        fault: true,
                    }));
                }
                let _locked = table.lock();
                table.note_writable(i);
                if table.install(i, pte::leaf(base, level, true)).is_err() {
                    continue;
                }
                let dirtied = level == 1 && self.mark_dirty(gfn);
                return Ok(Step::Done(Translation {
                    writable: true,
                    dirtied,
                    fault: true,
                }));
            }
            if !pte::is_leaf(e, level) {
                t = pte::child(e);
                level -= 1;
                continue;
            }
            if !write || pte::is_writable(e) {
                return Ok(Step::Done(Translation {
                    writable: pte::is_writable(e),
                    dirtied: false,
                    fault: false,
                }));
            }
            if level > 1 && self.logging.load(Ordering::Acquire) {
                self.split_on_fault(vcpu, table, i, level, e, gen)?;
                continue;
            }
            // Write fault on a read-only leaf.
            let _locked = table.lock();
            if table.wp_gen.load(Ordering::Acquire) < gen
                && self.mech.write_protect == WriteProtect::Generation
            {
                continue; // protected meanwhile: sync and look again
            }
            table.note_writable(i);
            if table.entries[i]
                .compare_exchange(e, e | pte::WRITABLE, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            self.counters.write_faults.add(vcpu, 1);
            let dirtied = level == 1 && self.mark_dirty(gfn);
            return Ok(Step::Done(Translation {
                writable: true,
                dirtied,
                fault: true,
            }));
        }
    }

    /// Breaks a read-only huge leaf hit by a write while logging (arm64's
    /// behaviour before eager splitting): break-before-make with a remote TLB
    /// flush, then an empty child table, so only the faulting page gets mapped
    /// and its 511 neighbours fault again when touched, reads included.
    fn split_on_fault(
        &self,
        vcpu: Option<usize>,
        table: &Table,
        i: usize,
        level: u8,
        e: u64,
        gen: u64,
    ) -> Result<(), SoftError> {
        if table.entries[i]
            .compare_exchange(e, pte::FROZEN, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(());
        }
        self.flush.flush_remote(vcpu);
        let child = match self.arena.alloc(level - 1, pte::frame(e), gen) {
            Ok(c) => c,
            Err(err) => {
                table.entries[i].store(e, Ordering::Release);
                return Err(err.into());
            }
        };
        table.entries[i].store(pte::table(child), Ordering::Release);
        self.counters.fault_splits.add(vcpu, 1);
        Ok(())
    }

    /// The leaf mapping `gfn` as (entry, level), without faulting.
    pub fn lookup(&self, gfn: Gfn) -> Option<(u64, u8)> {
        let _shared = self.read_lock(None);
        let mut t = self.root;
        let mut level = ROOT_LEVEL;
        loop {
            let e = self.arena.get(t).entries[pte::index(gfn.0, level)].load(Ordering::Acquire);
            if !pte::is_present(e) {
                return None;
            }
            if pte::is_leaf(e, level) {
                return Some((e, level));
            }
            t = pte::child(e);
            level -= 1;
        }
    }

    /// Returns the table at `level` covering `gfn`, creating tables down to it.
    /// Caller holds the lock exclusively.
    pub(crate) fn ensure_table(&self, gfn: u64, level: u8) -> Result<u32, SoftError> {
        let gen = self.gen.load(Ordering::Acquire);
        let mut t = self.root;
        let mut l = ROOT_LEVEL;
        while l > level {
            let table = self.arena.get(t);
            let i = pte::index(gfn, l);
            let e = table.entries[i].load(Ordering::Acquire);
            if !pte::is_present(e) {
                let base = gfn & !(pte::frames_per_entry(l) - 1);
                let child = self.arena.alloc(l - 1, base, gen)?;
                table
                    .install(i, pte::table(child))
                    .expect("exclusive lock: entry cannot change");
                t = child;
            } else if pte::is_leaf(e, l) {
                return Err(SoftError::Options(format!(
                    "gfn {gfn:#x} is already mapped by a level-{l} leaf"
                )));
            } else {
                t = pte::child(e);
            }
            l -= 1;
        }
        Ok(t)
    }

    /// Maps frames `start..end` with leaves of `level` (the range must be
    /// aligned to it), as a guest that touched all of its memory would have:
    /// how the sparse-memory experiments build real tables without faulting
    /// every page.
    pub fn populate(
        &self,
        start: u64,
        end: u64,
        level: u8,
        writable: bool,
    ) -> Result<(), SoftError> {
        let span = pte::frames_per_entry(level);
        if !start.is_multiple_of(span) || !end.is_multiple_of(span) || end > self.frames {
            return Err(SoftError::Options(format!(
                "populate {start:#x}..{end:#x} is not aligned to level {level} or past the end"
            )));
        }
        let _excl = self.write_lock();
        let mut gfn = start;
        while gfn < end {
            let t = self.ensure_table(gfn, level)?;
            let table = self.arena.get(t);
            let _locked = table.lock();
            let table_end = (table.base_gfn() + span * pte::ENTRIES as u64).min(end);
            while gfn < table_end {
                let i = pte::index(gfn, level);
                if writable {
                    table.note_writable(i);
                }
                let _ = table.install(i, pte::leaf(gfn, level, writable));
                gfn += span;
            }
        }
        Ok(())
    }
}
