//! The MMU lock: shared for faults, exclusive for structural changes, with
//! one reader slot per vCPU.
//!
//! Faults take the lock shared on every slow-path access. With one shared
//! reader count, as in a plain rwlock, every fault on every vCPU does two
//! atomic read-modify-writes on the same cache line, which bounces between
//! cores. With `std::sync::RwLock` (and shared event counters, see
//! counter.rs) the dirty-log experiment's read-heavy pass took several times
//! longer at 2 vCPUs than at 1, for the same faults; with per-vCPU slots it
//! no longer does. Here each vCPU counts itself in on its own cache line;
//! host threads share one more slot. A writer raises its flag and waits for
//! every slot to drain.
//!
//! ```text
//!  reader v: slot[v] += 1; if writer { slot[v] -= 1; wait until !writer; retry }
//!  writer:   cmpxchg writer false → true; wait ∀ slots == 0 ... writer = false
//! ```
//!
//! Both sides store their own flag, then load the other's, all `SeqCst`, so
//! a reader and a writer can never both go ahead (Dekker).

use crate::spin::back_off;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[repr(align(64))]
#[derive(Default)]
struct ReaderSlot(AtomicU64);

/// The MMU lock.
pub struct MmuLock {
    /// One per vCPU, then one for host threads.
    readers: Box<[ReaderSlot]>,
    /// Held by the one writer (writers take it by compare-exchange).
    writer: AtomicBool,
}

/// The lock held shared.
pub struct ReadGuard<'a> {
    slot: &'a AtomicU64,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.slot.fetch_sub(1, Ordering::Release);
    }
}

/// The lock held exclusively.
pub struct WriteGuard<'a> {
    lock: &'a MmuLock,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.lock.writer.store(false, Ordering::Release);
    }
}

impl MmuLock {
    /// A lock with reader slots for `vcpus` vCPUs and the host threads.
    pub fn new(vcpus: usize) -> Self {
        MmuLock {
            readers: (0..=vcpus).map(|_| ReaderSlot::default()).collect(),
            writer: AtomicBool::new(false),
        }
    }

    /// Takes the lock shared for vCPU `vcpu` (None: a host thread).
    /// `while_waiting` runs while a writer holds it (a vCPU keeps
    /// acknowledging remote flushes there).
    pub fn read(&self, vcpu: Option<usize>, mut while_waiting: impl FnMut()) -> ReadGuard<'_> {
        let host = self.readers.len() - 1;
        let slot = &self.readers[vcpu.map_or(host, |v| v.min(host))].0;
        let mut spins = 0;
        loop {
            slot.fetch_add(1, Ordering::SeqCst);
            if !self.writer.load(Ordering::SeqCst) {
                return ReadGuard { slot };
            }
            slot.fetch_sub(1, Ordering::SeqCst);
            while self.writer.load(Ordering::Acquire) {
                while_waiting();
                back_off(&mut spins, 16);
            }
        }
    }

    /// Takes the lock exclusively.
    pub fn write(&self) -> WriteGuard<'_> {
        let mut spins = 0;
        while self
            .writer
            .compare_exchange_weak(false, true, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            back_off(&mut spins, 16);
        }
        for r in self.readers.iter() {
            while r.0.load(Ordering::SeqCst) != 0 {
                back_off(&mut spins, 16);
            }
        }
        WriteGuard { lock: self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    #[test]
    fn readers_and_writers_exclude_each_other() {
        let lock = Arc::new(MmuLock::new(3));
        let readers_in = Arc::new(AtomicU32::new(0));
        let writers_in = Arc::new(AtomicU32::new(0));
        let violations = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..5)
            .map(|t| {
                let (lock, r, w, bad) = (
                    Arc::clone(&lock),
                    Arc::clone(&readers_in),
                    Arc::clone(&writers_in),
                    Arc::clone(&violations),
                );
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        if t == 4 && i % 4 == 0 {
                            let _g = lock.write();
                            if w.fetch_add(1, Ordering::SeqCst) != 0
                                || r.load(Ordering::SeqCst) != 0
                            {
                                bad.fetch_add(1, Ordering::SeqCst);
                            }
                            std::hint::spin_loop();
                            w.fetch_sub(1, Ordering::SeqCst);
                        } else {
                            let vcpu = if t < 3 { Some(t) } else { None };
                            let _g = lock.read(vcpu, || {});
                            r.fetch_add(1, Ordering::SeqCst);
                            if w.load(Ordering::SeqCst) != 0 {
                                bad.fetch_add(1, Ordering::SeqCst);
                            }
                            r.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(violations.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_waiting_reader_runs_its_callback_and_enters_once_the_writer_leaves() {
        let lock = Arc::new(MmuLock::new(1));
        let g = lock.write();
        let l2 = Arc::clone(&lock);
        let calls = Arc::new(AtomicU32::new(0));
        let entered = Arc::new(AtomicU32::new(0));
        let (c2, e2) = (Arc::clone(&calls), Arc::clone(&entered));
        let reader = std::thread::spawn(move || {
            let _r = l2.read(Some(0), || {
                c2.fetch_add(1, Ordering::SeqCst);
            });
            e2.fetch_add(1, Ordering::SeqCst);
        });
        // Bounded, so that a reader that never calls back fails here
        // instead of hanging the suite.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while calls.load(Ordering::SeqCst) < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the waiting reader did not run its callback"
            );
            std::hint::spin_loop();
        }
        assert_eq!(
            entered.load(Ordering::SeqCst),
            0,
            "the reader entered while the writer held the lock"
        );
        drop(g);
        reader.join().unwrap();
        assert_eq!(entered.load(Ordering::SeqCst), 1);
    }
}
