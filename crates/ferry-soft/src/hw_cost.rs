//! Modelled hardware costs: the two things a stage-2 fault costs on real
//! hardware that a software MMU has no way to incur by itself.
//!
//! The soft MMU does every fault's page-table work for real. What it cannot
//! do is leave the guest and come back, or broadcast a TLB invalidation over
//! an interconnect. Experiments that reproduce a seed's hardware table can
//! switch these costs on; both default to 0 everywhere else, and every table
//! says which were on.
//!
//! ```text
//!  cost             paid by                      when
//!  exit             the faulting vCPU            every fault (VM exit + re-entry)
//!  broadcast TLBI   whoever flushes remotely     every remote flush, e.g. the
//!                   (queued on the one DVM path) break-before-make of a split on fault
//! ```
//!
//! Broadcast invalidations are serialised: each takes the modelled cost of the
//! single distributed-virtual-memory (DVM) path's time, so concurrent flushes
//! queue, as the seed reports ("milliseconds to complete
//! broadcasted TLBIs when done in parallel from multiple vcpus"). Permission
//! relaxation needs no remote flush (the seed's local-TLBI patch), so eager
//! splitting's write faults never pay it.
//!
//! Both constants come from the eager-splitting seed's own tables, at 1 vCPU.
//! Those two cells therefore calibrate the model and are not evidence for it;
//! the other vCPU counts are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One stage-2 fault's exit and re-entry, from the seed's read-heavy table:
/// 0.65 s with split on fault and 0.09 s eager over 1 GiB at 1 vCPU, the
/// difference being ~257k extra faults, about 2.2 µs each (rounded down).
pub const SEED_EXIT_COST_NS: u64 = 2000;

/// One broadcast TLB invalidation and its DSB, from the seed's write-only
/// table: at 1 vCPU a split fault took (3.34 − 1.85) ms / 512 = 2.9 µs more
/// than a permission-relaxation fault, which the seed puts down mainly to the
/// broadcast TLBI of break-before-make. The soft MMU's own split work is
/// about 0.4 µs more than its relaxation, leaving 2.5 µs to model.
pub const SEED_BROADCAST_TLBI_NS: u64 = 2500;

/// Busy-waits `ns` nanoseconds on this thread (a modelled cost is time the
/// CPU is not free for other work, so it is spun, not slept).
pub fn spin_for(ns: u64) {
    if ns == 0 {
        return;
    }
    let until = Instant::now() + Duration::from_nanos(ns);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// The single path broadcast invalidations travel: one at a time.
///
/// A flusher reserves the next free slot of the path's timeline and waits for
/// its slot to end, so concurrent invalidations queue behind each other in
/// time. The timeline is kept in wall-clock time rather than by a lock held
/// while spinning: a flusher thread that the host deschedules (there may be
/// more vCPU threads than cores) does not hold up everyone queued behind it,
/// as a real processing element waiting in a DSB never would.
pub struct DvmPath {
    epoch: Instant,
    /// End of the last reserved slot, in ns since `epoch`.
    free_at: AtomicU64,
}

impl Default for DvmPath {
    fn default() -> Self {
        DvmPath {
            epoch: Instant::now(),
            free_at: AtomicU64::new(0),
        }
    }
}

impl DvmPath {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Reserves `ns` of the path from `now` on: the slot starts when the path
    /// is free, and no two slots overlap. Returns (start, end).
    fn reserve(&self, now: u64, ns: u64) -> (u64, u64) {
        let mut free = self.free_at.load(Ordering::Relaxed);
        loop {
            let start = free.max(now);
            match self.free_at.compare_exchange_weak(
                free,
                start + ns,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return (start, start + ns),
                Err(f) => free = f,
            }
        }
    }

    /// Where the path's timeline is reserved up to, in ns since it was made.
    #[cfg(test)]
    pub(crate) fn reserved_until_ns(&self) -> u64 {
        self.free_at.load(Ordering::Acquire)
    }

    /// Sends one broadcast invalidation costing `ns` of the path and waits
    /// until it has completed. `while_waiting` runs between spins (a vCPU uses
    /// it to keep acknowledging others' flushes, so waiters never deadlock).
    pub fn occupy(&self, ns: u64, mut while_waiting: impl FnMut()) {
        if ns == 0 {
            return;
        }
        let (_, end) = self.reserve(self.now_ns(), ns);
        while self.now_ns() < end {
            while_waiting();
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Holds under every interleaving: whichever thread reserves first, no
    /// two slots overlap, none starts before it was asked for, and each one
    /// starts either when asked (the path was idle) or exactly when the one
    /// before it ends (queued back to back).
    #[test]
    fn concurrent_reservations_never_overlap() {
        let path = Arc::new(DvmPath::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let path = Arc::clone(&path);
                std::thread::spawn(move || {
                    (0..500)
                        .map(|i| {
                            let now = (i * 7 + t) % 300;
                            let (start, end) = path.reserve(now, 10);
                            (start, end, now)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut slots: Vec<(u64, u64, u64)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        slots.sort_unstable();
        assert_eq!(slots.len(), 2000);
        for &(start, end, now) in &slots {
            assert_eq!(end - start, 10);
            assert!(
                start >= now,
                "slot {start} starts before it was asked ({now})"
            );
        }
        assert_eq!(
            slots[0].0, slots[0].2,
            "an idle path starts the first slot at once"
        );
        for w in slots.windows(2) {
            let (prev_end, (start, _, now)) = (w[0].1, w[1]);
            assert!(prev_end <= start, "slots {:?} and {:?} overlap", w[0], w[1]);
            assert_eq!(start, prev_end.max(now), "a queued slot follows at once");
        }
        assert_eq!(path.reserved_until_ns(), slots.last().unwrap().1);
    }

    #[test]
    fn a_slot_starts_no_earlier_than_asked() {
        let path = DvmPath::default();
        assert_eq!(path.reserve(100, 10), (100, 110));
        assert_eq!(path.reserve(50, 10), (110, 120), "queued behind the first");
        assert_eq!(
            path.reserve(500, 10),
            (500, 510),
            "idle path: starts at once"
        );
    }

    #[test]
    fn zero_cost_reserves_nothing() {
        let path = DvmPath::default();
        path.occupy(0, || panic!("must not wait"));
        assert_eq!(path.free_at.load(Ordering::Relaxed), 0);
        spin_for(0);
    }
}
