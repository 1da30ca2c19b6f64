//! Lazy restore: the vCPUs run before guest memory is in. Guest RAM is
//! emptied and registered with userfaultfd, as a postcopy destination's
//! is; a page touched before it is in is read from the snapshot file on
//! demand, while a background fill brings in the rest: the working set
//! first where asked, then everything in address order (as Cloud
//! Hypervisor's prefault does).
//!
//! ```text
//!  vCPU touches a missing page ─ kernel holds it, queues a uffd event
//!  lazy-faults: event ─► read the page (and the missing ones after it)
//!                        from the file, check each hash, UFFDIO_COPY (wakes it)
//!  vCPU with fault exits ─► the same, on its own thread
//!  lazy-fill: working set (two readers), then address order (one)
//!             ─► read 1 MiB, check, copy
//! ```
//!
//! Every page is checked against the hash the snapshot recorded before it
//! is placed, and placed once (a copy that finds the page there already
//! leaves it alone: the guest may have written it since). A page that
//! fails its hash is never placed: the vCPUs that touch it wait until the
//! restore's owner stops the guest ([`super::Restoring::finish`]), so that
//! nothing runs on from damaged data.
//!
//! A restore never waits on a page that cannot come: when the last fill
//! reader ends, every RAM frame is in, and one that is not fails the
//! restore by name (`Shared::reader_ended`) rather than hold the guest
//! for ever.

use super::chain::PageSource;
use super::working_set;
use crate::digest::{digest_of, zero_page_hash};
use crate::error::SnapshotError;
use ferry_vm::uffd::{DeviceFaults, Fault, Placed, Placer};
use ferry_vm::{FetchError, Gfn, GuestRam, PageBits, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Pages read for one touch: the page and the missing ones after it (a
/// guest that touches page g soon touches g + 1).
const FAULT_PAGES: u64 = 16;
/// Pages the fill reads at once (1 MiB).
const FILL_PAGES: u64 = 256;
/// How long the fault thread waits for events before it looks at `stop`.
const FAULT_POLL: Duration = Duration::from_millis(50);
/// Threads that read the working set. While it comes in, the vCPUs mostly
/// wait on their faults, so a second reader has a core; the rest of
/// memory is read by one, so that a guest running flat out once its
/// working set is in keeps the other.
const WORKING_SET_READERS: usize = 2;

/// What the fault thread, the fill and the vCPUs' fault exits share.
struct Shared {
    /// Where each frame's page lies (the file, or a diff's chain).
    source: PageSource,
    /// What each frame must hash to.
    hashes: Vec<u64>,
    ram: Arc<GuestRam>,
    placer: RwLock<Option<Placer>>,
    /// Frames in guest memory (shared with a VM's fault exits).
    present: Arc<PageBits>,
    /// Frames of the working set.
    working_set: PageBits,
    working_set_left: AtomicU64,
    /// RAM frames not placed yet.
    left: AtomicU64,
    /// Fill readers still running ([`Shared::reader_ended`]).
    readers: AtomicUsize,
    start: Instant,
    working_set_ns: AtomicU64,
    resident_ns: AtomicU64,
    /// The owner ended the restore: nothing more is placed.
    stop: AtomicBool,
    /// A page failed: the fill stops, while touches of good pages are
    /// still served until the owner has stopped the guest.
    failed: AtomicBool,
    /// The first failure.
    failure: Mutex<Option<SnapshotError>>,
    /// Signalled when the last page is placed, or on a failure.
    done: (Mutex<()>, Condvar),
    blocking_faults: AtomicU64,
    fault_pages: AtomicU64,
    bytes_read: AtomicU64,
    /// Frames the guest touched before they were in, in the order it
    /// touched them, each once (up to [`MAX_FIRST_TOUCHES`]).
    first_touches: Mutex<Vec<u64>>,
}

/// The most first touches a restore records (2 MiB of them).
pub const MAX_FIRST_TOUCHES: usize = 1 << 18;

/// A lazy restore's pages while they come in.
pub(super) struct LazyPages {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The threads serving devices in other processes
    /// ([`LazyPages::serve_devices`]), and the faults they served once
    /// stopped.
    devices: Option<DeviceFaults>,
    devices_served: bool,
    device_faults: u64,
    /// The owner ended it ([`LazyPages::finish`] or [`LazyPages::abandon`]).
    ended: bool,
}

/// What a lazy restore did, once every page is in.
pub(super) struct LazyReport {
    pub working_set_ms: f64,
    pub resident_ms: f64,
    pub blocking_faults: u64,
    pub fault_pages: u64,
    pub bytes_read: u64,
    /// Whether devices in other processes had their faults served.
    pub devices_served: bool,
    /// Of the blocking faults, those of devices in other processes.
    pub device_faults: u64,
    /// Frames the guest touched before they were in, in order.
    pub first_touches: Vec<u64>,
    /// The digest of the pages placed: a frame's recorded hash once it is
    /// in (each was checked against it before it was placed), 0 while it
    /// is not. It matches the snapshot's only once every frame is in.
    pub digest: u64,
}

impl LazyPages {
    /// Empties `ram` and registers it, then starts serving touches of
    /// missing pages from `file` (hashes `hashes`), and the fill: the
    /// snapshot's `working_set` first if `working_set_first` (by the
    /// aligned chunks that hold it: [`working_set::chunks`]), then address
    /// order. `start` is when the restore began, for the times
    /// reported (among them when the working set was in, either way).
    pub fn start(
        source: PageSource,
        ram: Arc<GuestRam>,
        hashes: Vec<u64>,
        working_set: &[(u64, u64)],
        working_set_first: bool,
        start: Instant,
    ) -> Result<Self, SnapshotError> {
        let lazy = |detail: String| SnapshotError::Lazy { detail };
        if ram.backing() == ferry_vm::Backing::Hugetlb {
            return Err(lazy(
                "its memory is on hugetlb, which this release restores eagerly only".into(),
            ));
        }
        let frames = ram.pages();
        let runs = ram.ram_runs(Gfn(0), frames);
        // Registered first, so that from the discard on nothing but a copy
        // from the file fills a page (a touch in between would otherwise
        // find fresh zeros).
        let placer = Placer::register_for_faults(&ram)
            .map_err(|e| lazy(format!("it needs userfaultfd: {e}")))?;
        // What the VM's factory wrote (a guest image, firmware) is not the
        // snapshot's: every page comes from the file.
        for &(first, n) in &runs {
            ram.discard(first, n)
                .map_err(SnapshotError::ram("empty guest memory for a lazy restore"))?;
        }
        let members = PageBits::new(frames);
        // A frame outside RAM is never placed: it would hold the time up.
        working_set::frames(working_set)
            .filter(|&g| ram.is_ram(g))
            .for_each(|g| {
                members.insert(g);
            });
        let shared = Arc::new(Shared {
            source,
            hashes,
            placer: RwLock::new(Some(placer)),
            present: Arc::new(PageBits::new(frames)),
            working_set_left: AtomicU64::new(members.count()),
            working_set: members,
            left: AtomicU64::new(runs.iter().map(|&(_, n)| n).sum()),
            readers: AtomicUsize::new(0),
            start,
            working_set_ns: AtomicU64::new(0),
            resident_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            done: (Mutex::new(()), Condvar::new()),
            blocking_faults: AtomicU64::new(0),
            fault_pages: AtomicU64::new(0),
            first_touches: Mutex::new(Vec::new()),
            bytes_read: AtomicU64::new(0),
            ram,
        });
        let mut pages = LazyPages {
            shared: Arc::clone(&shared),
            threads: Vec::new(),
            devices: None,
            devices_served: false,
            device_faults: 0,
            ended: false,
        };
        let s = Arc::clone(&shared);
        if let Err(e) = pages.spawn("lazy-faults", move || serve_faults(&s)) {
            pages.abandon();
            return Err(e);
        }
        let mut order: Vec<(u64, u64)> = match working_set_first {
            true => working_set::chunks(working_set, FILL_PAGES),
            false => Vec::new(),
        };
        let working_set_entries = order.len();
        order.extend(runs.iter().map(|&(g, n)| (g.0, n)));
        let queue = Arc::new(FillQueue {
            order,
            working_set_entries,
            next: AtomicUsize::new(0),
        });
        let readers = match working_set_entries {
            0 => 1,
            _ => WORKING_SET_READERS,
        };
        shared.readers.store(readers, Ordering::SeqCst);
        for reader in 0..readers {
            let (s, q) = (Arc::clone(&shared), Arc::clone(&queue));
            // Reader 0 goes on to the rest of memory; the others stop
            // at the end of the working set.
            let all = reader == 0;
            if let Err(e) = pages.spawn("lazy-fill", move || {
                let _running = ReaderRunning(&s);
                fill(&s, &q, all)
            }) {
                pages.abandon();
                return Err(e);
            }
        }
        Ok(pages)
    }

    fn spawn(
        &mut self,
        name: &str,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), SnapshotError> {
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(body)
            .map_err(|e| SnapshotError::Lazy {
                detail: format!("cannot start its {name} thread: {e}"),
            })?;
        self.threads.push(handle);
        Ok(())
    }

    /// Serves the faults of `devices`, which map guest memory in other
    /// processes (a vhost-user backend), as a postcopy destination does:
    /// each page is brought in as a vCPU's touch would bring it, and the
    /// device is woken. Called before the guest starts, and so before the
    /// devices touch guest memory (they start with it): a touch before
    /// their registration would find a hole and fill it with zeros.
    pub fn serve_devices(&mut self, devices: Vec<ferry_vm::DeviceUserfaultfd>) {
        if !devices.is_empty() {
            self.devices = Some(DeviceFaults::start(devices, self.fault_exits().fetch));
            self.devices_served = true;
        }
    }

    /// The fault exits for a VM whose vCPUs bring in their own pages.
    pub fn fault_exits(&self) -> ferry_vm::FaultExits {
        let s = Arc::clone(&self.shared);
        ferry_vm::FaultExits {
            present: Arc::clone(&self.shared.present),
            fetch: Arc::new(move |gfn: Gfn| {
                touched(&s, gfn, &mut Vec::new()).map_err(|e| FetchError::Place {
                    gfn,
                    cause: Box::new(e),
                })
            }),
        }
    }

    /// Waits until every page is in, or one fails its check. On a
    /// failure `stop_guest` is called while good pages are still served
    /// (a vCPU or device thread waiting for one can then stop), and the
    /// registration ends only once it has returned: no thread waiting for
    /// the failed page runs on without it.
    pub fn finish(
        mut self,
        stop_guest: impl FnOnce() -> Result<(), SnapshotError>,
    ) -> Result<LazyReport, SnapshotError> {
        self.ended = true;
        let mut failure = self.wait_all_in();
        if failure.is_none() {
            self.halt();
            // A failure recorded as the last page came in (a touch of a
            // frame that is not RAM) still counts.
            failure = self.shared.take_failure();
        }
        if let Some(e) = failure {
            let stopped = stop_guest();
            self.halt();
            match stopped {
                Ok(()) => self.shared.end_registration(),
                Err(stop) => {
                    // The guest may still run: its vCPUs stay held rather
                    // than run on without the page.
                    tracing::error!("cannot stop the guest after a failed restore: {stop}");
                    self.shared.hold_for_ever();
                }
            }
            return Err(e);
        }
        self.shared.end_registration();
        let s = &self.shared;
        let ms_of = |ns: &AtomicU64| ns.load(Ordering::SeqCst) as f64 / 1e6;
        // Holes are never placed: they hold what the file records.
        let placed: Vec<u64> = (0..s.hashes.len() as u64)
            .map(Gfn)
            .map(|g| match s.present.contains(g) || !s.ram.is_ram(g) {
                true => s.hashes[g.0 as usize],
                false => 0,
            })
            .collect();
        Ok(LazyReport {
            working_set_ms: ms_of(&s.working_set_ns),
            resident_ms: ms_of(&s.resident_ns),
            blocking_faults: s.blocking_faults.load(Ordering::SeqCst),
            fault_pages: s.fault_pages.load(Ordering::SeqCst),
            bytes_read: s.bytes_read.load(Ordering::SeqCst),
            devices_served: self.devices_served,
            device_faults: self.device_faults,
            first_touches: std::mem::take(
                &mut *s.first_touches.lock().unwrap_or_else(|p| p.into_inner()),
            ),
            digest: digest_of(&placed).value,
        })
    }

    /// Ends the restore before the guest ran: the pages stop coming.
    pub fn abandon(mut self) {
        self.ended = true;
        self.halt();
        self.shared.end_registration();
    }

    /// Waits for the last page or the first failure; returns the failure.
    fn wait_all_in(&self) -> Option<SnapshotError> {
        let s = &self.shared;
        let mut guard = s.done.0.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(e) = s.take_failure() {
                return Some(e);
            }
            if s.left.load(Ordering::SeqCst) == 0 {
                return None;
            }
            guard = s
                .done
                .1
                .wait_timeout(guard, FAULT_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn halt(&mut self) {
        if let Some(devices) = self.devices.take() {
            self.device_faults = devices.stop();
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for LazyPages {
    /// A restore dropped while its guest may run: every page still comes
    /// in before the registration ends, or, after a failure, the
    /// registration is never ended, so that no vCPU runs on without its
    /// page.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        match self.wait_all_in() {
            None => {
                self.halt();
                self.shared.end_registration();
            }
            Some(e) => {
                tracing::error!("a lazy restore dropped after a failure: {e}; its vCPUs stay held");
                self.halt();
                self.shared.hold_for_ever();
            }
        }
    }
}

impl Shared {
    fn fail(&self, e: SnapshotError) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            tracing::error!("lazy restore: {e}");
            *f = Some(e);
        }
        drop(f);
        self.failed.store(true, Ordering::SeqCst);
        let _guard = self.done.0.lock().unwrap_or_else(|p| p.into_inner());
        self.done.1.notify_all();
    }

    /// A fill reader ended. Once a reader is through an entry, each of its
    /// frames is in (placed by it, or found placed by another thread), so
    /// when the last reader ends every RAM frame is in, unless the owner
    /// stopped the restore or a page failed. A frame still out then would
    /// never come, and the owner would wait on it for ever (a reader that
    /// dropped an entry once did just that): the restore fails instead,
    /// naming the frame.
    fn reader_ended(&self) {
        if self.readers.fetch_sub(1, Ordering::SeqCst) != 1
            || self.stop.load(Ordering::SeqCst)
            || self.failed.load(Ordering::SeqCst)
        {
            return;
        }
        let runs = self.ram.ram_runs(Gfn(0), self.ram.pages());
        if let Some(g) = first_missing(&self.present, &runs) {
            self.fail(SnapshotError::Lazy {
                detail: format!(
                    "frame {g:#x} never came in: every fill reader ended without it \
                     (a fault of ferry's, not of the file)"
                ),
            });
        }
    }

    /// The first failure, for the owner.
    fn take_failure(&self) -> Option<SnapshotError> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn end_registration(&self) {
        self.placer
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// Keeps the registration open for the life of the process: a thread
    /// waiting for a page that never came waits on, instead of finding a
    /// page of zeros where the registration ended.
    fn hold_for_ever(&self) {
        let placer = self
            .placer
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        std::mem::forget(placer);
    }

    /// Reads frames `first..first + n` (one RAM run) into `buf`, checking
    /// each against its hash.
    fn read(&self, first: u64, n: u64, buf: &mut Vec<u8>) -> Result<(), SnapshotError> {
        buf.resize(n as usize * PAGE_SIZE, 0);
        let bytes = self.source.read_checked(first, n, buf, &self.hashes)?;
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Places the missing frames of `first..first + n` (one RAM run);
    /// returns how many this call placed. Frames the snapshot recorded as
    /// zeros are mapped as zeros, with nothing read: a guest's free memory
    /// (most of an idle one's) costs no read, copy or hash.
    fn bring_in(&self, first: u64, n: u64, buf: &mut Vec<u8>) -> Result<u64, SnapshotError> {
        // After the end nothing more is placed; a window another thread
        // has brought in already is not read again.
        if self.stop.load(Ordering::SeqCst)
            || (first..first + n).all(|g| self.present.contains(Gfn(g)))
        {
            return Ok(0);
        }
        let zero = zero_page_hash();
        let is_zero = |g: u64| self.hashes[g as usize] == zero;
        let (mut at, end, mut placed) = (first, first + n, 0);
        while at < end {
            let zeros = is_zero(at);
            let k = (at..end).take_while(|&g| is_zero(g) == zeros).count() as u64;
            placed += match zeros {
                true => self.place(at, k, |p, g, i| p.zero(Gfn(g), k - i))?,
                false => {
                    self.read(at, k, buf)?;
                    self.place(at, k, |p, g, i| {
                        p.copy(Gfn(g), &buf[i as usize * PAGE_SIZE..])
                    })?
                }
            };
            at += k;
        }
        Ok(placed)
    }

    /// Places the missing frames of `first..first + n` with `put` (given
    /// the placer, a frame, and its index in the window; it places from
    /// there on, as far as the frames are missing); how many it placed.
    fn place(
        &self,
        first: u64,
        n: u64,
        put: impl Fn(&Placer, u64, u64) -> std::io::Result<Placed>,
    ) -> Result<u64, SnapshotError> {
        let placer = self.placer.read().unwrap_or_else(|p| p.into_inner());
        let Some(p) = placer.as_ref() else {
            return Ok(0);
        };
        let (mut i, mut placed) = (0u64, 0u64);
        while i < n {
            let g = first + i;
            if self.present.contains(Gfn(g)) {
                i += 1;
                continue;
            }
            let placed_now = match put(p, g, i) {
                Ok(Placed::Copied(k)) => k,
                // Page k was placed by another thread, which counts it; it
                // is in memory already, so a fault exit waiting for it can
                // go on before that thread gets to mark it.
                Ok(Placed::PresentAt(k)) => {
                    self.present.insert(Gfn(g + k));
                    k
                }
                Ok(Placed::Unregistered) => {
                    return Err(SnapshotError::Lazy {
                        detail: format!("frame {g:#x} is not registered with userfaultfd"),
                    })
                }
                Err(e) => {
                    return Err(SnapshotError::Lazy {
                        detail: format!("cannot place frame {g:#x}: {e}"),
                    })
                }
            };
            (g..g + placed_now).for_each(|f| self.placed_one(f));
            placed += placed_now;
            i += placed_now.max(1);
        }
        Ok(placed)
    }

    /// Frame `gfn` was placed by this thread (its page checked against its
    /// recorded hash).
    fn placed_one(&self, gfn: u64) {
        self.present.insert(Gfn(gfn));
        let now = || self.start.elapsed().as_nanos() as u64;
        if self.working_set.contains(Gfn(gfn))
            && self.working_set_left.fetch_sub(1, Ordering::SeqCst) == 1
        {
            self.working_set_ns.store(now(), Ordering::SeqCst);
        }
        if self.left.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.resident_ns.store(now(), Ordering::SeqCst);
            let _guard = self.done.0.lock().unwrap_or_else(|p| p.into_inner());
            self.done.1.notify_all();
        }
    }

    /// The run a touch of `gfn` reads: it and the missing frames after it,
    /// within its RAM run.
    fn fault_run(&self, gfn: u64) -> Option<(u64, u64)> {
        let (first, n) = *self.ram.ram_runs(Gfn(gfn), FAULT_PAGES).first()?;
        if first.0 != gfn {
            return None;
        }
        let n = (0..n)
            .take_while(|&i| i == 0 || !self.present.contains(Gfn(gfn + i)))
            .count() as u64;
        Some((gfn, n))
    }
}

/// A touch of `gfn` (a fault exit, or a userfaultfd event): brings it in,
/// through `buf`, unless it is in already.
fn touched(s: &Shared, gfn: Gfn, buf: &mut Vec<u8>) -> Result<(), SnapshotError> {
    s.blocking_faults.fetch_add(1, Ordering::Relaxed);
    if s.present.contains(gfn) {
        return Ok(());
    }
    {
        // The order the guest asks for its pages in, from its first
        // instruction: the next snapshot's working set starts with it.
        let mut order = s.first_touches.lock().unwrap_or_else(|p| p.into_inner());
        if order.len() < MAX_FIRST_TOUCHES {
            order.push(gfn.0);
        }
    }
    let Some((first, n)) = s.fault_run(gfn.0) else {
        let words = format!("the guest touched frame {:#x}, which is not RAM", gfn.0);
        s.fail(SnapshotError::Lazy {
            detail: words.clone(),
        });
        return Err(SnapshotError::Lazy { detail: words });
    };
    match s.bring_in(first, n, buf) {
        Ok(placed) => {
            s.fault_pages.fetch_add(placed, Ordering::Relaxed);
        }
        Err(e) => {
            let words = e.to_string();
            s.fail(e);
            return Err(SnapshotError::Lazy { detail: words });
        }
    }
    if s.present.contains(gfn) {
        Ok(())
    } else {
        Err(SnapshotError::Lazy {
            detail: format!("frame {:#x} did not come in: the restore failed", gfn.0),
        })
    }
}

/// The fault thread: userfaultfd events, until stopped.
fn serve_faults(s: &Shared) {
    let mut faults: Vec<Fault> = Vec::new();
    let mut buf = Vec::new();
    while !s.stop.load(Ordering::SeqCst) {
        faults.clear();
        {
            let placer = s.placer.read().unwrap_or_else(|p| p.into_inner());
            let Some(p) = placer.as_ref() else {
                return;
            };
            if let Err(e) = p.wait_faults(FAULT_POLL, &mut faults) {
                s.fail(SnapshotError::Lazy {
                    detail: format!("cannot read userfaultfd events: {e}"),
                });
                return;
            }
        }
        for f in &faults {
            // A failure is recorded for the owner already; the thread
            // that touched the failed page waits until the owner stops
            // the guest, and touches of good pages are still served.
            let _ = touched(s, f.gfn, &mut buf);
        }
    }
}

/// What the fill brings in, in order, shared by its readers: the working
/// set's chunks (the first `working_set_entries`), then every RAM run.
struct FillQueue {
    order: Vec<(u64, u64)>,
    working_set_entries: usize,
    /// The next entry a reader takes.
    next: AtomicUsize,
}

impl FillQueue {
    /// Takes the next entry for a reader; `all` readers take any, the
    /// others only the working set's. An entry a reader may not take is
    /// left in the queue for one that may: taking it and dropping it
    /// would leave its frames to no one, and the restore would wait on
    /// them for ever.
    fn take(&self, all: bool) -> Option<(u64, u64)> {
        let end = match all {
            true => self.order.len(),
            false => self.working_set_entries.min(self.order.len()),
        };
        self.next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| {
                (i < end).then_some(i + 1)
            })
            .ok()
            .map(|i| self.order[i])
    }
}

/// Held by a fill reader's thread while it runs: ends it on any way out,
/// a panic included.
struct ReaderRunning<'a>(&'a Shared);

impl Drop for ReaderRunning<'_> {
    fn drop(&mut self) {
        self.0.reader_ended();
    }
}

/// The first frame of `runs` not in `present`.
fn first_missing(present: &PageBits, runs: &[(Gfn, u64)]) -> Option<u64> {
    runs.iter()
        .flat_map(|&(first, n)| first.0..first.0 + n)
        .find(|&g| !present.contains(Gfn(g)))
}

/// A fill reader: takes the queue's next entry and brings in its frames
/// that are not in yet, until the queue ends (or, unless `all`, the
/// working set does).
fn fill(s: &Shared, q: &FillQueue, all: bool) {
    let mut buf = Vec::new();
    while let Some((first, n)) = q.take(all) {
        if !fill_entry(s, first, n, &mut buf) {
            return;
        }
    }
}

/// Brings in the frames of `first..first + n` that are not in yet, up to
/// [`FILL_PAGES`] at a time; false where the fill must end.
fn fill_entry(s: &Shared, first: u64, n: u64, buf: &mut Vec<u8>) -> bool {
    for (run, len) in s.ram.ram_runs(Gfn(first), n) {
        let mut g = run.0;
        let end = run.0 + len;
        while g < end {
            if s.stop.load(Ordering::SeqCst)
                || s.failed.load(Ordering::SeqCst)
                || s.left.load(Ordering::SeqCst) == 0
            {
                return false;
            }
            if s.present.contains(Gfn(g)) {
                g += 1;
                continue;
            }
            let mut m = 1;
            while m < FILL_PAGES && g + m < end && !s.present.contains(Gfn(g + m)) {
                m += 1;
            }
            if let Err(e) = s.bring_in(g, m, buf) {
                s.fail(e);
                return false;
            }
            g += m;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_missing_frame_is_found_in_ram_only() {
        let present = PageBits::new(64);
        let runs = [(Gfn(0), 8), (Gfn(32), 8)];
        assert_eq!(first_missing(&present, &runs), Some(0));
        (0..8).chain(32..40).for_each(|g| {
            present.insert(Gfn(g));
        });
        // Frames between the runs are not RAM: never placed, never owed.
        assert_eq!(first_missing(&present, &runs), None);
        let present = PageBits::new(64);
        (0..8).chain(32..36).chain(37..40).for_each(|g| {
            present.insert(Gfn(g));
        });
        assert_eq!(first_missing(&present, &runs), Some(36));
    }

    /// Two readers limited to the working set and one that takes all,
    /// racing: every entry is taken exactly once, and the limited ones
    /// never take past the working set.
    #[test]
    fn every_entry_of_the_fill_queue_is_taken_once_whoever_races_for_it() {
        for round in 0..200 {
            let q = Arc::new(FillQueue {
                order: (0..64).map(|i| (i, 1)).collect(),
                working_set_entries: 16 + round % 8,
                next: AtomicUsize::new(0),
            });
            let readers: Vec<_> = [false, false, true]
                .into_iter()
                .map(|all| {
                    let q = Arc::clone(&q);
                    std::thread::spawn(move || {
                        let mut taken = Vec::new();
                        while let Some((first, _)) = q.take(all) {
                            taken.push(first);
                        }
                        (all, taken)
                    })
                })
                .collect();
            let mut seen = Vec::new();
            for r in readers {
                let (all, taken) = r.join().unwrap();
                if !all {
                    let ws = q.working_set_entries as u64;
                    assert!(taken.iter().all(|&f| f < ws), "{taken:?}");
                }
                seen.extend(taken);
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..64).collect::<Vec<u64>>());
        }
    }
}
