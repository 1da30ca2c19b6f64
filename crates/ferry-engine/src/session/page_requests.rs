//! The destination's page requests in postcopy, kept with the memory image
//! that places their answers: which pages vCPUs wait for and how long
//! ([`BlockClock`]), and the priority connection's writing half that asks
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

/// A request in flight: when its fault arrived, and whether a vCPU waits
/// on this page (not just prefetched).
#[derive(Copy, Clone)]
struct Asked {
    at: Instant,
    waited: bool,
}

/// The pages asked for and not placed yet, and the time vCPUs waited for
/// them: a page's wait ends when it is placed, by an answer or by the push,
/// whichever lands first ([`super::Loaded`] calls [`BlockClock::placed`]).
#[derive(Default)]
pub(crate) struct BlockClock {
    asked: Mutex<HashMap<u64, Asked>>,
    block_ns: AtomicU64,
}

impl BlockClock {
    /// A vCPU waits on `gfn`. Returns the run to ask for (`gfn` and up to
    /// `prefetch − 1` following pages that `missing` says are missing and
    /// nobody asked for), or `None` when `gfn` is asked for already.
    pub(crate) fn ask(
        &self,
        gfn: Gfn,
        prefetch: u32,
        missing: impl Fn(Gfn) -> bool,
    ) -> Option<u32> {
        let now = Instant::now();
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = asked.get_mut(&gfn.0) {
            // Prefetched before, or asked by another vCPU: now a vCPU waits.
            if !a.waited {
                *a = Asked {
                    at: now,
                    waited: true,
                };
            }
            return None;
        }
        asked.insert(
            gfn.0,
            Asked {
                at: now,
                waited: true,
            },
        );
        let mut n = 1u32;
        while n < prefetch {
            let g = Gfn(gfn.0 + u64::from(n));
            if !missing(g) || asked.contains_key(&g.0) {
                break;
            }
            asked.insert(
                g.0,
                Asked {
                    at: now,
                    waited: false,
                },
            );
            n += 1;
        }
        Some(n)
    }

    /// A vCPU waits on the huge page of 512 frames from `base`: marks as
    /// asked every frame `missing` says is missing and nobody asked for,
    /// and returns them as runs to request. The first frame marked (or
    /// found asked but only prefetched) carries the vCPU's wait.
    pub(crate) fn ask_huge(&self, base: Gfn, missing: impl Fn(Gfn) -> bool) -> Vec<(u64, u32)> {
        let now = Instant::now();
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        let mut waits = true;
        let mut runs: Vec<(u64, u32)> = Vec::new();
        for g in base.0..base.0 + super::huge::HUGE_PAGES {
            if !missing(Gfn(g)) {
                continue;
            }
            if let Some(a) = asked.get_mut(&g) {
                if waits && !a.waited {
                    *a = Asked {
                        at: now,
                        waited: true,
                    };
                }
                waits = false;
                continue;
            }
            asked.insert(
                g,
                Asked {
                    at: now,
                    waited: waits,
                },
            );
            waits = false;
            match runs.last_mut() {
                Some((f, n)) if *f + u64::from(*n) == g => *n += 1,
                _ => runs.push((g, 1)),
            }
        }
        runs
    }

    /// Marks `n` frames from `first` as asked for, with no vCPU waiting
    /// (pages a hugetlb switchover dropped although current).
    pub(crate) fn prefetched(&self, first: u64, n: u32) {
        let now = Instant::now();
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        for g in first..first + u64::from(n) {
            asked.entry(g).or_insert(Asked {
                at: now,
                waited: false,
            });
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

    /// Time vCPUs waited for pages so far, in ms.
    pub fn block_ms(&self) -> f64 {
        self.block_ns.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// `n` pages from `first` are in guest memory.
    pub fn placed(&self, first: Gfn, n: u64) {
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        if asked.is_empty() {
            return;
        }
        let now = Instant::now();
        for g in first.0..first.0 + n {
            if let Some(a) = asked.remove(&g) {
                if a.waited {
                    let ns = now.duration_since(a.at).as_nanos() as u64;
                    self.block_ns.fetch_add(ns, Ordering::Relaxed);
                }
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
