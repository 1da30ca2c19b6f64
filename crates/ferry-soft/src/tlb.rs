//! Per-vCPU software TLBs and the remote TLB flush.
//!
//! Each vCPU caches translations in its own direct-mapped [`Tlb`], so the hit
//! path of a guest access is a tag compare. Whoever changes a mapping in a way
//! that must not be used any more (zap, split, write-protect) calls
//! [`FlushDomain::flush_remote`]: it posts a request and waits until every
//! online vCPU has acknowledged it at an access boundary, after dropping its
//! cached translations. Like a broadcast TLBI, the cost grows with the number
//! of vCPUs, and a vCPU that is not on a CPU delays it.
//!
//! ```text
//!  flusher:  change PTEs ─► req += 1 ─► wait: ∀ online v: ack[v] >= req
//!  vCPU v:   at each access boundary: if ack[v] != req { tlb.clear(); ack[v] = req }
//!  offline (paused, throttled): skipped; clears its TLB when it comes back
//! ```
//!
//! The handshake is the software part of a flush. An experiment can add the
//! hardware part, a modelled broadcast-invalidation cost (hw_cost.rs).
//!
//! A vCPU that must wait inside the MMU (for a lock, or for its own flush)
//! keeps acknowledging others' requests and notes that its TLB must be
//! cleared before its next use, so two flushing vCPUs never wait on each other.

use crate::hw_cost::DvmPath;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// One vCPU's flush state, on its own cache line.
#[repr(align(64))]
#[derive(Default)]
struct Slot {
    ack: AtomicU64,
    online: AtomicBool,
    must_clear: AtomicBool,
}

/// The set of vCPUs a remote flush must reach.
pub struct FlushDomain {
    req: AtomicU64,
    slots: Box<[Slot]>,
    flushes: AtomicU64,
    /// Modelled cost of the broadcast invalidation itself (hw_cost.rs).
    broadcast_cost_ns: AtomicU64,
    dvm: DvmPath,
}

impl FlushDomain {
    /// A domain for `vcpus` vCPUs, all offline.
    pub fn new(vcpus: usize) -> Self {
        FlushDomain {
            req: AtomicU64::new(0),
            slots: (0..vcpus).map(|_| Slot::default()).collect(),
            flushes: AtomicU64::new(0),
            broadcast_cost_ns: AtomicU64::new(0),
            dvm: DvmPath::default(),
        }
    }

    /// Makes every remote flush also pay a modelled broadcast-TLBI cost of
    /// `ns`, serialised over one DVM path (see hw_cost.rs; 0 = none, the
    /// default).
    pub fn set_broadcast_cost_ns(&self, ns: u64) {
        self.broadcast_cost_ns.store(ns, Ordering::Relaxed);
    }

    /// Number of vCPU slots.
    pub fn vcpus(&self) -> usize {
        self.slots.len()
    }

    /// Remote flushes issued so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Whether vCPU `v` has a request to acknowledge (the access-boundary check).
    #[inline]
    pub fn pending(&self, v: usize) -> bool {
        self.slots[v].ack.load(Ordering::Relaxed) != self.req.load(Ordering::Relaxed)
            || self.slots[v].must_clear.load(Ordering::Relaxed)
    }

    /// At an access boundary: clears `tlb` if a request is pending and
    /// acknowledges it.
    pub fn service(&self, v: usize, tlb: &mut Tlb) {
        let slot = &self.slots[v];
        let req = self.req.load(Ordering::Acquire);
        if slot.ack.load(Ordering::Relaxed) != req || slot.must_clear.load(Ordering::Relaxed) {
            tlb.clear();
            slot.must_clear.store(false, Ordering::Relaxed);
            slot.ack.store(req, Ordering::Release);
        }
    }

    /// Acknowledges pending requests from inside the MMU, where the TLB is not
    /// at hand: the TLB is cleared at the vCPU's next [`FlushDomain::service`],
    /// which the vCPU runs before it fills or uses its TLB again.
    pub fn ack_deferred(&self, v: usize) {
        let slot = &self.slots[v];
        let req = self.req.load(Ordering::Acquire);
        if slot.ack.load(Ordering::Relaxed) != req {
            slot.must_clear.store(true, Ordering::Relaxed);
            slot.ack.store(req, Ordering::Release);
        }
    }

    /// Takes the note left by [`FlushDomain::ack_deferred`]: true if the TLB
    /// must be cleared now (the request itself is already acknowledged).
    pub fn take_must_clear(&self, v: usize) -> bool {
        self.slots[v].must_clear.swap(false, Ordering::Relaxed)
    }

    /// vCPU `v` starts running guest accesses.
    pub fn go_online(&self, v: usize, tlb: &mut Tlb) {
        self.slots[v].online.store(true, Ordering::SeqCst);
        let req = self.req.load(Ordering::SeqCst);
        tlb.clear();
        self.slots[v].must_clear.store(false, Ordering::Relaxed);
        self.slots[v].ack.store(req, Ordering::Release);
    }

    /// vCPU `v` stops running guest accesses (paused, sleeping, exited).
    pub fn go_offline(&self, v: usize) {
        self.slots[v].online.store(false, Ordering::SeqCst);
    }

    /// Makes every online vCPU drop its cached translations, and returns once
    /// all have. `me` is the calling vCPU, if any: it acknowledges requests
    /// while it waits.
    pub fn flush_remote(&self, me: Option<usize>) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let target = self.req.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(v) = me {
            self.ack_deferred(v);
        }
        self.dvm
            .occupy(self.broadcast_cost_ns.load(Ordering::Relaxed), || {
                if let Some(v) = me {
                    self.ack_deferred(v);
                }
            });
        for (v, slot) in self.slots.iter().enumerate() {
            let mut spins = 0u32;
            while slot.online.load(Ordering::SeqCst) && slot.ack.load(Ordering::Acquire) < target {
                if let Some(me) = me {
                    self.ack_deferred(me);
                }
                debug_assert!(Some(v) != me || slot.ack.load(Ordering::Acquire) >= target);
                crate::spin::back_off(&mut spins, 32);
            }
        }
    }
}

const TLB_ENTRIES: usize = 1024;

#[derive(Clone, Copy, Default)]
struct TlbEntry {
    /// gfn + 1; 0 is an empty slot.
    tag: u64,
    /// Host address of the page (0 for sparse memory).
    host: usize,
    writable: bool,
}

/// A direct-mapped cache of 4 KiB translations.
pub struct Tlb {
    entries: Box<[TlbEntry]>,
    hits: u64,
    misses: u64,
}

impl Default for Tlb {
    fn default() -> Self {
        Tlb {
            entries: vec![TlbEntry::default(); TLB_ENTRIES].into_boxed_slice(),
            hits: 0,
            misses: 0,
        }
    }
}

impl Tlb {
    /// The cached host address of `gfn`, if the cached permission allows the access.
    #[inline]
    pub fn lookup(&mut self, gfn: u64, write: bool) -> Option<usize> {
        let e = &self.entries[(gfn as usize) & (TLB_ENTRIES - 1)];
        if e.tag == gfn + 1 && (e.writable || !write) {
            self.hits += 1;
            Some(e.host)
        } else {
            self.misses += 1;
            None
        }
    }

    /// Caches a translation.
    #[inline]
    pub fn fill(&mut self, gfn: u64, host: usize, writable: bool) {
        self.entries[(gfn as usize) & (TLB_ENTRIES - 1)] = TlbEntry {
            tag: gfn + 1,
            host,
            writable,
        };
    }

    /// Drops every translation.
    pub fn clear(&mut self) {
        self.entries.iter_mut().for_each(|e| e.tag = 0);
    }

    /// (hits, misses) so far.
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn lookup_respects_permission() {
        let mut t = Tlb::default();
        t.fill(5, 0x1000, false);
        assert_eq!(t.lookup(5, false), Some(0x1000));
        assert_eq!(t.lookup(5, true), None);
        t.clear();
        assert_eq!(t.lookup(5, false), None);
    }

    #[test]
    fn a_remote_flush_pays_the_modelled_broadcast_cost_on_the_dvm_path() {
        let d = FlushDomain::new(1);
        d.flush_remote(None);
        assert_eq!(d.dvm.reserved_until_ns(), 0, "no cost by default");
        d.set_broadcast_cost_ns(50_000);
        d.flush_remote(None);
        d.flush_remote(None);
        let until = d.dvm.reserved_until_ns();
        assert!(
            until >= 100_000,
            "two 50 µs slots back to back end at {until}"
        );
        assert_eq!(d.flushes(), 3);
    }

    #[test]
    fn flush_waits_for_online_vcpus_only() {
        let d = Arc::new(FlushDomain::new(2));
        d.flush_remote(None); // nobody online: returns at once
        let mut tlb = Tlb::default();
        d.go_online(0, &mut tlb);
        tlb.fill(1, 0, true);
        let d2 = Arc::clone(&d);
        let flusher = std::thread::spawn(move || d2.flush_remote(None));
        while !d.pending(0) {
            std::hint::spin_loop();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !flusher.is_finished(),
            "flush returned before the vCPU acknowledged"
        );
        d.service(0, &mut tlb);
        flusher.join().unwrap();
        assert_eq!(tlb.lookup(1, false), None, "flush cleared the TLB");
    }
}
