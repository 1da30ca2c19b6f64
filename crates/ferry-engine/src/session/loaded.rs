//! The memory image a destination builds: guest RAM, the per-page hashes,
//! which pages arrived and which are present, and how a received batch is
//! placed (`UFFDIO_COPY` into untouched memory, a copy otherwise; whole huge
//! pages on hugetlb; deltas against the copy already here).
//!
//! A page that is not in guest memory yet is placed with `UFFDIO_COPY`
//! (see [`ferry_vm::uffd`]): the kernel then allocates it already
//! filled, instead of zeroing it on first touch and having the data copied
//! over it. Pages already present (resent in a dirty round) are copied in
//! as before. The registration ends before the guest runs.

use super::huge::{self, HugeStaging};
use super::round_gate::RoundGate;
use super::Placement;
use crate::digest::{page_hash, zero_page_hash, PageHashes};
use crate::error::MigrationError;
use crate::transport::Health;
use crate::wire::delta::{self, DeltaView};
use crate::wire::pages::Segment;
use crate::wire::BatchView;
use ferry_vm::uffd::{Placed, Placer};
use ferry_vm::{Backing, Gfn, GuestRam, PageBits, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];

/// What the receivers build up, shared with the destination's engine thread
/// (and, in postcopy, with the pager).
pub(crate) struct Loaded {
    pub ram: Arc<GuestRam>,
    pub pages: u64,
    pub hashes: PageHashes,
    /// Pages known to hold zeros: fresh RAM, or a zero page placed here.
    known_zero: PageBits,
    /// Pages received at least once.
    pub received: PageBits,
    /// Pages that exist in guest memory (written at creation, or placed);
    /// shared with a backend whose vCPUs resolve their own faults.
    present: Arc<PageBits>,
    /// Placement by copy into missing pages, while registered.
    placer: RwLock<Option<Placer>>,
    /// Postcopy has begun: every page is placed once, never overwritten.
    postcopy: AtomicBool,
    /// Postcopy: the pages vCPUs wait for, and for how long.
    pub clock: super::BlockClock,
    /// Postcopy: where page requests go (the current priority connection).
    pub requests: super::Requests,
    /// Postcopy: bumped at every placement, for threads waiting on a page.
    placements: Mutex<u64>,
    placed: Condvar,
    pub pages_received: AtomicU64,
    pub zero_pages: AtomicU64,
    pub batches: AtomicU64,
    pub(crate) gate: RoundGate,
    /// Hugetlb backing: postcopy places whole 2 MiB pages, filled here
    /// first (see [`super::huge`]).
    huge: Option<HugeStaging>,
    /// Hugetlb postcopy: pages dropped with their huge page at the
    /// switchover although current here, to ask for again (runs).
    extras: Mutex<Vec<(u64, u32)>>,
}

impl Loaded {
    /// State for a guest of `ram`, whose pages are zero except `written`.
    /// With `faults` (a migration that may switch to postcopy), RAM is
    /// registered so that a touch of a missing page waits for it; that
    /// needs userfaultfd, and fails without it.
    pub fn new(
        ram: Arc<GuestRam>,
        written: &ferry_vm::DirtyPages,
        lanes: usize,
        placement: Placement,
        faults: bool,
    ) -> Result<Self, MigrationError> {
        let pages = ram.pages();
        let known_zero = PageBits::all(pages);
        let present = Arc::new(PageBits::new(pages));
        written.iter().for_each(|g| {
            known_zero.remove(g);
            present.insert(g);
        });
        let hugetlb = ram.backing() == Backing::Hugetlb;
        let placer = match placement {
            // Registered at the postcopy switchover: until then precopy
            // writes its pages normally, which a registered missing huge
            // page would not take without a handler.
            _ if faults && hugetlb => None,
            _ if faults => Some(Placer::register_for_faults(&ram).map_err(|e| {
                MigrationError::Placement(format!(
                    "postcopy needs userfaultfd on the destination: {e}"
                ))
            })?),
            Placement::Auto if ram.thp_eligible() => {
                tracing::info!("pages are written, so that guest RAM stays on huge pages");
                None
            }
            Placement::Auto | Placement::Uffd => Placer::register(&ram)
                .map_err(|e| tracing::info!("pages are written, not placed by copy: {e}"))
                .ok(),
            Placement::Write => None,
        };
        // A hole between memory regions never comes: it counts as received,
        // so that nothing waits for it or asks for it.
        let received = PageBits::new(pages);
        for (first, n) in ram.holes() {
            (first.0..first.0 + n).for_each(|g| {
                received.insert(Gfn(g));
            });
        }
        Ok(Loaded {
            ram,
            pages,
            hashes: PageHashes::zeroed(pages),
            known_zero,
            received,
            present,
            placer: RwLock::new(placer),
            postcopy: AtomicBool::new(false),
            clock: Default::default(),
            requests: Default::default(),
            placements: Mutex::new(0),
            placed: Condvar::new(),
            pages_received: AtomicU64::new(0),
            zero_pages: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            gate: RoundGate::new(lanes),
            huge: hugetlb.then(HugeStaging::default),
            extras: Mutex::new(Vec::new()),
        })
    }

    /// The registration, while placement by copy lasts.
    pub fn placer(&self) -> std::sync::RwLockReadGuard<'_, Option<Placer>> {
        self.placer.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The set of pages in guest memory, for a backend whose vCPUs check
    /// it themselves (annotated fault exits).
    pub fn present_set(&self) -> Arc<PageBits> {
        Arc::clone(&self.present)
    }

    /// Placements so far (postcopy), for [`Loaded::wait_placed`].
    pub fn placements(&self) -> u64 {
        *self.placements.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until a placement after the `seen`-th, or `timeout`.
    pub fn wait_placed(&self, seen: u64, timeout: Duration) {
        let n = self.placements.lock().unwrap_or_else(|p| p.into_inner());
        if *n == seen {
            let _ = self.placed.wait_timeout(n, timeout);
        }
    }

    /// Whether pages are still placed by copy (postcopy not over).
    pub fn placing(&self) -> bool {
        self.placer().is_some()
    }

    /// Whether `gfn` is in guest memory.
    pub fn is_present(&self, gfn: Gfn) -> bool {
        self.present.contains(gfn)
    }

    /// Whether `gfn` was received as a zero page and never placed: it can
    /// be placed here without asking the source.
    pub fn zero_here(&self, gfn: Gfn) -> bool {
        self.received.contains(gfn) && self.known_zero.contains(gfn) && !self.present.contains(gfn)
    }

    /// Places a zero page at `gfn`, once.
    pub fn place_zero(&self, gfn: Gfn) -> Result<(), MigrationError> {
        self.put(gfn, &ZERO_PAGE)
    }

    /// Begins postcopy: the copies this side holds of the `missing` pages
    /// are stale, so they are dropped and the pages counted as not received;
    /// from now on every page is placed once and never overwritten. Call
    /// after the last precopy round is in, before the guest runs.
    pub fn begin_postcopy(&self, missing: &ferry_vm::DirtyPages) -> Result<(), MigrationError> {
        if self.huge.is_some() {
            return self.begin_huge_postcopy(missing);
        }
        for (first, count) in missing.runs() {
            self.ram
                .discard(first, count)
                .map_err(MigrationError::ram("drop stale pages for postcopy"))?;
            for g in first.0..first.0 + count {
                let g = Gfn(g);
                self.present.remove(g);
                self.received.remove(g);
                self.known_zero.remove(g);
            }
        }
        self.postcopy.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// [`Loaded::begin_postcopy`] on hugetlb: whole huge pages are dropped
    /// (a huge page is present or missing as a whole), the current pages
    /// dropped with them are staged as zeros or asked for again, and the
    /// registration for faults begins.
    fn begin_huge_postcopy(&self, missing: &ferry_vm::DirtyPages) -> Result<(), MigrationError> {
        let max = crate::wire::messages::MAX_REQUEST_PAGES;
        let mut extras: Vec<(u64, u32)> = Vec::new();
        let mut zeros = Vec::new();
        for (first, count) in huge::rounded_runs(missing, self.pages) {
            self.ram
                .discard(Gfn(first), count)
                .map_err(MigrationError::ram("drop stale huge pages for postcopy"))?;
            for g in (first..first + count).map(Gfn) {
                self.present.remove(g);
                if !missing.contains(g) && self.known_zero.contains(g) {
                    zeros.push(g);
                    continue;
                }
                if !missing.contains(g) {
                    match extras.last_mut() {
                        Some((f, n)) if *f + u64::from(*n) == g.0 && *n < max => *n += 1,
                        _ => extras.push((g.0, 1)),
                    }
                }
                self.received.remove(g);
                self.known_zero.remove(g);
            }
        }
        let placer = Placer::register_for_faults(&self.ram).map_err(|e| {
            MigrationError::Placement(format!(
                "postcopy needs userfaultfd on the destination: {e}"
            ))
        })?;
        *self.placer.write().unwrap_or_else(|p| p.into_inner()) = Some(placer);
        *self.extras.lock().unwrap_or_else(|p| p.into_inner()) = extras;
        self.postcopy.store(true, Ordering::SeqCst);
        for g in zeros {
            self.put(g, &ZERO_PAGE)?;
        }
        Ok(())
    }

    /// Hugetlb postcopy: the runs of pages to ask for again, taken.
    pub fn take_extras(&self) -> Vec<(u64, u32)> {
        std::mem::take(&mut *self.extras.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Hugetlb postcopy: whether `gfn` waits in a staging buffer.
    pub fn is_staged(&self, gfn: Gfn) -> bool {
        self.huge.as_ref().is_some_and(|h| h.holds(gfn))
    }

    /// Whether postcopy places whole huge pages here.
    pub fn places_huge_pages(&self) -> bool {
        self.huge.is_some()
    }

    /// Whether postcopy has begun here.
    pub fn in_postcopy(&self) -> bool {
        self.postcopy.load(Ordering::SeqCst)
    }

    /// Ends placement by copy: from now on every page is written normally,
    /// and the guest may touch any page. Call before the guest runs.
    pub fn end_placement(&self) {
        if let Some(h) = self.huge.as_ref().filter(|h| h.partial() > 0) {
            // Only a failed postcopy leaves huge pages part-filled.
            tracing::debug!("{} huge pages were never filled", h.partial());
        }
        self.placer
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// Writes `bytes` (whole pages) at `first`: missing pages by copy while
    /// registered, present pages through guest RAM.
    /// In postcopy a page is placed once: a page present already (placed by
    /// the other path, and perhaps written by the guest since) is skipped.
    fn put(&self, first: Gfn, bytes: &[u8]) -> Result<(), MigrationError> {
        let placer = self.placer.read().unwrap_or_else(|p| p.into_inner());
        let once = self.postcopy.load(Ordering::SeqCst);
        if let (Some(huge), Some(p), true) = (&self.huge, &*placer, once) {
            for done in huge.stage(first, bytes, |g| self.present.contains(g)) {
                match p.copy(done.first, &done.bytes) {
                    Ok(Placed::Copied(_)) => {}
                    Ok(other) => {
                        return Err(MigrationError::Placement(format!(
                            "huge page at frame {:#x} was not placed whole ({other:?})",
                            done.first.0
                        )))
                    }
                    Err(e) => return Err(MigrationError::Placement(e.to_string())),
                }
                for g in done.first.0..done.first.0 + huge::HUGE_PAGES {
                    self.present.insert(Gfn(g));
                }
                self.clock.placed(done.first, huge::HUGE_PAGES);
                *self.placements.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                self.placed.notify_all();
            }
            return Ok(());
        }
        let n = (bytes.len() / PAGE_SIZE) as u64;
        let mut i = 0u64;
        while i < n {
            let g = Gfn(first.0 + i);
            // The run of pages from i that are all present, or all missing.
            let here = self.present.contains(g);
            let mut end = i + 1;
            while end < n && self.present.contains(Gfn(first.0 + end)) == here {
                end += 1;
            }
            let part = &bytes[i as usize * PAGE_SIZE..end as usize * PAGE_SIZE];
            let placed = match (&*placer, here) {
                (_, true) if once => Placed::Copied(end - i),
                (Some(p), false) => p
                    .copy(g, part)
                    .map_err(|e| MigrationError::Placement(e.to_string()))?,
                _ => Placed::Unregistered,
            };
            // What to write normally: page i + k when it turned out present,
            // or the whole part when nothing is placed by copy.
            let (done, write) = match placed {
                Placed::Copied(k) => (k, None),
                Placed::PresentAt(k) if once => (k + 1, None),
                Placed::PresentAt(k) => (k + 1, Some((k, 1))),
                Placed::Unregistered => (end - i, Some((0, end - i))),
            };
            if let Some((k, len)) = write {
                let bytes = &part[k as usize * PAGE_SIZE..(k + len) as usize * PAGE_SIZE];
                self.ram
                    .write_pages(Gfn(g.0 + k), bytes)
                    .map_err(MigrationError::ram("write guest memory"))?;
            }
            for j in i..i + done {
                self.present.insert(Gfn(first.0 + j));
            }
            if once {
                self.clock.placed(Gfn(first.0 + i), done);
                *self.placements.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                self.placed.notify_all();
            }
            i += done;
        }
        Ok(())
    }

    /// Applies a Delta frame's pages to the copies placed before; returns
    /// how many it had. A delta for a page this side does not hold as sent
    /// data is refused (it never reads a page that is not there: with
    /// placement by copy, that read would wait for ever).
    pub(crate) fn apply_delta(
        &self,
        view: &DeltaView<'_>,
        scratch: &mut Vec<u8>,
    ) -> Result<u64, String> {
        scratch.resize(PAGE_SIZE, 0);
        for (gfn, delta) in view.entries() {
            let held = self.received.contains(gfn)
                && self.present.contains(gfn)
                && !self.known_zero.contains(gfn);
            if !held {
                return Err(format!(
                    "delta for gfn {:#x}, which this side never received as data",
                    gfn.0
                ));
            }
            self.ram
                .read_pages(gfn, scratch)
                .map_err(|e| format!("cannot read guest memory: {e}"))?;
            delta::apply(scratch, delta).map_err(|e| format!("gfn {:#x}: {e}", gfn.0))?;
            self.ram
                .write_pages(gfn, scratch)
                .map_err(|e| format!("cannot write guest memory: {e}"))?;
            self.hashes.set(gfn, page_hash(scratch));
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.pages_received
            .fetch_add(view.pages() as u64, Ordering::Relaxed);
        Ok(view.pages() as u64)
    }

    /// Waits until every data connection has ended `round`.
    pub fn wait_round(&self, round: u32, health: &Health) -> Result<(), MigrationError> {
        self.gate.wait_ended(round, health)
    }

    /// Places a batch's pages; returns how many it had.
    pub fn apply(&self, batch: &BatchView<'_>) -> Result<u64, MigrationError> {
        let once = self.postcopy.load(Ordering::SeqCst);
        let mut data_pages = 0;
        batch.visit(|segment| -> Result<(), MigrationError> {
            match segment {
                Segment::Zero(gfn) if once => {
                    self.put(gfn, &ZERO_PAGE)?;
                    self.hashes.set(gfn, zero_page_hash());
                    self.received.insert(gfn);
                }
                Segment::Zero(gfn) => {
                    if !self.known_zero.contains(gfn) {
                        self.ram
                            .write_pages(gfn, &ZERO_PAGE)
                            .map_err(MigrationError::ram("write guest memory"))?;
                        self.known_zero.insert(gfn);
                    }
                    self.hashes.set(gfn, zero_page_hash());
                    self.received.insert(gfn);
                }
                Segment::Data { first, bytes } => {
                    self.put(first, bytes)?;
                    for (i, page) in bytes.chunks_exact(PAGE_SIZE).enumerate() {
                        let g = Gfn(first.0 + i as u64);
                        let hash = batch.data_page_hash(data_pages);
                        self.hashes.set(g, hash.unwrap_or_else(|| page_hash(page)));
                        data_pages += 1;
                        self.known_zero.remove(g);
                        self.received.insert(g);
                    }
                }
            }
            Ok(())
        })?;
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.pages_received
            .fetch_add(batch.pages() as u64, Ordering::Relaxed);
        self.zero_pages
            .fetch_add(batch.zero_pages() as u64, Ordering::Relaxed);
        Ok(batch.pages() as u64)
    }
}
