//! The destination's side of postcopy: fault handler threads (one by
//! default; `--fault-handlers`) turn the guest's touches of missing pages
//! into page requests, and a reader thread places the answers.
//!
//! ```text
//!  vCPU touches a missing page ── kernel blocks it, queues a uffd event
//!  uffd-handler: wait_faults ─► page known zero here? place it locally
//!                             └► else PageRequest(first, prefetch run) ──► priority connection
//!  prio-reader:  Pages ─► place once (UFFDIO_COPY wakes the vCPU), hash, count block time
//! ```
//!
//! The vCPU never leaves the kernel: `KVM_RUN` (or a soft vCPU's load)
//! simply resumes once the copy lands. On this project's hosts that round
//! trip costs tens of microseconds a page even locally (`ferry bench
//! demand-paging` measures the fault path: docs/postcopy.md); prefetching
//! the following missing pages in the same request spreads it.

use crate::error::MigrationError;
use crate::session::Loaded;
use crate::summary::PostcopyReport;
use crate::transport::health::spawn;
use crate::transport::{Channel, Health};
use crate::wire::frame::FRAME_HEADER_LEN;
use crate::wire::{decode_batch, FrameKind, FrameStream, StreamError};
use ferry_vm::uffd::Fault;
use ferry_vm::Gfn;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the fault handler waits for events before it looks at `stop`.
const FAULT_POLL: Duration = Duration::from_millis(50);

/// What a vCPU with annotated memory-fault exits calls, on its own thread,
/// for a page that is not present: it asks for the page (and up to
/// `prefetch` − 1 missing ones after it) itself, with no handler thread in
/// between, and waits for the placement. Fails once postcopy has ended
/// without the page (the migration failed: the vCPU stops).
pub(crate) fn fetcher(loaded: Arc<Loaded>, prefetch: u32) -> ferry_vm::FetchPage {
    let prefetch = prefetch.clamp(1, crate::wire::messages::MAX_REQUEST_PAGES);
    Arc::new(move |gfn: Gfn| {
        loaded.requests.exits.fetch_add(1, Ordering::Relaxed);
        let thread = ferry_vm::current_thread_id();
        loop {
            let seen = loaded.placements();
            if loaded.is_present(gfn) {
                return Ok(());
            }
            if !loaded.placing() {
                return Err(ferry_vm::FetchError::Ended(gfn));
            }
            if loaded.zero_here(gfn) {
                loaded
                    .place_zero(gfn)
                    .map_err(|e| ferry_vm::FetchError::Place {
                        gfn,
                        cause: Box::new(e),
                    })?;
                continue;
            }
            let ask = loaded.clock.ask(gfn, thread, prefetch, |g| {
                g.0 < loaded.pages && !loaded.is_present(g)
            });
            if let Some(count) = ask {
                // A write that fails is a broken connection, which the
                // migration notices elsewhere and recovers from.
                if let Err(e) = loaded.requests.send(gfn.0, count) {
                    tracing::debug!("a vCPU's page request: {}", e.chain());
                }
            }
            loaded.wait_placed(seen, PLACED_WAIT);
        }
    })
}

/// How faults are served.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Handling {
    /// Pages asked for per fault.
    pub prefetch: u32,
    /// Handler threads reading the one userfaultfd: each takes the events
    /// queued when it wakes, so a burst of faults from several vCPUs is
    /// served in parallel.
    pub handlers: usize,
    /// Handlers spin on the userfaultfd instead of sleeping in `poll`: no
    /// wake-up latency, at the price of a CPU each.
    pub busy_poll: bool,
}

/// Longest a fetching vCPU sleeps before it looks again.
const PLACED_WAIT: Duration = Duration::from_millis(5);

struct Shared {
    loaded: Arc<Loaded>,
    health: Arc<Health>,
    stop: AtomicBool,
    busy_poll: bool,
    prefetch: u32,
    faults: AtomicU64,
    pages_requested: AtomicU64,
}

/// The running fault handler and priority reader of one migration.
pub(crate) struct Pager {
    shared: Arc<Shared>,
    link: Box<dyn crate::transport::Link>,
    threads: Vec<JoinHandle<()>>,
}

impl Pager {
    /// Starts serving faults on `loaded`'s registration, asking on `io`
    /// (the priority connection) for `prefetch` pages per fault, with
    /// `handlers` threads. After a recovery (`ask_again`), first asks
    /// again for every page asked for before the connections broke and not
    /// placed since: the vCPUs that wait for them raised their faults
    /// already.
    pub fn start(
        io: Channel,
        loaded: Arc<Loaded>,
        health: Arc<Health>,
        handling: Handling,
        ask_again: bool,
    ) -> Result<Self, MigrationError> {
        let Handling {
            prefetch,
            handlers,
            busy_poll,
        } = handling;
        let link = io.get_ref();
        let write_half = link.try_clone_link().map_err(StreamError::Io)?;
        write_half
            .set_write_timeout_link(Some(health.stall_timeout()))
            .map_err(StreamError::Io)?;
        let shutdown = link.try_clone_link().map_err(StreamError::Io)?;
        loaded.requests.install(Some(FrameStream::new(write_half)));
        let shared = Arc::new(Shared {
            loaded,
            health,
            stop: AtomicBool::new(false),
            busy_poll,
            prefetch: prefetch.clamp(1, crate::wire::messages::MAX_REQUEST_PAGES),
            faults: AtomicU64::new(0),
            pages_requested: AtomicU64::new(0),
        });
        if ask_again {
            ask_again_for_pending(&shared)?;
        }
        // Hugetlb: the current pages the switchover dropped with their huge
        // pages (a recovery finds those not placed among the pending).
        for (first, n) in shared.loaded.take_extras() {
            shared.loaded.clock.prefetched(first, n);
            shared.loaded.requests.send(first, n)?;
        }
        let mut threads = Vec::new();
        for i in 0..handlers.clamp(1, *crate::session::FAULT_HANDLERS.end() as usize) {
            let s = Arc::clone(&shared);
            threads.push(
                spawn(&shared.health, format!("uffd-handler-{i}"), move || {
                    if let Err(e) = handle_faults(&s) {
                        s.health.fail(e);
                    }
                })
                .map_err(StreamError::Io)?,
            );
        }
        let s = Arc::clone(&shared);
        threads.push(
            spawn(&shared.health, "prio-reader".into(), move || {
                if let Err(e) = read_answers(io, &s) {
                    if !s.stop.load(Ordering::SeqCst) {
                        s.health.fail(e);
                    }
                }
            })
            .map_err(StreamError::Io)?,
        );
        Ok(Pager {
            shared,
            link: shutdown,
            threads,
        })
    }

    /// Stops both threads, closes the priority connection, and says what
    /// postcopy did (the caller fills in the times it measured).
    pub fn stop(mut self) -> PostcopyReport {
        self.halt();
        let s = &self.shared;
        PostcopyReport {
            block_ms: s.loaded.clock.block_ms(),
            faults: s.faults.load(Ordering::Relaxed),
            pages_requested: s.pages_requested.load(Ordering::Relaxed),
            ..PostcopyReport::default()
        }
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.loaded.requests.install(None);
        self.link.shutdown_link(Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Sends one request for each run of pages asked for before and still
/// missing.
fn ask_again_for_pending(s: &Shared) -> Result<(), MigrationError> {
    let loaded = &s.loaded;
    let max = u64::from(crate::wire::messages::MAX_REQUEST_PAGES);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for g in loaded.clock.pending() {
        if loaded.is_present(Gfn(g)) || loaded.is_staged(Gfn(g)) {
            continue;
        }
        match runs.last_mut() {
            Some((first, n)) if *first + *n == g && *n < max => *n += 1,
            _ => runs.push((g, 1)),
        }
    }
    for (first, n) in runs {
        loaded.requests.send(first, n as u32)?;
    }
    Ok(())
}

fn handle_faults(s: &Shared) -> Result<(), MigrationError> {
    let loaded = &s.loaded;
    let mut faults = Vec::new();
    while !s.stop.load(Ordering::SeqCst) {
        faults.clear();
        {
            let placer = loaded.placer();
            let Some(p) = placer.as_ref() else {
                return Ok(());
            };
            let read = if s.busy_poll {
                p.read_faults(&mut faults)
            } else {
                p.wait_faults(FAULT_POLL, &mut faults)
            };
            read.map_err(|e| {
                MigrationError::Placement(format!("reading userfaultfd events: {e}"))
            })?;
        }
        if faults.is_empty() && s.busy_poll {
            std::hint::spin_loop();
            continue;
        }
        for &Fault { gfn, thread } in &faults {
            s.faults.fetch_add(1, Ordering::Relaxed);
            if loaded.is_present(gfn) {
                continue;
            }
            if loaded.places_huge_pages() {
                ask_for_huge_page(loaded, gfn, thread)?;
                continue;
            }
            if loaded.zero_here(gfn) {
                loaded.place_zero(gfn)?;
                continue;
            }
            let Some(count) = loaded.clock.ask(gfn, thread, s.prefetch, |g| {
                g.0 < loaded.pages && !loaded.is_present(g)
            }) else {
                continue;
            };
            loaded.requests.send(gfn.0, count)?;
        }
    }
    Ok(())
}

/// A fault of `thread` on hugetlb backing: the whole huge page holding
/// `gfn` is placed at once, so every page of it that is neither here
/// (staged) nor asked for is asked for now; zero pages known here are
/// staged at once.
fn ask_for_huge_page(loaded: &Loaded, gfn: Gfn, thread: u32) -> Result<(), MigrationError> {
    let base = Gfn(gfn.0 / crate::session::HUGE_PAGES * crate::session::HUGE_PAGES);
    for g in (base.0..base.0 + crate::session::HUGE_PAGES).map(Gfn) {
        if loaded.zero_here(g) && !loaded.is_staged(g) {
            loaded.place_zero(g)?;
        }
    }
    let runs = loaded.clock.ask_huge(base, thread, |g| {
        g.0 < loaded.pages && !loaded.is_present(g) && !loaded.is_staged(g)
    });
    for (first, n) in runs {
        loaded.requests.send(first, n)?;
    }
    Ok(())
}

fn read_answers(mut io: Channel, s: &Shared) -> Result<(), MigrationError> {
    let loaded = &s.loaded;
    while let Some((kind, offset)) = io.read_frame_or_end()? {
        s.health
            .add_data_bytes((FRAME_HEADER_LEN + io.payload().len()) as u64);
        if kind != FrameKind::Pages {
            return Err(MigrationError::Protocol {
                expected: "Pages on the priority connection",
                got: kind,
                offset,
            });
        }
        let batch = decode_batch(io.payload(), loaded.pages)
            .map_err(|reason| StreamError::Malformed {
                kind,
                offset,
                reason,
            })?
            .with_page_hashes(io.page_hashes());
        let pages = loaded.apply(&batch)?;
        s.pages_requested.fetch_add(pages, Ordering::Relaxed);
    }
    Ok(())
}
