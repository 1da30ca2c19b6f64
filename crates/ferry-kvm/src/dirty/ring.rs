//! The per-vCPU dirty ring (`KVM_CAP_DIRTY_LOG_RING_ACQ_REL`).
//!
//! KVM appends `(slot, offset)` for each page a vCPU dirties to that vCPU's
//! ring, mapped at page `KVM_DIRTY_LOG_PAGE_OFFSET` of the vCPU fd. Userspace
//! walks entries in order from its fetch index: an entry with the DIRTY flag
//! (read with acquire) is recorded, then flagged RESET (store with release).
//! `KVM_RESET_DIRTY_RINGS` then re-protects the recorded pages and recycles the
//! entries. When a ring fills, the vCPU exits with `KVM_EXIT_DIRTY_RING_FULL`
//! and its own thread drains it ([`DirtyRing::drain_full`]).
//!
//! Collected pages go into [`RingPages`] until the engine harvests; see there
//! why a harvest may take only pages KVM has re-protected.

use crate::error::{ioctl, KvmError};
use crate::ioctls;
use ferry_vm::{DirtyPages, Gfn, SharedDirtyBitmap};
use kvm_bindings::{kvm_dirty_gfn, KVM_DIRTY_LOG_PAGE_OFFSET};
use kvm_ioctls::{VcpuFd, VmFd};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

const GFN_DIRTY: u32 = 1;
const GFN_RESET: u32 = 2;

/// The pages the rings have collected and the engine has not taken yet.
///
/// Collecting an entry flags it for reset, but KVM write-protects its page
/// again only at the next `KVM_RESET_DIRTY_RINGS`. A page taken and copied
/// before that reset stays writable after the copy: a write then makes no new
/// entry and is lost to the migration. Several threads collect (the dirty
/// quota's meter every few milliseconds, vCPUs at ring-full exits, the
/// engine), so one that collects while a harvest resets could hand the
/// harvest pages its reset never saw; under the kvm quota this lost hundreds
/// of pages in a third of busy migrations, caught by the digest.
///
/// So collectors hold `gate` shared while they mark pages and flag entries,
/// and a harvest holds it exclusively from its reset through its take: every
/// page it takes was flagged before the reset that protected it. A page
/// collected later waits for the next harvest and its reset.
pub struct RingPages {
    pages: SharedDirtyBitmap,
    gate: RwLock<()>,
}

impl RingPages {
    /// An empty set over `pages` guest frames.
    pub fn new(pages: u64) -> Self {
        RingPages {
            pages: SharedDirtyBitmap::new(pages),
            gate: RwLock::new(()),
        }
    }

    /// Re-protects every page collected so far, then moves them into `into`.
    /// Returns the number of ring entries reset.
    pub fn reset_and_take(&self, vm: &VmFd, into: &mut DirtyPages) -> Result<u32, KvmError> {
        let _no_collector = self.gate.write().unwrap_or_else(|e| e.into_inner());
        let reset = reset(vm)?;
        self.pages.harvest_into(into);
        Ok(reset)
    }

    /// Forgets every collected page (dirty logging starts afresh).
    pub fn clear(&self) {
        self.pages.clear();
    }

    /// Re-protects every page collected so far and forgets them (dirty
    /// logging has stopped).
    pub fn reset_and_forget(&self, vm: &VmFd) -> Result<(), KvmError> {
        let _no_collector = self.gate.write().unwrap_or_else(|e| e.into_inner());
        reset(vm)?;
        self.pages.clear();
        Ok(())
    }
}

/// `KVM_RESET_DIRTY_RINGS`, called again if interrupted. With every other
/// signal held (see [`ioctls::reset_dirty_rings`]) only a fatal one can
/// interrupt it, and the process ends then anyway. Returns the entries the
/// last call reset.
fn reset(vm: &VmFd) -> Result<u32, KvmError> {
    loop {
        match ioctls::reset_dirty_rings(vm) {
            Err(e) if e.errno() == libc::EINTR => continue,
            other => return other.map_err(ioctl("KVM_RESET_DIRTY_RINGS")),
        }
    }
}

/// One vCPU's mapped dirty ring.
pub struct DirtyRing {
    entries: *mut kvm_dirty_gfn,
    count: u32,
    bytes: usize,
    fetch: Mutex<u32>,
    vm: Arc<VmFd>,
    slot_bases: Vec<Option<Gfn>>,
    pending: Arc<RingPages>,
    /// Pages this ring was the first to report since the harvest before,
    /// summed so far: the pages this vCPU dirtied that the migration must
    /// send again (the per-vCPU meter of the dirty quota). Not its entries:
    /// KVM pushes one for every write it makes to guest memory itself, and
    /// it rewrites a vCPU's steal-time record at every entry into KVM_RUN
    /// (and its kvmclock page at some), so a vCPU that enters KVM_RUN
    /// often, or one a throttle wakes, reports the same page hundreds of
    /// times a second. Inside the SVM host those entries engaged the quota
    /// on an idle Linux guest whose full pass dirtied almost nothing
    /// (docs/svm-host-runs.md, "The quota's hold").
    collected: AtomicU64,
}

// SAFETY: the ring mapping is process-shared memory owned by this struct for
// its whole life; every access to it goes through `collect`, serialized by the
// `fetch` mutex, with atomic flag accesses as the KVM ABI requires.
unsafe impl Send for DirtyRing {}
// SAFETY: as above; `&DirtyRing` only allows `collect`, which takes the mutex.
unsafe impl Sync for DirtyRing {}

impl DirtyRing {
    /// Maps the ring of `vcpu`, which has `entries` entries (a power of two).
    /// `slot_bases[slot]` is the first frame of each memslot.
    pub fn map(
        vcpu: &VcpuFd,
        entries: u32,
        vm: Arc<VmFd>,
        slot_bases: Vec<Option<Gfn>>,
        pending: Arc<RingPages>,
    ) -> Result<Self, KvmError> {
        let bytes = entries as usize * std::mem::size_of::<kvm_dirty_gfn>();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as i64;
        // SAFETY: mapping a KVM vCPU fd at the dirty-ring offset with the size
        // the ring was enabled with; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                vcpu.as_raw_fd(),
                i64::from(KVM_DIRTY_LOG_PAGE_OFFSET) * page,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(KvmError::Ioctl(
                "mmap of the dirty ring",
                vmm_sys_util::errno::Error::last(),
            ));
        }
        Ok(DirtyRing {
            entries: ptr.cast(),
            count: entries,
            bytes,
            fetch: Mutex::new(0),
            vm,
            slot_bases,
            pending,
            collected: AtomicU64::new(0),
        })
    }

    /// Records every published entry into the pending pages and flags it for
    /// reset. Returns the number of entries collected.
    pub fn collect(&self) -> u32 {
        let _no_harvest = self.pending.gate.read().unwrap_or_else(|e| e.into_inner());
        self.collect_in_gate()
    }

    /// [`Self::collect`], for a caller that holds the gate shared.
    fn collect_in_gate(&self) -> u32 {
        let mut fetch = self
            .fetch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut n, mut fresh) = (0, 0u64);
        loop {
            let idx = (*fetch % self.count) as usize;
            // SAFETY: idx < count, so the entry lies inside the mapping.
            let entry = unsafe { self.entries.add(idx) };
            // SAFETY: `flags` is the first, 4-byte-aligned u32 of the entry; KVM
            // and userspace both access it atomically per the ring ABI.
            let flags = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*entry).flags)) };
            if flags.load(Ordering::Acquire) & GFN_DIRTY == 0 {
                break;
            }
            // SAFETY: the DIRTY flag (acquire) publishes slot and offset.
            let (slot, offset) = unsafe {
                (
                    std::ptr::read_volatile(std::ptr::addr_of!((*entry).slot)),
                    std::ptr::read_volatile(std::ptr::addr_of!((*entry).offset)),
                )
            };
            // Low 16 bits: slot id; high 16 bits: address space (always 0 here).
            if let Some(Some(base)) = self.slot_bases.get((slot & 0xffff) as usize) {
                if self.pending.pages.mark(Gfn(base.0 + offset)) {
                    fresh += 1;
                }
            }
            flags.store(GFN_RESET, Ordering::Release);
            *fetch = fetch.wrapping_add(1);
            n += 1;
        }
        self.collected.fetch_add(fresh, Ordering::Relaxed);
        n
    }

    /// Pages this ring was the first to report since the harvest before,
    /// summed so far (see the field: not its entries).
    pub fn collected(&self) -> u64 {
        self.collected.load(Ordering::Relaxed)
    }

    /// Handles `KVM_EXIT_DIRTY_RING_FULL` on the vCPU's own thread: collect,
    /// then reset so the vCPU can run again. (The pages stay pending for the
    /// engine's next harvest, which resets again before it takes them.) The
    /// gate is held across both: a harvest's reset right after this one
    /// finds nothing to reset, and KVM flushes the TLBs only when a reset
    /// cleared something, so the harvest must not take pages before this
    /// reset (and its flush) has finished.
    pub fn drain_full(&self) -> Result<(), KvmError> {
        let _no_harvest = self.pending.gate.read().unwrap_or_else(|e| e.into_inner());
        self.collect_in_gate();
        reset(&self.vm)?;
        Ok(())
    }
}

impl Drop for DirtyRing {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `map`, once.
        unsafe {
            libc::munmap(self.entries.cast(), self.bytes);
        }
    }
}
