//! Dirty tracking on KVM, in the three modes of [`DirtyTracking`]:
//!
//! | mode | get | re-protect |
//! |---|---|---|
//! | `bitmap` | `KVM_GET_DIRTY_LOG` (also re-protects, whole slot) | in the same ioctl |
//! | `clear`  | `KVM_GET_DIRTY_LOG` under MANUAL_PROTECT2 (no re-protect) | `KVM_CLEAR_DIRTY_LOG` in paced chunks |
//! | `ring`   | walk each vCPU's dirty ring, flip DIRTY→RESET | `KVM_RESET_DIRTY_RINGS` |
//!
//! `clear` is the userspace half of the eager-splitting seed: re-protection (and
//! on TDP hosts, huge-page splitting) happens chunk by chunk, with a pause in
//! between, instead of all at once. Under MANUAL_PROTECT2 with INITIALLY_SET,
//! enabling logging protects nothing; ferry then clears the whole slot in paced
//! chunks, so the first harvest is exact.
//!
//! In every mode, pages are re-protected *before* the engine reads them, so a
//! write that races with a harvest is either in the copy or in the next harvest.

pub mod ring;
mod source;
mod tracking;

pub use source::{KvmDirtySource, RingFull, EXIT_DIRTY_RING_FULL};
pub use tracking::DirtyTracking;

use crate::error::{ioctl, KvmError};
use crate::ioctls;
use crate::memory::set_slot_logging;
use ferry_vm::{DirtyPages, GuestRam, HarvestStats};
use kvm_bindings::kvm_enable_cap;
use kvm_ioctls::VmFd;
use ring::{DirtyRing, RingPages};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CAP_MANUAL_DIRTY_LOG_PROTECT2: u32 = kvm_bindings::KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2;
const CAP_DIRTY_LOG_RING_ACQ_REL: u32 = kvm_bindings::KVM_CAP_DIRTY_LOG_RING_ACQ_REL;
/// MANUAL_PROTECT_ENABLE | INITIALLY_SET.
const MANUAL_PROTECT_FLAGS: u64 = 3;

/// Turns on what `mode` needs on `vm`: nothing for the bitmap,
/// `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` (with INITIALLY_SET) for clear, and
/// the ring ([`enable_ring`]) for the ring. Checks `mode`'s numbers and
/// names a capability the host lacks.
pub fn enable_caps(vm: &VmFd, mode: DirtyTracking) -> Result<(), KvmError> {
    match mode {
        DirtyTracking::Bitmap => Ok(()),
        DirtyTracking::Clear { chunk_pages, .. } => {
            if chunk_pages == 0 || !chunk_pages.is_multiple_of(64) {
                return Err(KvmError::Config(format!(
                    "clear chunk of {chunk_pages} pages: use a positive multiple of 64"
                )));
            }
            let caps = vm.check_extension_raw(u64::from(CAP_MANUAL_DIRTY_LOG_PROTECT2));
            if (caps as u64) & MANUAL_PROTECT_FLAGS != MANUAL_PROTECT_FLAGS {
                return Err(KvmError::MissingCap(
                    "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 with INITIALLY_SET",
                ));
            }
            let mut cap = kvm_enable_cap {
                cap: CAP_MANUAL_DIRTY_LOG_PROTECT2,
                ..Default::default()
            };
            cap.args[0] = MANUAL_PROTECT_FLAGS;
            vm.enable_cap(&cap)
                .map_err(ioctl("KVM_ENABLE_CAP(MANUAL_DIRTY_LOG_PROTECT2)"))
        }
        DirtyTracking::Ring { entries } => enable_ring(vm, entries).map(|_| ()),
    }
}

/// The dirty ring KVM has enabled on one VM, of its size: what
/// [`KvmDirtySource::ring`] maps, so it cannot map a ring of another size.
#[derive(Clone, Copy, Debug)]
pub struct EnabledRing {
    entries: u32,
    vm_fd: RawFd,
}

/// Enables the per-vCPU dirty ring of `entries` entries on `vm`. KVM
/// takes it only once, and only before the VM's first vCPU is created.
pub fn enable_ring(vm: &VmFd, entries: u32) -> Result<EnabledRing, KvmError> {
    let max = vm.check_extension_raw(u64::from(CAP_DIRTY_LOG_RING_ACQ_REL));
    if max <= 0 {
        return Err(KvmError::MissingCap("KVM_CAP_DIRTY_LOG_RING_ACQ_REL"));
    }
    let bytes = u64::from(entries) * 16;
    if !entries.is_power_of_two() || entries < 1024 || bytes > max as u64 {
        return Err(KvmError::Config(format!(
            "dirty ring of {entries} entries: use a power of two from 1024 to {}",
            max / 16
        )));
    }
    let mut cap = kvm_enable_cap {
        cap: CAP_DIRTY_LOG_RING_ACQ_REL,
        ..Default::default()
    };
    cap.args[0] = bytes;
    vm.enable_cap(&cap).map_err(|e| {
        KvmError::Config(format!(
            "KVM_ENABLE_CAP(DIRTY_LOG_RING_ACQ_REL) failed ({e}): KVM takes the dirty ring \
             only once per VM, before its first vCPU is created"
        ))
    })?;
    Ok(EnabledRing {
        entries,
        vm_fd: vm.as_raw_fd(),
    })
}

/// The dirty log of one VM, in one [`DirtyTracking`] mode. A VM that runs
/// its own vCPU threads (ferry's memstress VM) drives it directly: it adds
/// each vCPU's ring and collects rings on their full exits. Other VMMs take
/// it wrapped as a [`KvmDirtySource`].
pub struct DirtyLog {
    mode: DirtyTracking,
    vm: Arc<VmFd>,
    ram: Arc<GuestRam>,
    rings: Vec<Arc<DirtyRing>>,
    /// Pages collected from rings (by vCPU threads on ring-full exits, or by a
    /// harvest) that the engine has not taken yet.
    pending: Arc<RingPages>,
    /// Per slot, the buffer KVM_GET_DIRTY_LOG writes: allocated and
    /// touched once at `start`, so that no harvest (the one in the pause
    /// least of all) pays for fresh memory.
    bitmaps: Vec<Vec<u64>>,
    active: bool,
}

impl DirtyLog {
    /// The log of `vm`, whose memory slots are `ram`'s; ring pages that
    /// vCPU threads collect on full exits go to `pending`.
    pub fn new(
        mode: DirtyTracking,
        vm: Arc<VmFd>,
        ram: Arc<GuestRam>,
        pending: Arc<RingPages>,
    ) -> Self {
        DirtyLog {
            mode,
            vm,
            ram,
            rings: Vec::new(),
            pending,
            bitmaps: Vec::new(),
            active: false,
        }
    }

    /// Adds a vCPU's mapped ring (ring mode).
    pub fn add_ring(&mut self, ring: Arc<DirtyRing>) {
        self.rings.push(ring);
    }

    /// The mode the log runs in.
    pub fn mode(&self) -> DirtyTracking {
        self.mode
    }

    /// Turns logging on in every slot; in clear mode, protects every slot
    /// in paced chunks so that the first harvest is exact.
    pub fn start(&mut self) -> Result<(), KvmError> {
        // Before logging starts: once it has, a meter may already have
        // collected (and flagged) pages that only a harvest may drop.
        self.pending.clear();
        if !matches!(self.mode, DirtyTracking::Ring { .. }) {
            self.bitmaps = self
                .ram
                .slots()
                .iter()
                // Filled with a non-zero word, so written (not calloc'ed
                // zero pages): every page of it is touched now. KVM
                // overwrites each word at every harvest.
                .map(|slot| vec![u64::MAX; slot.pages().div_ceil(64) as usize])
                .collect();
        }
        for slot in self.ram.slots() {
            set_slot_logging(&self.vm, &self.ram, slot, true)?;
        }
        if let DirtyTracking::Clear {
            chunk_pages,
            pace_us,
        } = self.mode
        {
            // INITIALLY_SET: every bit starts set and nothing is protected.
            // Clearing everything protects the slot, chunk by chunk.
            for slot in self.ram.slots() {
                let all = vec![u64::MAX; slot.pages().div_ceil(64) as usize];
                clear_chunks(
                    &self.vm,
                    slot.slot,
                    slot.pages(),
                    &all,
                    chunk_pages,
                    pace_us,
                )?;
            }
        }
        self.active = true;
        Ok(())
    }

    /// Turns logging off, and drops what the rings still hold.
    pub fn stop(&mut self) -> Result<(), KvmError> {
        if !self.active {
            return Ok(());
        }
        for slot in self.ram.slots() {
            set_slot_logging(&self.vm, &self.ram, slot, false)?;
        }
        if !self.rings.is_empty() {
            for ring in &self.rings {
                ring.collect();
            }
            self.pending.reset_and_forget(&self.vm)?;
        }
        self.active = false;
        Ok(())
    }

    /// Moves every page dirtied since the last harvest into `into`,
    /// re-protecting them first.
    pub fn harvest(&mut self, into: &mut DirtyPages) -> Result<HarvestStats, KvmError> {
        if !self.active {
            return Err(KvmError::Config("dirty logging is not started".into()));
        }
        let mut stats = HarvestStats::default();
        let before = into.count();
        match self.mode {
            DirtyTracking::Bitmap => {
                let t = Instant::now();
                for (slot, bits) in self.ram.slots().iter().zip(&mut self.bitmaps) {
                    ioctls::get_dirty_log_into(&self.vm, slot.slot, slot.pages(), bits)
                        .map_err(ioctl("KVM_GET_DIRTY_LOG"))?;
                    into.merge_words(slot.first_gfn(), bits);
                }
                stats.get_ns = t.elapsed().as_nanos() as u64;
            }
            DirtyTracking::Clear {
                chunk_pages,
                pace_us,
            } => {
                for (slot, bits) in self.ram.slots().iter().zip(&mut self.bitmaps) {
                    let t = Instant::now();
                    ioctls::get_dirty_log_into(&self.vm, slot.slot, slot.pages(), bits)
                        .map_err(ioctl("KVM_GET_DIRTY_LOG"))?;
                    stats.get_ns += t.elapsed().as_nanos() as u64;
                    into.merge_words(slot.first_gfn(), bits);
                    let t = Instant::now();
                    clear_chunks(
                        &self.vm,
                        slot.slot,
                        slot.pages(),
                        bits,
                        chunk_pages,
                        pace_us,
                    )?;
                    stats.clear_ns += t.elapsed().as_nanos() as u64;
                }
            }
            DirtyTracking::Ring { .. } => {
                let t = Instant::now();
                for ring in &self.rings {
                    ring.collect();
                }
                stats.get_ns = t.elapsed().as_nanos() as u64;
                let t = Instant::now();
                self.pending.reset_and_take(&self.vm, into)?;
                stats.clear_ns = t.elapsed().as_nanos() as u64;
            }
        }
        stats.pages = into.count() - before;
        Ok(stats)
    }
}

/// KVM_CLEAR_DIRTY_LOG over `pages` pages of `slot`, `chunk_pages` at a time,
/// skipping chunks with no bit set and sleeping `pace_us` after each call.
fn clear_chunks(
    vm: &VmFd,
    slot: u32,
    pages: u64,
    bits: &[u64],
    chunk_pages: u32,
    pace_us: u32,
) -> Result<(), KvmError> {
    let chunk = u64::from(chunk_pages.max(64));
    let mut first = 0u64;
    while first < pages {
        let n = chunk.min(pages - first);
        let words = &bits[(first / 64) as usize..(first + n).div_ceil(64) as usize];
        if words.iter().any(|&w| w != 0) {
            ioctls::clear_dirty_log(vm, slot, first, n as u32, words)
                .map_err(ioctl("KVM_CLEAR_DIRTY_LOG"))?;
            if pace_us > 0 {
                std::thread::sleep(Duration::from_micros(u64::from(pace_us)));
            }
        }
        first += n;
    }
    Ok(())
}
