//! Guest RAM: one or more slots at their guest-physical addresses, with holes
//! allowed between them (an x86 PCI hole, say). A frame number is the
//! guest-physical address over 4 KiB, and sets of frames span
//! `0..pages()`, holes included; a hole frame is never RAM
//! ([`GuestRam::is_ram`]), and every frame a migration sends comes from
//! [`GuestRam::frames`] or a dirty log, so none is ever a hole.
//!
//! RAM is a vm-memory `GuestMemoryMmap` with an `AtomicBitmap` per region. Every
//! write the VMM itself makes goes through vm-memory's `Bytes` API, which marks
//! the page in that bitmap; [`GuestRam::take_vmm_dirty`] hands those pages to
//! the engine, which merges them with what KVM or the soft MMU logged. That is
//! the one place that hands out guest memory, so no VMM write can go unsent.
//!
//! No `&[u8]` is ever made over live guest RAM: the guest may change it at any
//! moment. Reads and writes are copies through vm-memory's volatile accessors.

use crate::bitmap::DirtyPages;
use crate::types::{Gfn, Gpa, PAGE_SIZE};
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;
use std::os::fd::FromRawFd;
use std::sync::atomic::Ordering;
use thiserror::Error;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap,
};

/// How guest RAM is backed on the host.
#[non_exhaustive]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backing {
    /// Private anonymous memory, 4 KiB pages.
    #[default]
    Anonymous,
    /// Anonymous memory with `MADV_HUGEPAGE` (transparent huge pages).
    Thp,
    /// `MAP_HUGETLB` 2 MiB pages; needs pages reserved in `/proc/sys/vm/nr_hugepages`.
    Hugetlb,
    /// A shared memfd, the backing a VMM uses to hand memory to another process.
    Memfd,
}

impl std::str::FromStr for Backing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "anon" | "anonymous" => Ok(Backing::Anonymous),
            "thp" => Ok(Backing::Thp),
            "hugetlb" => Ok(Backing::Hugetlb),
            "memfd" => Ok(Backing::Memfd),
            other => Err(format!(
                "unknown backing '{other}': expected anon, thp, hugetlb or memfd"
            )),
        }
    }
}

/// Errors of guest RAM.
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum RamError {
    /// Slot sizes must be whole 2 MiB multiples so every backing can map them.
    #[error("slot {slot} size {size:#x} is not a multiple of 2 MiB")]
    UnalignedSlot {
        /// The slot's index.
        slot: usize,
        /// Its size in bytes.
        size: u64,
    },
    /// Slots must be in ascending guest-physical order, apart.
    #[error("slot {slot} starts at {start}, below the end of the slot before it at {expected}")]
    Overlap {
        /// The slot's index.
        slot: usize,
        /// Where it starts.
        start: Gpa,
        /// The end of the slot before it: the lowest start allowed.
        expected: Gpa,
    },
    /// A region of a caller's memory that does not start or end on a page.
    #[error("region at {gpa} of {size:#x} bytes is not whole 4 KiB pages")]
    UnalignedRegion {
        /// Where the region starts.
        gpa: Gpa,
        /// Its size in bytes.
        size: u64,
    },
    /// The host refused the mapping.
    #[error("cannot map {size} bytes of {backing:?} guest RAM{hint}")]
    Map {
        /// Bytes asked for.
        size: u64,
        /// The backing asked for.
        backing: Backing,
        /// What to do about it, when the cause is a known one.
        hint: &'static str,
        /// The mapping's error.
        #[source]
        source: vm_memory::mmap::MmapRegionError,
    },
    /// memfd_create or ftruncate failed.
    #[error("cannot create the memfd backing guest RAM")]
    Memfd(#[source] std::io::Error),
    /// vm-memory rejected the region set.
    #[error("cannot assemble guest RAM regions: {0}")]
    Regions(String),
    /// An access fell outside guest RAM.
    #[error("guest RAM access at {gpa} of {len} bytes is out of range")]
    OutOfRange {
        /// Where the access starts.
        gpa: Gpa,
        /// Its length in bytes.
        len: usize,
    },
    /// A range to discard that is not whole pages inside one region.
    #[error(
        "cannot discard {bytes:#x} bytes at {gpa}: a discarded range must be whole 4 KiB \
         pages inside one region of guest RAM"
    )]
    NotInRam {
        /// Where the range starts.
        gpa: Gpa,
        /// Its length in bytes.
        bytes: u64,
    },
    /// The host would not drop pages (postcopy needs them missing again).
    #[error("cannot discard guest RAM at {gpa}{hint}")]
    Discard {
        /// Where the range starts.
        gpa: Gpa,
        /// What to do about it, when the cause is a known one.
        hint: &'static str,
        /// The madvise error.
        #[source]
        source: std::io::Error,
    },
}

/// One memory slot as registered with the backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RamSlot {
    /// Slot number (the KVM memslot id on the kvm backend): the region's
    /// index unless the VMM numbered it ([`GuestRam::with_memslots`]).
    pub slot: u32,
    /// First guest-physical address.
    pub gpa: Gpa,
    /// Size in bytes.
    pub size: u64,
    /// The memslot flags the VMM registered the region with (on KVM,
    /// `KVM_MEM_READONLY`): dirty logging adds its own flag to these and
    /// never drops them.
    #[serde(default)]
    pub flags: u32,
    /// How the region is backed on the host.
    #[serde(default)]
    pub backing: Backing,
}

/// How a VMM registered one region with its hypervisor: the slot number
/// and flags it chose ([`GuestRam::with_memslots`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memslot {
    /// The slot number.
    pub slot: u32,
    /// The flags (KVM: `KVM_MEM_READONLY`; never the dirty-log flag, which
    /// the dirty log sets itself).
    pub flags: u32,
}

impl RamSlot {
    /// First frame of the slot.
    pub fn first_gfn(&self) -> Gfn {
        self.gpa.gfn()
    }
    /// Number of 4 KiB frames.
    pub fn pages(&self) -> u64 {
        self.size / PAGE_SIZE as u64
    }
}

const HUGE_2M: u64 = 2 << 20;

/// Guest RAM shared by the backend (which runs the guest on it) and the engine
/// (which copies it).
pub struct GuestRam {
    mem: GuestMemoryMmap<AtomicBitmap>,
    slots: Vec<RamSlot>,
    /// Frames the VMM said the guest gave up ([`GuestRam::discard_range`]).
    discarded: crate::PageBits,
    /// Whether any frame may be marked: the writes' and reads' fast path.
    any_discarded: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for GuestRam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestRam")
            .field("slots", &self.slots)
            .finish()
    }
}

impl GuestRam {
    /// Maps guest RAM with one slot per entry of `slot_sizes`, laid out
    /// contiguously from guest-physical 0.
    pub fn new(slot_sizes: &[u64], backing: Backing) -> Result<Self, RamError> {
        let mut next = Gpa(0);
        let regions: Vec<(Gpa, u64)> = slot_sizes
            .iter()
            .map(|&size| {
                let at = next;
                next = next.add(size);
                (at, size)
            })
            .collect();
        Self::with_regions(&regions, backing)
    }

    /// Maps guest RAM with one slot per `(start, size)` region, in
    /// ascending guest-physical order; the space between two regions is a
    /// hole. Starts and sizes are whole 2 MiB, so every backing can map them.
    pub fn with_regions(layout: &[(Gpa, u64)], backing: Backing) -> Result<Self, RamError> {
        let backed: Vec<_> = layout.iter().map(|&(g, s)| (g, s, backing)).collect();
        Self::with_backed_regions(&backed)
    }

    /// [`GuestRam::with_regions`], each region on its own backing (RAM on
    /// memfd to hand to a new process, a small region anonymous, say).
    /// Hugetlb regions cannot be mixed with others: postcopy places one
    /// page size.
    pub fn with_backed_regions(layout: &[(Gpa, u64, Backing)]) -> Result<Self, RamError> {
        check_backings(layout.iter().map(|r| r.2))?;
        let mut regions = Vec::with_capacity(layout.len());
        let mut slots = Vec::with_capacity(layout.len());
        let mut end = Gpa(0);
        for (i, &(gpa, size, backing)) in layout.iter().enumerate() {
            if size == 0 || !size.is_multiple_of(HUGE_2M) || !gpa.0.is_multiple_of(HUGE_2M) {
                return Err(RamError::UnalignedSlot { slot: i, size });
            }
            if gpa.0 < end.0 {
                return Err(RamError::Overlap {
                    slot: i,
                    start: gpa,
                    expected: end,
                });
            }
            let region = map_region(size, backing)?;
            let region = GuestRegionMmap::new(region, GuestAddress(gpa.0))
                .ok_or_else(|| RamError::Regions("address overflow".into()))?;
            regions.push(region);
            slots.push(RamSlot {
                slot: i as u32,
                gpa,
                size,
                flags: 0,
                backing,
            });
            end = gpa.add(size);
        }
        let mem =
            GuestMemoryMmap::from_regions(regions).map_err(|e| RamError::Regions(e.to_string()))?;
        Ok(GuestRam::assemble(mem, slots))
    }

    /// Adopts a VMM's own guest memory, holes allowed: each region becomes
    /// a slot. Its dirty bitmap must track 4 KiB pages, since the engine
    /// merges it with the other dirty logs frame by frame; `backing` says
    /// how the regions are mapped (what dropping a page's contents takes).
    pub fn from_memory(
        mem: GuestMemoryMmap<AtomicBitmap>,
        backing: Backing,
    ) -> Result<Self, RamError> {
        use vm_memory::GuestMemoryRegion;
        let mut slots = Vec::new();
        let mut end = Gpa(0);
        for (i, region) in mem.iter().enumerate() {
            let (gpa, size) = (Gpa(region.start_addr().0), region.len());
            if size == 0
                || !size.is_multiple_of(PAGE_SIZE as u64)
                || !gpa.0.is_multiple_of(PAGE_SIZE as u64)
            {
                return Err(RamError::UnalignedRegion { gpa, size });
            }
            if gpa.0 < end.0 {
                return Err(RamError::Overlap {
                    slot: i,
                    start: gpa,
                    expected: end,
                });
            }
            let mapping: &vm_memory::MmapRegion<AtomicBitmap> = region;
            let bits = mapping.bitmap().len() as u64;
            if bits != size / PAGE_SIZE as u64 {
                return Err(RamError::Regions(format!(
                    "the region at {gpa} tracks dirty memory in {bits} units, not in its {} 4 KiB pages",
                    size / PAGE_SIZE as u64
                )));
            }
            slots.push(RamSlot {
                slot: i as u32,
                gpa,
                size,
                flags: 0,
                backing,
            });
            end = gpa.add(size);
        }
        if slots.is_empty() {
            return Err(RamError::Regions("no memory regions".into()));
        }
        Ok(GuestRam::assemble(mem, slots))
    }

    fn assemble(mem: GuestMemoryMmap<AtomicBitmap>, slots: Vec<RamSlot>) -> Self {
        let frames = slots.last().map_or(0, |s| s.first_gfn().0 + s.pages());
        GuestRam {
            mem,
            slots,
            discarded: crate::PageBits::new(frames),
            any_discarded: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The same memory, its regions registered as `memslots` says (one
    /// per region, in guest-physical order): a VMM whose slot numbers are
    /// not the region indices, or that maps a region read-only, says so
    /// here, and the dirty log keeps both.
    pub fn with_memslots(mut self, memslots: &[Memslot]) -> Result<Self, RamError> {
        if memslots.len() != self.slots.len() {
            return Err(RamError::Regions(format!(
                "{} memslots for {} regions",
                memslots.len(),
                self.slots.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (slot, m) in self.slots.iter_mut().zip(memslots) {
            if !seen.insert(m.slot) {
                return Err(RamError::Regions(format!(
                    "memslot {} is given to two regions",
                    m.slot
                )));
            }
            slot.slot = m.slot;
            slot.flags = m.flags;
        }
        Ok(self)
    }

    /// The first frame of each slot, indexed by slot number (`None` for
    /// a number no region has): how a dirty ring's (slot, offset) entries
    /// become frames.
    pub fn slot_bases(&self) -> Vec<Option<Gfn>> {
        let len = self
            .slots
            .iter()
            .map(|s| s.slot as usize + 1)
            .max()
            .unwrap_or(0);
        let mut bases = vec![None; len];
        for s in &self.slots {
            bases[s.slot as usize] = Some(s.first_gfn());
        }
        bases
    }

    /// The slots, in guest-physical order.
    pub fn slots(&self) -> &[RamSlot] {
        &self.slots
    }

    /// The backing the RAM was mapped with: its first region's
    /// ([`RamSlot::backing`] has each one's). Hugetlb is never mixed with
    /// another, so `Hugetlb` here means every region is.
    pub fn backing(&self) -> Backing {
        self.slots.first().map_or(Backing::Anonymous, |s| s.backing)
    }

    /// The same memory, its regions labelled with how the VMM backed each
    /// (one per region, in guest-physical order): what dropping a page's
    /// contents takes, and whether a same-host upgrade can hand it over.
    pub fn with_backings(mut self, backings: &[Backing]) -> Result<Self, RamError> {
        if backings.len() != self.slots.len() {
            return Err(RamError::Regions(format!(
                "{} backings for {} regions",
                backings.len(),
                self.slots.len()
            )));
        }
        check_backings(backings.iter().copied())?;
        for (slot, &b) in self.slots.iter_mut().zip(backings) {
            slot.backing = b;
        }
        Ok(self)
    }

    /// Total bytes of guest RAM.
    pub fn size(&self) -> u64 {
        self.slots.iter().map(|s| s.size).sum()
    }

    /// The frames guest RAM spans: frames are numbered `0..pages()`, the
    /// holes between slots included (see [`GuestRam::is_ram`]). Without
    /// holes, every one of them is RAM.
    pub fn pages(&self) -> u64 {
        self.slots.last().map_or(0, |s| s.first_gfn().0 + s.pages())
    }

    /// Whether frame `gfn` is RAM (not in a hole, nor past the end).
    pub fn is_ram(&self, gfn: Gfn) -> bool {
        self.slots
            .iter()
            .any(|s| (s.first_gfn().0..s.first_gfn().0 + s.pages()).contains(&gfn.0))
    }

    /// Every frame of RAM: what a full pass sends.
    pub fn frames(&self) -> DirtyPages {
        let mut all = DirtyPages::new(self.pages());
        for s in &self.slots {
            (s.first_gfn().0..s.first_gfn().0 + s.pages()).for_each(|g| all.set(Gfn(g)));
        }
        all
    }

    /// The parts of the `count` frames from `first` that are RAM, as runs.
    pub fn ram_runs(&self, first: Gfn, count: u64) -> Vec<(Gfn, u64)> {
        let end = first.0.saturating_add(count);
        self.slots
            .iter()
            .filter_map(|s| {
                let lo = first.0.max(s.first_gfn().0);
                let hi = end.min(s.first_gfn().0 + s.pages());
                (lo < hi).then(|| (Gfn(lo), hi - lo))
            })
            .collect()
    }

    /// The holes between slots, as runs of frames.
    pub fn holes(&self) -> Vec<(Gfn, u64)> {
        let mut next = 0;
        let mut holes = Vec::new();
        for s in &self.slots {
            if s.first_gfn().0 > next {
                holes.push((Gfn(next), s.first_gfn().0 - next));
            }
            next = s.first_gfn().0 + s.pages();
        }
        holes
    }

    /// Whether the kernel may back every slot with transparent huge pages
    /// ([`crate::thp`]); false where it cannot say.
    pub fn thp_eligible(&self) -> bool {
        let ranges: Vec<_> = self
            .slots
            .iter()
            .map(|s| {
                let at = self.host_address(s) as usize;
                at..at + s.size as usize
            })
            .collect();
        crate::thp::eligible(&ranges).unwrap_or(false)
    }

    /// Host virtual address of the first byte of `slot`, for registering it with
    /// a hypervisor. The pointer stays valid as long as `self` lives.
    pub fn host_address(&self, slot: &RamSlot) -> *mut u8 {
        self.mem
            .get_host_address(GuestAddress(slot.gpa.0))
            .expect("slot base is inside guest RAM by construction")
    }

    /// The vm-memory view, for code that wants its `Bytes` API directly.
    pub fn memory(&self) -> &GuestMemoryMmap<AtomicBitmap> {
        &self.mem
    }

    /// Copies `buf.len()` bytes starting at frame `first` out of guest RAM.
    pub fn read_pages(&self, first: Gfn, buf: &mut [u8]) -> Result<(), RamError> {
        let gpa = first.gpa();
        self.mem
            .read_slice(buf, GuestAddress(gpa.0))
            .map_err(|_| RamError::OutOfRange {
                gpa,
                len: buf.len(),
            })
    }

    /// Hands `f` the `count` frames from `first` in place, as bytes, for
    /// reading a whole guest's memory without copying it first (hashing a
    /// paused guest: the copy cost as much as the hash). The frames must
    /// lie in one slot.
    ///
    /// # Safety
    ///
    /// Nothing may write the frames while `f` runs: the guest is paused
    /// and its devices are quiet (the only writers of guest memory).
    pub unsafe fn with_frames<R>(
        &self,
        first: Gfn,
        count: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, RamError> {
        let gpa = first.gpa();
        let len = count as usize * PAGE_SIZE;
        let slice = self
            .mem
            .get_slice(GuestAddress(gpa.0), len)
            .map_err(|_| RamError::OutOfRange { gpa, len })?;
        let guard = slice.ptr_guard();
        // SAFETY: [ptr, ptr + len) lies in one region (get_slice checked),
        // mapped while `self` lives; any byte is a valid u8, and the caller
        // promises no writes while the borrow lasts.
        let bytes = unsafe { std::slice::from_raw_parts(guard.as_ptr(), len) };
        Ok(f(bytes))
    }

    /// [`GuestRam::read_pages`] for sending: a discarded frame reads as
    /// zero without touching its memory (which a read would fault back in,
    /// on a shared backing).
    pub fn read_pages_to_send(&self, first: Gfn, buf: &mut [u8]) -> Result<(), RamError> {
        if !self.any_discarded.load(Ordering::Acquire) {
            return self.read_pages(first, buf);
        }
        for (i, page) in buf.chunks_mut(PAGE_SIZE).enumerate() {
            let gfn = Gfn(first.0 + i as u64);
            if self.discarded.contains(gfn) {
                page.fill(0);
            } else {
                self.read_pages(gfn, page)?;
            }
        }
        Ok(())
    }

    /// Marks `bytes` from `gpa` as given up by the guest (a balloon's
    /// inflated pages, unplugged virtio-mem blocks, free-page hints), and
    /// drops their contents, so that they read as zero here as at a
    /// destination. A migration does not read them, sends each as a zero
    /// page (one bit) and the digest covers them as zero. A frame the guest
    /// or the VMM writes during a migration is sent again as usual (the
    /// engine forgets the mark of every dirty frame); outside a migration
    /// nothing watches, so call [`GuestRam::populate_range`] before the
    /// guest may use a range again (a balloon's deflate, a plug). A range
    /// must be whole pages inside one region.
    pub fn discard_range(&self, gpa: Gpa, bytes: u64) -> Result<(), RamError> {
        let (first, count) = self.whole_pages_in_ram(gpa, bytes)?;
        self.discard(first, count)?;
        self.any_discarded.store(true, Ordering::Release);
        (first.0..first.0 + count).for_each(|g| {
            self.discarded.insert(Gfn(g));
        });
        Ok(())
    }

    /// Takes back a range [`GuestRam::discard_range`] marked: the guest may
    /// use it again, and a migration sends it.
    pub fn populate_range(&self, gpa: Gpa, bytes: u64) -> Result<(), RamError> {
        let (first, count) = self.whole_pages_in_ram(gpa, bytes)?;
        (first.0..first.0 + count).for_each(|g| self.discarded.remove(Gfn(g)));
        Ok(())
    }

    /// The VMM writes `len` bytes at `gpa`: those frames hold data again.
    fn written(&self, gpa: Gpa, len: usize) {
        if len == 0 || !self.any_discarded.load(Ordering::Acquire) {
            return;
        }
        let last = Gpa(gpa.0.saturating_add(len as u64 - 1)).gfn();
        (gpa.gfn().0..=last.0).for_each(|g| self.discarded.remove(Gfn(g)));
    }

    /// Frames marked discarded now.
    pub fn discarded_pages(&self) -> u64 {
        self.discarded.count()
    }

    /// Forgets the discard mark of every frame in `written`: what was
    /// written since is data again.
    pub fn forget_discarded(&self, written: &DirtyPages) {
        if !self.any_discarded.load(Ordering::Acquire) {
            return;
        }
        for gfn in written.iter() {
            self.discarded.remove(gfn);
        }
    }

    /// `bytes` from `gpa` as frames, if they are whole pages inside one
    /// region.
    fn whole_pages_in_ram(&self, gpa: Gpa, bytes: u64) -> Result<(Gfn, u64), RamError> {
        let page = PAGE_SIZE as u64;
        let outside = || RamError::NotInRam { gpa, bytes };
        if bytes == 0 || !gpa.0.is_multiple_of(page) || !bytes.is_multiple_of(page) {
            return Err(outside());
        }
        let end = gpa.0.checked_add(bytes).ok_or_else(outside)?;
        self.slots
            .iter()
            .find(|s| s.gpa.0 <= gpa.0 && end <= s.gpa.0 + s.size)
            .map(|_| (gpa.gfn(), bytes / page))
            .ok_or_else(outside)
    }

    /// Copies `data` into guest RAM at frame `first`. Marks the pages VMM-dirty.
    pub fn write_pages(&self, first: Gfn, data: &[u8]) -> Result<(), RamError> {
        self.write_bytes(first.gpa(), data)
    }

    /// Copies `data` into guest RAM at `gpa`. Marks the pages VMM-dirty
    /// (and no longer discarded).
    pub fn write_bytes(&self, gpa: Gpa, data: &[u8]) -> Result<(), RamError> {
        self.written(gpa, data.len());
        self.mem
            .write_slice(data, GuestAddress(gpa.0))
            .map_err(|_| RamError::OutOfRange {
                gpa,
                len: data.len(),
            })
    }

    /// Atomically loads the aligned u64 at `gpa` (acquire), e.g. a counter the
    /// guest publishes.
    pub fn load_u64(&self, gpa: Gpa) -> Result<u64, RamError> {
        self.mem
            .load(GuestAddress(gpa.0), Ordering::Acquire)
            .map_err(|_| RamError::OutOfRange { gpa, len: 8 })
    }

    /// Atomically stores the aligned u64 at `gpa` (release). Marks the page VMM-dirty.
    pub fn store_u64(&self, gpa: Gpa, value: u64) -> Result<(), RamError> {
        self.written(gpa, 8);
        self.mem
            .store(value, GuestAddress(gpa.0), Ordering::Release)
            .map_err(|_| RamError::OutOfRange { gpa, len: 8 })
    }

    /// Drops the contents of `count` frames from `first`, so that they are
    /// missing again: the next touch faults (and, with userfaultfd
    /// registered, asks for the page). Anonymous memory uses
    /// `MADV_DONTNEED`; the shared backings (memfd, hugetlb) `MADV_REMOVE`,
    /// which frees their page cache too. Hugetlb drops whole 2 MiB pages
    /// only: the range must be 2 MiB aligned.
    pub fn discard(&self, first: Gfn, count: u64) -> Result<(), RamError> {
        self.advise(first, count, |slot| match slot.backing {
            Backing::Memfd | Backing::Hugetlb => libc::MADV_REMOVE,
            Backing::Anonymous | Backing::Thp => libc::MADV_DONTNEED,
        })
    }

    /// Unmaps `count` frames from `first` from this mapping but keeps a
    /// memfd's or hugetlb's contents in their page cache, so that the next touch is a
    /// MINOR fault (with userfaultfd MINOR registered) that finds the data
    /// already there. On anonymous memory this is [`GuestRam::discard`].
    pub fn unmap(&self, first: Gfn, count: u64) -> Result<(), RamError> {
        self.advise(first, count, |_| libc::MADV_DONTNEED)
    }

    fn advise(
        &self,
        first: Gfn,
        count: u64,
        advice: impl Fn(&RamSlot) -> libc::c_int,
    ) -> Result<(), RamError> {
        let end = first.0 + count;
        for slot in &self.slots {
            let (lo, hi) = (
                first.0.max(slot.first_gfn().0),
                end.min(slot.first_gfn().0 + slot.pages()),
            );
            if lo >= hi {
                continue;
            }
            let gpa = Gfn(lo).gpa();
            let fail = |hint, source| RamError::Discard { gpa, hint, source };
            if slot.backing == Backing::Hugetlb
                && (!(lo - slot.first_gfn().0).is_multiple_of(512)
                    || !(hi - lo).is_multiple_of(512))
            {
                return Err(fail(
                    ": hugetlb backing drops 2 MiB at a time, not single pages",
                    std::io::Error::from(std::io::ErrorKind::Unsupported),
                ));
            }
            let host =
                self.host_address(slot) as usize + ((lo - slot.first_gfn().0) as usize) * PAGE_SIZE;
            // SAFETY: [host, host + len) lies inside this slot's mapping, which
            // `self` owns for its whole life; dropping its contents changes
            // what the memory reads (zeros, or a fault), never its validity.
            let r = unsafe {
                libc::madvise(
                    host as *mut libc::c_void,
                    (hi - lo) as usize * PAGE_SIZE,
                    advice(slot),
                )
            };
            if r != 0 {
                return Err(fail("", std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }

    /// Moves every page the VMM wrote since the last call into `into`.
    pub fn take_vmm_dirty(&self, into: &mut DirtyPages) {
        for (slot, region) in self.slots.iter().zip(self.mem.iter()) {
            let mapping: &vm_memory::MmapRegion<AtomicBitmap> = region;
            let words = mapping.bitmap().get_and_reset();
            into.merge_words(slot.first_gfn(), &words);
        }
    }
}

/// Refuses hugetlb regions mixed with others: userfaultfd placement and
/// postcopy work in one page size.
fn check_backings(backings: impl Iterator<Item = Backing> + Clone) -> Result<(), RamError> {
    let huge = backings.clone().filter(|&b| b == Backing::Hugetlb).count();
    if huge > 0 && huge != backings.count() {
        return Err(RamError::Regions(
            "hugetlb regions cannot be mixed with regions of another backing".into(),
        ));
    }
    Ok(())
}

fn map_region(
    size: u64,
    backing: Backing,
) -> Result<vm_memory::MmapRegion<AtomicBitmap>, RamError> {
    let page = NonZeroUsize::new(PAGE_SIZE).expect("non-zero");
    let bitmap = AtomicBitmap::new(size as usize, page);
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let builder = MmapRegionBuilder::new_with_bitmap(size as usize, bitmap).with_mmap_prot(prot);
    let (builder, hint) = match backing {
        Backing::Anonymous | Backing::Thp => (builder.with_mmap_flags(anon), ""),
        // No MAP_NORESERVE: the reservation must fail here, with a hint,
        // not later as a fault the guest cannot survive. Shared, like a
        // VMM's hugetlbfs file: its pages live in a page cache, so a
        // postcopy destination can fill them there and map them on a MINOR
        // fault (`GuestRam::unmap`), as with memfd.
        Backing::Hugetlb => (
            builder
                .with_mmap_flags(libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB)
                .with_hugetlbfs(true),
            ": reserve 2 MiB huge pages first (echo N > /proc/sys/vm/nr_hugepages)",
        ),
        Backing::Memfd => {
            let file = memfd(size)?;
            (
                builder
                    .with_mmap_flags(libc::MAP_SHARED | libc::MAP_NORESERVE)
                    .with_file_offset(FileOffset::new(file, 0)),
                "",
            )
        }
    };
    let region = builder.build().map_err(|source| RamError::Map {
        size,
        backing,
        hint,
        source,
    })?;
    if backing == Backing::Thp {
        // SAFETY: the range is exactly the mapping vm-memory just created and
        // still owns; madvise only changes how the kernel backs it.
        let rc =
            unsafe { libc::madvise(region.as_ptr().cast(), region.size(), libc::MADV_HUGEPAGE) };
        if rc != 0 {
            tracing::warn!("madvise(MADV_HUGEPAGE) failed; THP backing falls back to 4K pages");
        }
    }
    Ok(region)
}

fn memfd(size: u64) -> Result<std::fs::File, RamError> {
    // SAFETY: the name is a valid NUL-terminated string; the returned fd is
    // checked before use and owned by the File below.
    let fd = unsafe { libc::memfd_create(c"ferry-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(RamError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(size).map_err(RamError::Memfd)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn slots_are_contiguous_from_zero() {
        let ram = GuestRam::new(&[2 * MIB, 4 * MIB], Backing::Anonymous).unwrap();
        assert_eq!(ram.slots()[1].gpa, Gpa(2 * MIB));
        assert_eq!(ram.pages(), 6 * MIB / 4096);
    }

    #[test]
    fn regions_may_leave_holes_that_are_not_ram() {
        let ram = GuestRam::with_regions(
            &[(Gpa(0), 2 * MIB), (Gpa(8 * MIB), 4 * MIB)],
            Backing::Anonymous,
        )
        .unwrap();
        assert_eq!(ram.size(), 6 * MIB);
        assert_eq!(ram.pages(), 12 * MIB / 4096);
        assert_eq!(ram.holes(), vec![(Gfn(512), 1536)]);
        assert!(ram.is_ram(Gfn(511)) && !ram.is_ram(Gfn(512)) && ram.is_ram(Gfn(2048)));
        assert_eq!(ram.frames().count(), 6 * MIB / 4096);
        ram.store_u64(Gpa(8 * MIB), 9).unwrap();
        assert!(ram.store_u64(Gpa(4 * MIB), 9).is_err(), "a hole is not RAM");
        let mut dirty = DirtyPages::new(ram.pages());
        ram.take_vmm_dirty(&mut dirty);
        assert_eq!(dirty.iter().collect::<Vec<_>>(), vec![Gfn(2048)]);
        let err = GuestRam::with_regions(
            &[(Gpa(4 * MIB), 4 * MIB), (Gpa(6 * MIB), 2 * MIB)],
            Backing::Anonymous,
        )
        .unwrap_err();
        assert!(matches!(err, RamError::Overlap { slot: 1, .. }), "{err}");
    }

    #[test]
    fn unaligned_slot_is_rejected() {
        let err = GuestRam::new(&[MIB], Backing::Anonymous).unwrap_err();
        assert!(matches!(err, RamError::UnalignedSlot { .. }));
    }

    #[test]
    fn every_backing_round_trips_and_marks_vmm_writes() {
        for backing in [Backing::Anonymous, Backing::Thp, Backing::Memfd] {
            let ram = GuestRam::new(&[2 * MIB, 2 * MIB], backing).unwrap();
            // One write in each slot: both must show up as VMM-dirty.
            ram.write_pages(Gfn(1), &[7u8; PAGE_SIZE]).unwrap();
            ram.store_u64(Gfn(600).gpa(), 0xfeed).unwrap();
            let mut buf = vec![0u8; PAGE_SIZE];
            ram.read_pages(Gfn(1), &mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == 7), "{backing:?}");
            assert_eq!(ram.load_u64(Gfn(600).gpa()).unwrap(), 0xfeed);
            let mut dirty = DirtyPages::new(ram.pages());
            ram.take_vmm_dirty(&mut dirty);
            assert_eq!(dirty.iter().collect::<Vec<_>>(), vec![Gfn(1), Gfn(600)]);
            let mut again = DirtyPages::new(ram.pages());
            ram.take_vmm_dirty(&mut again);
            assert!(again.is_empty(), "harvest must reset the VMM bitmap");
        }
    }

    #[test]
    fn out_of_range_access_is_an_error() {
        let ram = GuestRam::new(&[2 * MIB], Backing::Anonymous).unwrap();
        let mut buf = [0u8; PAGE_SIZE];
        assert!(ram.read_pages(Gfn(512), &mut buf).is_err());
    }

    #[test]
    fn each_region_keeps_its_own_backing() {
        let ram = GuestRam::with_backed_regions(&[
            (Gpa(0), 2 * MIB, Backing::Memfd),
            (Gpa(4 * MIB), 2 * MIB, Backing::Anonymous),
        ])
        .unwrap();
        let backings: Vec<_> = ram.slots().iter().map(|s| s.backing).collect();
        assert_eq!(backings, [Backing::Memfd, Backing::Anonymous]);
        // Dropping contents takes each region's own way, and both read zero.
        for gpa in [Gpa(0x1000), Gpa(4 * MIB + 0x1000)] {
            ram.store_u64(gpa, 7).unwrap();
            ram.discard_range(gpa, PAGE_SIZE as u64).unwrap();
            assert_eq!(ram.load_u64(gpa).unwrap(), 0, "{gpa}");
        }
        let mixed = GuestRam::with_backed_regions(&[
            (Gpa(0), 2 * MIB, Backing::Hugetlb),
            (Gpa(2 * MIB), 2 * MIB, Backing::Anonymous),
        ]);
        let e = mixed.unwrap_err().to_string();
        assert!(e.contains("hugetlb regions cannot be mixed"), "{e}");
        let e = GuestRam::new(&[2 * MIB], Backing::Anonymous)
            .unwrap()
            .with_backings(&[Backing::Memfd, Backing::Memfd])
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 backings for 1 regions"), "{e}");
    }
}
