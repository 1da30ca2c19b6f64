//! The destination's page requests in postcopy, kept with the memory image
//! that places their answers: which pages vCPUs wait for, which vCPU, and
//! how long ([`BlockClock`]), and the priority connection's writing half that asks
//! for them ([`Requests`]). The pager (`crate::postcopy`) and vCPUs with
//! annotated fault exits ask; [`super::Loaded`] ends each wait.

use crate::error::MigrationError;
use crate::transport::Channel;
use crate::wire::Message;
use ferry_vm::Gfn;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A request in flight: the threads that wait on this page, each with
/// when its fault arrived (none: only prefetched).
#[derive(Default)]
struct Asked {
    waiters: Vec<(u32, Instant)>,
}

impl Asked {
    /// `thread` waits from `now` on, unless it waits already.
    fn wait(&mut self, thread: u32, now: Instant) {
        if !self.waiters.iter().any(|(t, _)| *t == thread) {
            self.waiters.push((thread, now));
        }
    }

    fn waiting(thread: u32, now: Instant) -> Self {
        Asked {
            waiters: vec![(thread, now)],
        }
    }
}

/// Width of the bins each thread's waits are counted in.
pub(crate) const BLOCK_BIN: std::time::Duration = std::time::Duration::from_millis(10);

/// What one thread waited for pages: in all, and in each [`BLOCK_BIN`]
/// from the clock's start ([`BlockClock::start`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ThreadWaits {
    pub ns: u64,
    pub waits: u64,
    pub bins_ns: Vec<u64>,
}

impl ThreadWaits {
    /// Counts a wait over `[from, to)`, binned from `origin` (a wait that
    /// began before it counts from it).
    fn add(&mut self, origin: Option<Instant>, from: Instant, to: Instant) {
        self.ns += to.saturating_duration_since(from).as_nanos() as u64;
        self.waits += 1;
        let Some(origin) = origin else { return };
        let bin = BLOCK_BIN.as_nanos() as u64;
        let mut a = from.saturating_duration_since(origin).as_nanos() as u64;
        let b = to.saturating_duration_since(origin).as_nanos() as u64;
        while a < b {
            let i = (a / bin) as usize;
            let end = ((i as u64 + 1) * bin).min(b);
            if self.bins_ns.len() <= i {
                self.bins_ns.resize(i + 1, 0);
            }
            self.bins_ns[i] += end - a;
            a = end;
        }
    }
}

/// The pages asked for and not placed yet, and the time threads (vCPUs,
/// devices) waited for them: a page's wait ends when it is placed, by an
/// answer or by the push, whichever lands first ([`super::Loaded`] calls
/// [`BlockClock::placed`]).
#[derive(Default)]
pub(crate) struct BlockClock {
    asked: Mutex<HashMap<u64, Asked>>,
    block_ns: AtomicU64,
    /// Each waiting thread's waits, by its kernel thread id (0: a fault
    /// event that did not name its thread).
    threads: Mutex<HashMap<u32, ThreadWaits>>,
    origin: std::sync::OnceLock<Instant>,
}

impl BlockClock {
    /// The guest resumed: each thread's waits are binned from now.
    pub(crate) fn start(&self, at: Instant) {
        let _ = self.origin.set(at);
    }

    /// Thread `thread` (a kernel thread id) waits on `gfn`. Returns the run
    /// to ask for (`gfn` and up to `prefetch − 1` following pages that
    /// `missing` says are missing and nobody asked for), or `None` when
    /// `gfn` is asked for already.
    pub(crate) fn ask(
        &self,
        gfn: Gfn,
        thread: u32,
        prefetch: u32,
        missing: impl Fn(Gfn) -> bool,
    ) -> Option<u32> {
        let now = Instant::now();
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = asked.get_mut(&gfn.0) {
            // Prefetched before, or asked by another thread: this one waits too.
            a.wait(thread, now);
            return None;
        }
        asked.insert(gfn.0, Asked::waiting(thread, now));
        let mut n = 1u32;
        while n < prefetch {
            let g = Gfn(gfn.0 + u64::from(n));
            if !missing(g) || asked.contains_key(&g.0) {
                break;
            }
            asked.insert(g.0, Asked::default());
            n += 1;
        }
        Some(n)
    }

    /// Thread `thread` waits on the huge page of 512 frames from `base`:
    /// marks as asked every frame `missing` says is missing and nobody
    /// asked for, and returns them as runs to request. The first missing
    /// frame carries the thread's wait.
    pub(crate) fn ask_huge(
        &self,
        base: Gfn,
        thread: u32,
        missing: impl Fn(Gfn) -> bool,
    ) -> Vec<(u64, u32)> {
        let now = Instant::now();
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        let mut waits = true;
        let mut runs: Vec<(u64, u32)> = Vec::new();
        for g in base.0..base.0 + super::huge::HUGE_PAGES {
            if !missing(Gfn(g)) {
                continue;
            }
            if let Some(a) = asked.get_mut(&g) {
                if waits {
                    a.wait(thread, now);
                }
                waits = false;
                continue;
            }
            let a = if waits {
                Asked::waiting(thread, now)
            } else {
                Asked::default()
            };
            asked.insert(g, a);
            waits = false;
            match runs.last_mut() {
                Some((f, n)) if *f + u64::from(*n) == g => *n += 1,
                _ => runs.push((g, 1)),
            }
        }
        runs
    }

    /// Marks `n` frames from `first` as asked for, with no thread waiting
    /// (pages a hugetlb switchover dropped although current).
    pub(crate) fn prefetched(&self, first: u64, n: u32) {
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        for g in first..first + u64::from(n) {
            asked.entry(g).or_default();
        }
    }

    /// Pages asked for and not placed yet, in order: after the
    /// connections broke their answers may never come, so a recovery asks
    /// again.
    pub(crate) fn pending(&self) -> Vec<u64> {
        let asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<u64> = asked.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Time the guest waited for pages so far, in ms: once per page, from
    /// its first waiter's fault (two vCPUs waiting on one page count once).
    pub fn block_ms(&self) -> f64 {
        self.block_ns.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Each thread's waits so far, by kernel thread id.
    pub(crate) fn by_thread(&self) -> HashMap<u32, ThreadWaits> {
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `n` pages from `first` are in guest memory.
    pub fn placed(&self, first: Gfn, n: u64) {
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        if asked.is_empty() {
            return;
        }
        let now = Instant::now();
        let origin = self.origin.get().copied();
        // Taken once per placement, and only if a thread waited on it.
        let mut threads = None;
        for g in first.0..first.0 + n {
            let Some(a) = asked.remove(&g) else { continue };
            let Some(&(_, first_at)) = a.waiters.first() else {
                continue;
            };
            let ns = now.saturating_duration_since(first_at).as_nanos() as u64;
            self.block_ns.fetch_add(ns, Ordering::Relaxed);
            let threads = threads
                .get_or_insert_with(|| self.threads.lock().unwrap_or_else(|p| p.into_inner()));
            for (t, at) in a.waiters {
                threads.entry(t).or_default().add(origin, at, now);
            }
        }
    }
}

/// The priority connection's writing half, for whoever asks for pages:
/// the fault handler thread, and vCPUs that resolve their own faults
/// (annotated exits). A recovery installs the new connection's.
#[derive(Default)]
pub(crate) struct Requests {
    writer: Mutex<Option<Channel>>,
    sent: AtomicU64,
    /// Memory-fault exits of vCPUs that asked themselves.
    pub exits: AtomicU64,
}

impl Requests {
    pub(crate) fn install(&self, w: Option<Channel>) {
        *self.writer.lock().unwrap_or_else(|p| p.into_inner()) = w;
    }

    /// Asks for `count` pages from `first`. Without a connection (it broke:
    /// the recovery asks again for every pending page) nothing is sent.
    pub(crate) fn send(&self, first: u64, count: u32) -> Result<(), MigrationError> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let Some(w) = w.as_mut() else {
            return Ok(());
        };
        let req = Message::PageRequest { first, count };
        w.write_frame(req.kind(), &[&req.encode()])?;
        w.flush()?;
        self.sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Requests sent so far, over every connection.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_thread_waits_on_its_own_and_the_page_counts_once() {
        let clock = BlockClock::default();
        let t0 = Instant::now();
        clock.start(t0);
        assert_eq!(clock.ask(Gfn(5), 11, 4, |_| true), Some(4));
        // A second vCPU on the same page: nothing more to ask.
        assert_eq!(clock.ask(Gfn(5), 12, 4, |_| true), None);
        // A prefetched page a vCPU then waits on.
        assert_eq!(clock.ask(Gfn(6), 12, 4, |_| true), None);
        std::thread::sleep(Duration::from_millis(25));
        clock.placed(Gfn(5), 2);
        let by = clock.by_thread();
        assert_eq!(by[&11].waits, 1);
        assert_eq!(by[&12].waits, 2);
        // Page 5 counts once in all (from thread 11's fault), page 6 once.
        let each_ms = |t: u32| by[&t].ns as f64 / 1e6;
        assert!(clock.block_ms() >= 50.0 && clock.block_ms() < each_ms(11) + each_ms(12) + 1.0);
        // The bins hold what the totals do, from the start on.
        for w in by.values() {
            assert_eq!(w.bins_ns.iter().sum::<u64>(), w.ns);
            assert!(
                w.bins_ns.len() >= 3,
                "25 ms over 10 ms bins: {:?}",
                w.bins_ns
            );
        }
        assert!(clock.pending() == vec![7, 8], "the prefetch not placed yet");
    }

    #[test]
    fn a_wait_that_began_before_the_start_is_binned_from_it() {
        let mut w = ThreadWaits::default();
        let t0 = Instant::now();
        let origin = t0 + Duration::from_millis(15);
        w.add(Some(origin), t0, origin + Duration::from_millis(12));
        assert_eq!(w.ns, 27_000_000);
        assert_eq!(w.bins_ns, [10_000_000, 2_000_000]);
    }
}
