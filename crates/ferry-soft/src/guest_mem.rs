//! A vCPU's view of guest memory: every access goes through its TLB and, on a
//! miss, the MMU; data goes to the host mapping of `GuestRam`.
//!
//! Guest stores do not use vm-memory's `Bytes` path, which would mark the
//! VMM-write bitmap: guest writes are tracked by the MMU's dirty log, VMM
//! writes by `GuestRam`. Data is accessed with atomic u64/u32 operations on
//! the host address (the engine copies the same memory concurrently).
//!
//! With no RAM (sparse memory), translations are real and contents implied:
//! loads return 0 and stores are dropped after the MMU has done its part.

use crate::error::SoftError;
use crate::mmu::Mmu;
use crate::tlb::Tlb;
use ferry_vm::{Gfn, GuestRam, PAGE_SHIFT};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Host addresses of guest RAM, slot by slot.
#[derive(Clone)]
pub struct HostView {
    /// (first gfn, frames, host base address) per slot.
    slots: Vec<(u64, u64, usize)>,
    /// Keeps the mappings alive as long as the view.
    _ram: Option<Arc<GuestRam>>,
}

impl HostView {
    /// The view of `ram`.
    pub fn of(ram: &Arc<GuestRam>) -> Self {
        let slots = ram
            .slots()
            .iter()
            .map(|s| (s.first_gfn().0, s.pages(), ram.host_address(s) as usize))
            .collect();
        HostView {
            slots,
            _ram: Some(Arc::clone(ram)),
        }
    }

    /// Sparse memory: no contents.
    pub fn sparse() -> Self {
        HostView {
            slots: Vec::new(),
            _ram: None,
        }
    }

    /// Host address of the page `gfn`, or 0 for sparse memory.
    #[inline]
    fn host(&self, gfn: u64) -> Result<usize, SoftError> {
        if self.slots.is_empty() {
            return Ok(0);
        }
        for &(first, pages, base) in &self.slots {
            if gfn >= first && gfn < first + pages {
                return Ok(base + (((gfn - first) as usize) << PAGE_SHIFT));
            }
        }
        Err(SoftError::OutOfRange(gfn))
    }
}

/// Guest memory as one vCPU sees it.
pub struct VcpuMem {
    mmu: Arc<Mmu>,
    view: HostView,
    id: usize,
    tlb: Tlb,
    /// Pages this vCPU dirtied first (what a dirty quota charges), not yet
    /// taken by [`VcpuMem::take_dirtied`].
    dirtied: u64,
    /// Modelled cost of a fault's exit to the hypervisor and back.
    exit_cost_ns: u64,
    faults: u64,
    /// Postcopy: how this vCPU resolves its own memory faults (annotated
    /// exits); without it a memory fault is returned to the caller.
    delivery: Option<crate::fault_exit::FaultDelivery>,
}

impl VcpuMem {
    /// vCPU `id`'s view.
    pub fn new(mmu: Arc<Mmu>, view: HostView, id: usize) -> Self {
        VcpuMem {
            mmu,
            view,
            id,
            tlb: Tlb::default(),
            dirtied: 0,
            exit_cost_ns: 0,
            faults: 0,
            delivery: None,
        }
    }

    /// Postcopy: a memory fault (a page not present yet) exits to
    /// `delivery` on this thread and the access retries once it returns.
    pub fn set_fault_delivery(&mut self, delivery: crate::fault_exit::FaultDelivery) {
        self.delivery = Some(delivery);
    }

    /// Loads the u64 at `gpa`, resolving memory faults through `delivery`
    /// first and counting each exit in `counts` (without a delivery set on
    /// this vCPU: the fault path a test drives itself).
    pub fn load_u64_resolving(
        &mut self,
        gpa: u64,
        delivery: &crate::fault_exit::FaultDelivery,
        counts: &crate::fault_exit::FaultCounts,
    ) -> Result<u64, SoftError> {
        use std::sync::atomic::Ordering;
        loop {
            match self.load_u64(gpa) {
                Err(SoftError::MemoryFault(f)) => {
                    counts.exits.fetch_add(1, Ordering::Relaxed);
                    // Exited to the VMM: out of guest mode, so remote flushes
                    // do not wait for this vCPU while the page is fetched.
                    self.offline();
                    let resolved = delivery.resolve(f);
                    self.online();
                    if let Err(e) = resolved {
                        counts.failed.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                other => return other,
            }
        }
    }

    /// Models the VM exit and re-entry a fault costs on hardware: each fault
    /// this vCPU takes busy-waits `ns` on its own thread (0, the default,
    /// models nothing beyond the software MMU's own work).
    pub fn set_exit_cost_ns(&mut self, ns: u64) {
        self.exit_cost_ns = ns;
    }

    /// Faults this vCPU took.
    pub fn faults(&self) -> u64 {
        self.faults
    }

    /// The MMU.
    pub fn mmu(&self) -> &Arc<Mmu> {
        &self.mmu
    }

    /// vCPU index.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Access boundary: acknowledges a pending remote flush.
    #[inline]
    pub fn boundary(&mut self) {
        if self.mmu.flush.pending(self.id) {
            self.mmu.flush.service(self.id, &mut self.tlb);
        }
    }

    /// Starts running accesses (joins the flush domain).
    pub fn online(&mut self) {
        self.mmu.flush.go_online(self.id, &mut self.tlb);
    }

    /// Stops running accesses (paused, sleeping).
    pub fn offline(&mut self) {
        self.mmu.flush.go_offline(self.id);
    }

    /// Pages dirtied first by this vCPU since the last call.
    pub fn take_dirtied(&mut self) -> u64 {
        std::mem::take(&mut self.dirtied)
    }

    /// TLB (hits, misses).
    pub fn tlb_stats(&self) -> (u64, u64) {
        self.tlb.stats()
    }

    /// Host address for an access at `gpa`.
    #[inline]
    pub fn translate(&mut self, gpa: u64, write: bool) -> Result<usize, SoftError> {
        let gfn = gpa >> PAGE_SHIFT;
        let page_off = (gpa & 0xfff) as usize;
        if let Some(host) = self.tlb.lookup(gfn, write) {
            return Ok(host + page_off);
        }
        self.miss(gfn, write).map(|h| h + page_off)
    }

    #[cold]
    fn miss(&mut self, gfn: u64, write: bool) -> Result<usize, SoftError> {
        // Clear the TLB first if a flush was acknowledged from inside the MMU
        // during an earlier miss; never between the walk and the fill below,
        // which would let a flush pass a translation it should have killed.
        if self.mmu.flush.pending(self.id) {
            self.mmu.flush.service(self.id, &mut self.tlb);
        }
        let t = loop {
            match self.mmu.translate(Some(self.id), Gfn(gfn), write) {
                Err(SoftError::MemoryFault(f)) if self.delivery.is_some() => {
                    // The annotated exit: out of guest mode (remote flushes
                    // do not wait for this vCPU) while its own thread brings
                    // the page in, then the access retries.
                    let delivery = self.delivery.clone();
                    self.offline();
                    let resolved = delivery.map_or(Ok(()), |d| d.resolve(f));
                    self.online();
                    resolved?;
                }
                other => break other?,
            }
        };
        // A flush acknowledged during the walk: the walk itself re-read what
        // it used, but other cached translations may be stale.
        if self.mmu.flush.take_must_clear(self.id) {
            self.tlb.clear();
        }
        if t.dirtied {
            self.dirtied += 1;
        }
        if t.fault {
            self.faults += 1;
            crate::hw_cost::spin_for(self.exit_cost_ns);
        }
        self.mmu.note_access(gfn);
        let host = self.view.host(gfn)?;
        self.tlb.fill(gfn, host, t.writable);
        Ok(host)
    }

    /// Loads the aligned u64 at `gpa`.
    #[inline]
    pub fn load_u64(&mut self, gpa: u64) -> Result<u64, SoftError> {
        let host = self.translate(gpa, false)?;
        if host < 4096 {
            return Ok(0);
        }
        // SAFETY: `host` is inside a live guest RAM mapping (the view holds an
        // Arc to it), 8-byte aligned because `gpa` is and slot bases are page
        // aligned, and only ever accessed atomically or by volatile copies.
        Ok(unsafe { &*(host as *const AtomicU64) }.load(Ordering::Relaxed))
    }

    /// Stores the aligned u64 at `gpa`.
    #[inline]
    pub fn store_u64(&mut self, gpa: u64, value: u64) -> Result<(), SoftError> {
        let host = self.translate(gpa, true)?;
        if host >= 4096 {
            // SAFETY: as in `load_u64`.
            unsafe { &*(host as *const AtomicU64) }.store(value, Ordering::Relaxed);
        }
        Ok(())
    }

    /// ORs `bits` into the aligned u64 at `gpa`, atomically: a write access
    /// (it dirties the page) that, with `bits` 0, leaves it as it was.
    #[inline]
    pub fn or_u64(&mut self, gpa: u64, bits: u64) -> Result<(), SoftError> {
        let host = self.translate(gpa, true)?;
        if host >= 4096 {
            // SAFETY: as in `load_u64`.
            unsafe { &*(host as *const AtomicU64) }.fetch_or(bits, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Loads the aligned u32 at `gpa`.
    #[inline]
    pub fn load_u32(&mut self, gpa: u64) -> Result<u32, SoftError> {
        let host = self.translate(gpa, false)?;
        if host < 4096 {
            return Ok(0);
        }
        // SAFETY: as in `load_u64`, with 4-byte alignment.
        Ok(unsafe { &*(host as *const AtomicU32) }.load(Ordering::Relaxed))
    }

    /// Stores the aligned u32 at `gpa`.
    #[inline]
    pub fn store_u32(&mut self, gpa: u64, value: u32) -> Result<(), SoftError> {
        let host = self.translate(gpa, true)?;
        if host >= 4096 {
            // SAFETY: as in `load_u32`.
            unsafe { &*(host as *const AtomicU32) }.store(value, Ordering::Relaxed);
        }
        Ok(())
    }
}
