//! Placing pages into guest RAM with userfaultfd: without the kernel
//! zeroing them first (precopy), and on demand (postcopy and
//! `ferry bench demand-paging`).
//!
//! A destination writing a page into fresh anonymous memory pays twice: the
//! first touch faults, the kernel zeroes the page (`clear_page_erms`, 2 MiB
//! at a time with THP), then the received data overwrites it. On this
//! project's nested hosts that zeroing took most of a destination's time.
//! `UFFDIO_COPY` into a region registered with userfaultfd in MISSING mode
//! allocates each page and fills it from our buffer in one step: no zeroing.
//!
//! ```text
//!   register(ram)             SIGBUS on a stray touch; MISSING over every
//!                             non-hugetlb slot; placement only
//!   register_for_faults(ram)  postcopy: a touch of a missing page blocks the
//!                             toucher and queues a fault event (hugetlb: 2 MiB)
//!   register_range(..)        one range, MISSING or MINOR, any backing; the
//!                             demand-paging bench gives each vCPU its own
//!   copy(gfn, data)           UFFDIO_COPY: missing pages only; EEXIST stops at
//!                             a present page, which is never overwritten
//!   resume(gfn, pages)        UFFDIO_CONTINUE: map pages already in the page
//!                             cache (MINOR)
//!   foreign(device fd, ..)    another process's registration (a vhost-user
//!                             backend's): read its faults, and
//!   wake(gfn, pages)          UFFDIO_WAKE its waiters once the pages are in
//!                             the shared memory by another way
//!   freeze(ram)               WP over all RAM: a write blocks the writer
//!                             and queues a fault until
//!   thaw(gfn, pages)          lifts the protection and wakes the writers
//!   drop                      thaws what is frozen; UFFDIO_UNREGISTER (not
//!                             a foreign one's)
//! ```
//!
//! With `UFFD_FEATURE_SIGBUS` a stray touch of a missing page while the
//! region is registered is a SIGBUS, never a thread blocked for ever: no
//! handler thread serves faults then. Without it, a touch of a missing page
//! blocks the toucher (a vCPU inside `KVM_RUN`, or any thread) until a
//! handler reads the event ([`Placer::wait_faults`], or
//! [`Placer::read_faults`] when it busy-polls) and places the page, which
//! wakes every thread waiting on it.
//!
//! Hugetlb ranges take whole 2 MiB pages ([`Placer::granule_pages`]). The
//! engine's precopy batches are smaller, so `register` leaves hugetlb slots
//! out (precopy writes them as before); `register_for_faults` and
//! `register_range` take them, 2 MiB at a time (the engine's postcopy
//! fills each huge page before it places it).

mod abi;
mod device_faults;
mod faults;
mod freeze;

use crate::ram::{Backing, GuestRam};
use crate::types::{Gfn, PAGE_SIZE};
use abi::*;
use std::io;
use std::os::fd::OwnedFd;

pub use device_faults::DeviceFaults;
pub use faults::{Fault, FaultMode};

/// The ioctl requests this module makes, by name: what a seccomp filter
/// must let `ioctl`'s second argument be (`ferry_engine::seccomp::ioctls`).
pub const IOCTL_REQUESTS: &[(&str, u64, &str)] = &[
    (
        "USERFAULTFD_IOC_NEW",
        USERFAULTFD_IOC_NEW,
        "a userfaultfd from /dev/userfaultfd",
    ),
    ("UFFDIO_API", UFFDIO_API, "the userfaultfd's features"),
    (
        "UFFDIO_REGISTER",
        UFFDIO_REGISTER,
        "registering guest RAM for its missing or minor faults",
    ),
    (
        "UFFDIO_UNREGISTER",
        UFFDIO_UNREGISTER,
        "once all pages are in, or on failure",
    ),
    (
        "UFFDIO_COPY",
        UFFDIO_COPY,
        "placing a page into anonymous RAM",
    ),
    (
        "UFFDIO_CONTINUE",
        UFFDIO_CONTINUE,
        "mapping a page already written into a memfd's or hugetlb file's page cache",
    ),
    (
        "UFFDIO_WRITEPROTECT",
        UFFDIO_WRITEPROTECT,
        "freezing guest RAM for a snapshot's proof while the guest runs on, then thawing it",
    ),
    (
        "UFFDIO_WAKE",
        UFFDIO_WAKE,
        "waking a device's threads once the pages they fault on are in",
    ),
];

/// Frames in a 2 MiB huge page.
const HUGE_PAGES: u64 = 512;

/// One registered host range.
#[derive(Clone, Copy, Debug)]
struct Range {
    first: u64,
    pages: u64,
    host: u64,
}

/// Guest RAM registered with one userfaultfd.
pub struct Placer {
    fd: OwnedFd,
    ranges: Vec<Range>,
    /// Frames per placement: 1, or 512 on hugetlb.
    granule: u64,
    /// Another process registered the ranges (in its own address space):
    /// they are not this one's to unregister.
    foreign: bool,
    /// The ranges are write-protected ([`Placer::freeze`]): dropping the
    /// Placer thaws them first.
    frozen: bool,
}

/// What [`Placer::copy`] did.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Placed {
    /// The first `n` pages were placed (all of them, or all up to the end of
    /// their slot); the rest were not tried.
    Copied(u64),
    /// The first `n` pages were placed and page `n` is present already:
    /// write it normally.
    PresentAt(u64),
    /// The range is not registered (hugetlb): write it normally.
    Unregistered,
}

impl Placer {
    /// Registers every slot of `ram` that can take page-sized copies; a
    /// touch of a missing page is a SIGBUS. Fails where userfaultfd is
    /// unavailable; callers then write as before.
    pub fn register(ram: &GuestRam) -> io::Result<Placer> {
        Self::register_slots(ram, abi::open(UFFD_FEATURE_SIGBUS)?, false)
    }

    /// Registers all of `ram` for postcopy: a touch of a missing page
    /// blocks the toucher until the page is placed, and queues a fault for
    /// [`Placer::wait_faults`], naming the thread that waits
    /// ([`Fault::thread`]: which vCPU it is). On hugetlb backing the unit is
    /// the 2 MiB page ([`Placer::granule_pages`]): copies there must be
    /// whole.
    pub fn register_for_faults(ram: &GuestRam) -> io::Result<Placer> {
        Self::register_slots(ram, abi::open_naming_threads(0)?, true)
    }

    fn register_slots(ram: &GuestRam, fd: OwnedFd, hugetlb_too: bool) -> io::Result<Placer> {
        let hugetlb = ram.backing() == Backing::Hugetlb;
        let mut placer = Placer {
            fd,
            ranges: Vec::new(),
            granule: if hugetlb { HUGE_PAGES } else { 1 },
            foreign: false,
            frozen: false,
        };
        if !hugetlb || hugetlb_too {
            for slot in ram.slots() {
                placer.add(
                    ram,
                    slot.first_gfn(),
                    slot.pages(),
                    UFFDIO_REGISTER_MODE_MISSING,
                )?;
            }
        }
        Ok(placer)
    }

    /// Registers `pages` frames from `first` (inside one slot) on a
    /// userfaultfd of their own, in `mode`; a touch of a missing page
    /// blocks until a handler places it. Any backing: hugetlb ranges must
    /// be 2 MiB aligned and are placed 2 MiB at a time; MINOR needs memfd or
    /// hugetlb backing (pages already in the page cache).
    pub fn register_range(
        ram: &GuestRam,
        first: Gfn,
        pages: u64,
        mode: FaultMode,
    ) -> io::Result<Placer> {
        // The range lies in one slot: its backing decides.
        let backing = ram
            .slots()
            .iter()
            .find(|s| (s.first_gfn().0..s.first_gfn().0 + s.pages()).contains(&first.0))
            .map_or(ram.backing(), |s| s.backing);
        let hugetlb = backing == Backing::Hugetlb;
        let (features, reg_mode) = match mode {
            FaultMode::Missing => (0, UFFDIO_REGISTER_MODE_MISSING),
            FaultMode::Minor => match backing {
                Backing::Memfd => (UFFD_FEATURE_MINOR_SHMEM, UFFDIO_REGISTER_MODE_MINOR),
                Backing::Hugetlb => (UFFD_FEATURE_MINOR_HUGETLBFS, UFFDIO_REGISTER_MODE_MINOR),
                other => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("MINOR faults need memfd or hugetlb backing, not {other:?}"),
                    ))
                }
            },
        };
        let granule = if hugetlb { HUGE_PAGES } else { 1 };
        if !first.0.is_multiple_of(granule) || !pages.is_multiple_of(granule) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a hugetlb range must start and end on 2 MiB boundaries",
            ));
        }
        let mut placer = Placer {
            fd: abi::open(features)?,
            ranges: Vec::new(),
            granule,
            foreign: false,
            frozen: false,
        };
        placer.add(ram, first, pages, reg_mode)?;
        Ok(placer)
    }

    /// Registers frames `first..first + pages`, which must lie in one slot.
    fn add(&mut self, ram: &GuestRam, first: Gfn, pages: u64, mode: u64) -> io::Result<()> {
        let slot = ram
            .slots()
            .iter()
            .find(|s| first.0 >= s.first_gfn().0 && first.0 + pages <= s.first_gfn().0 + s.pages())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "range is not inside one slot")
            })?;
        let host =
            ram.host_address(slot) as u64 + (first.0 - slot.first_gfn().0) * PAGE_SIZE as u64;
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: host,
                len: pages * PAGE_SIZE as u64,
            },
            mode,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER takes a uffdio_register; the range is our
        // own mapping of the slot, which outlives this Placer (the caller
        // keeps `ram` alive; Drop unregisters).
        unsafe { uffd_ioctl(&self.fd, UFFDIO_REGISTER, &mut reg)? };
        self.ranges.push(Range {
            first: first.0,
            pages,
            host,
        });
        Ok(())
    }

    /// A device's userfaultfd (see [`crate::DeviceUserfaultfd`]): its
    /// faults read as guest frames through its regions, and [`Placer::wake`]
    /// wakes them; nothing is copied through it.
    pub fn foreign(device: crate::DeviceUserfaultfd) -> Placer {
        Placer {
            fd: device.fd,
            ranges: device
                .regions
                .iter()
                .map(|r| Range {
                    first: r.first.0,
                    pages: r.pages,
                    host: r.host,
                })
                .collect(),
            granule: 1,
            foreign: true,
            frozen: false,
        }
    }

    /// This registration handed over as a device's
    /// ([`crate::DeviceUserfaultfd`]), for a device of this process that
    /// maps guest memory a second time (`GuestRam::from_files`): whoever
    /// brings memory in lazily serves it as it serves a vhost-user
    /// backend's. The registration lasts while the returned fd is open.
    pub fn into_device(mut self, name: &str) -> io::Result<crate::DeviceUserfaultfd> {
        let fd = self.fd.try_clone()?;
        // The registration is the device's now: dropping this leaves it.
        self.foreign = true;
        let regions = self
            .ranges
            .iter()
            .map(|r| crate::DeviceRegion {
                first: Gfn(r.first),
                pages: r.pages,
                host: r.host,
            })
            .collect();
        Ok(crate::DeviceUserfaultfd {
            name: name.to_string(),
            fd,
            regions,
        })
    }

    /// Wakes whoever waits on `pages` frames from `first` (pages another
    /// mapping of the same memory has since received).
    pub fn wake(&self, first: Gfn, pages: u64) -> io::Result<()> {
        let Some(r) = self.range_of(first.0) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame not registered here",
            ));
        };
        let pages = pages.min(r.first + r.pages - first.0);
        let mut range = UffdioRange {
            start: r.host + (first.0 - r.first) * PAGE_SIZE as u64,
            len: pages * PAGE_SIZE as u64,
        };
        // SAFETY: UFFDIO_WAKE takes a uffdio_range; it only wakes threads
        // blocked on faults in that range, and reads the struct.
        unsafe { uffd_ioctl(&self.fd, UFFDIO_WAKE, &mut range) }
    }

    /// Frames one placement covers: 1, or 512 for a hugetlb range (copies
    /// and resumes there must be 2 MiB aligned and whole).
    pub fn granule_pages(&self) -> u64 {
        self.granule
    }

    /// The registered range holding `gfn`.
    fn range_of(&self, gfn: u64) -> Option<Range> {
        self.ranges
            .iter()
            .copied()
            .find(|r| gfn >= r.first && gfn < r.first + r.pages)
    }

    /// Places `data` (whole pages) at frame `first` by copy, as far as the
    /// pages are missing and lie in `first`'s range (see [`Placed`]).
    pub fn copy(&self, first: Gfn, data: &[u8]) -> io::Result<Placed> {
        let Some(r) = self.range_of(first.0) else {
            return Ok(Placed::Unregistered);
        };
        // Up to the end of this range; the caller goes on from there.
        let pages = ((data.len() / PAGE_SIZE) as u64).min(r.first + r.pages - first.0);
        let mut done = 0u64;
        while done < pages {
            let mut c = UffdioCopy {
                dst: r.host + (first.0 - r.first + done) * PAGE_SIZE as u64,
                src: data.as_ptr() as u64 + done * PAGE_SIZE as u64,
                len: (pages - done) * PAGE_SIZE as u64,
                mode: 0,
                copy: 0,
            };
            // SAFETY: UFFDIO_COPY takes a uffdio_copy. `dst` lies in a range
            // this Placer registered (checked above); `src` points into
            // `data`, which is valid for `len` bytes; the kernel only reads it.
            let r = unsafe { uffd_ioctl(&self.fd, UFFDIO_COPY, &mut c) };
            if c.copy > 0 {
                done += c.copy as u64 / PAGE_SIZE as u64;
            }
            match r {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Ok(Placed::PresentAt(done))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Placed::Copied(pages))
    }

    /// Places `pages` frames of zeros at `first`, as far as they are
    /// missing and lie in `first`'s range (see [`Placed`]): no data is
    /// read or copied (anonymous memory maps the shared zero page until
    /// the guest writes).
    pub fn zero(&self, first: Gfn, pages: u64) -> io::Result<Placed> {
        let Some(r) = self.range_of(first.0) else {
            return Ok(Placed::Unregistered);
        };
        let pages = pages.min(r.first + r.pages - first.0);
        let mut done = 0u64;
        while done < pages {
            let mut z = UffdioZeropage {
                range: UffdioRange {
                    start: r.host + (first.0 - r.first + done) * PAGE_SIZE as u64,
                    len: (pages - done) * PAGE_SIZE as u64,
                },
                mode: 0,
                zeropage: 0,
            };
            // SAFETY: UFFDIO_ZEROPAGE takes a uffdio_zeropage over a range
            // this Placer registered (checked above); the kernel maps zeros
            // there and writes back only the count in the struct.
            let r = unsafe { uffd_ioctl(&self.fd, UFFDIO_ZEROPAGE, &mut z) };
            if z.zeropage > 0 {
                done += z.zeropage as u64 / PAGE_SIZE as u64;
            }
            match r {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Ok(Placed::PresentAt(done))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Placed::Copied(pages))
    }

    /// Maps `pages` frames from `first` whose contents are already in the
    /// page cache (a MINOR range), waking their waiters. Returns false if
    /// a page was mapped already (by another handler).
    pub fn resume(&self, first: Gfn, pages: u64) -> io::Result<bool> {
        let Some(r) = self.range_of(first.0) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame not registered here",
            ));
        };
        let pages = pages.min(r.first + r.pages - first.0);
        let mut c = UffdioContinue {
            range: UffdioRange {
                start: r.host + (first.0 - r.first) * PAGE_SIZE as u64,
                len: pages * PAGE_SIZE as u64,
            },
            mode: 0,
            mapped: 0,
        };
        // SAFETY: UFFDIO_CONTINUE takes a uffdio_continue over a range this
        // Placer registered (checked above); it maps existing page-cache
        // pages and writes nothing.
        match unsafe { uffd_ioctl(&self.fd, UFFDIO_CONTINUE, &mut c) } {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Placer {
    fn drop(&mut self) {
        if self.foreign {
            return;
        }
        if self.frozen {
            // Never leave a writer waiting, nor a page read-only after us.
            for r in &self.ranges {
                if let Err(e) = self.thaw(Gfn(r.first), r.pages) {
                    tracing::warn!("userfaultfd thaw: {e}");
                }
            }
        }
        for r in &self.ranges {
            let mut range = UffdioRange {
                start: r.host,
                len: r.pages * PAGE_SIZE as u64,
            };
            // SAFETY: UFFDIO_UNREGISTER takes a uffdio_range we registered.
            if let Err(e) = unsafe { uffd_ioctl(&self.fd, UFFDIO_UNREGISTER, &mut range) } {
                tracing::warn!("userfaultfd unregister: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_missing_pages_and_stops_at_present_ones() {
        let ram = GuestRam::new(&[2 << 20], Backing::Thp).unwrap();
        let placer = match Placer::register(&ram) {
            Ok(p) => p,
            Err(e) => {
                crate::skip!("SKIP: userfaultfd unavailable here ({e}); placement test not run");
                return;
            }
        };
        let data: Vec<u8> = (0..3 * PAGE_SIZE)
            .map(|i| (i / PAGE_SIZE) as u8 + 1)
            .collect();
        assert_eq!(placer.copy(Gfn(10), &data).unwrap(), Placed::Copied(3));
        // Pages 10..13 are present now: a copy over 8..12 stops at 10.
        assert_eq!(
            placer.copy(Gfn(8), &data[..PAGE_SIZE * 3]).unwrap(),
            Placed::PresentAt(2)
        );
        // A copy never runs past the end of its slot (512 pages).
        assert_eq!(placer.copy(Gfn(511), &data).unwrap(), Placed::Copied(1));
        drop(placer);
        let mut back = vec![0u8; 5 * PAGE_SIZE];
        ram.read_pages(Gfn(8), &mut back).unwrap();
        assert_eq!(back[0], 1, "page 8 placed");
        assert_eq!(back[PAGE_SIZE], 2, "page 9 placed");
        assert_eq!(
            &back[2 * PAGE_SIZE..],
            &data[..],
            "10..13 kept the first copy"
        );
    }

    #[test]
    fn a_touch_of_a_missing_page_waits_for_its_copy() {
        let ram = std::sync::Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap());
        let placer = match Placer::register_for_faults(&ram) {
            Ok(p) => p,
            Err(e) => {
                crate::skip!("SKIP: userfaultfd unavailable here ({e}); fault test not run");
                return;
            }
        };
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let toucher = {
            let ram = std::sync::Arc::clone(&ram);
            std::thread::spawn(move || {
                tid_tx.send(crate::current_thread_id()).unwrap();
                ram.load_u64(Gfn(7).gpa()).unwrap()
            })
        };
        let mut faults = Vec::new();
        while faults.is_empty() {
            placer
                .wait_faults(std::time::Duration::from_secs(5), &mut faults)
                .unwrap();
        }
        assert_eq!(faults[0].gfn, Gfn(7));
        assert_eq!(
            faults[0].thread,
            tid_rx.recv().unwrap(),
            "the toucher is named"
        );
        let page = [0x5au8; PAGE_SIZE];
        assert_eq!(placer.copy(Gfn(7), &page).unwrap(), Placed::Copied(1));
        assert_eq!(toucher.join().unwrap(), 0x5a5a_5a5a_5a5a_5a5a);
        // Discarded, the page is missing again: the next copy places it.
        ram.discard(Gfn(7), 1).unwrap();
        let other = [0x11u8; PAGE_SIZE];
        assert_eq!(placer.copy(Gfn(7), &other).unwrap(), Placed::Copied(1));
        drop(placer);
        assert_eq!(ram.load_u64(Gfn(7).gpa()).unwrap(), 0x1111_1111_1111_1111);
    }

    #[test]
    fn hugetlb_registers_for_faults_in_2m_granules() {
        let Ok(ram) = GuestRam::new(&[2 << 20, 4 << 20], Backing::Hugetlb) else {
            crate::skip!("SKIP: no free 2 MiB huge pages here; test not run");
            return;
        };
        match Placer::register_for_faults(&ram) {
            Ok(p) => assert_eq!(p.granule_pages(), 512),
            Err(e) => crate::skip!("SKIP: userfaultfd unavailable here ({e}); test not run"),
        }
    }

    /// A thread touching `gfn` of `ram` (blocks until the page is placed).
    fn toucher(ram: &std::sync::Arc<GuestRam>, gfn: u64) -> std::thread::JoinHandle<u64> {
        let ram = std::sync::Arc::clone(ram);
        std::thread::spawn(move || ram.load_u64(Gfn(gfn).gpa()).unwrap())
    }

    fn first_fault(placer: &Placer) -> Gfn {
        let mut faults = Vec::new();
        while faults.is_empty() {
            placer
                .wait_faults(std::time::Duration::from_secs(5), &mut faults)
                .unwrap();
        }
        faults[0].gfn
    }

    #[test]
    fn a_minor_fault_maps_the_page_cache_contents() {
        let ram = std::sync::Arc::new(GuestRam::new(&[2 << 20], Backing::Memfd).unwrap());
        ram.write_pages(Gfn(5), &[0x33u8; PAGE_SIZE]).unwrap();
        ram.unmap(Gfn(5), 1).unwrap();
        let placer = match Placer::register_range(&ram, Gfn(0), 512, FaultMode::Minor) {
            Ok(p) => p,
            Err(e) => {
                crate::skip!("SKIP: userfaultfd MINOR unavailable here ({e}); test not run");
                return;
            }
        };
        let t = toucher(&ram, 5);
        assert_eq!(first_fault(&placer), Gfn(5));
        assert!(placer.resume(Gfn(5), 1).unwrap());
        assert_eq!(
            t.join().unwrap(),
            0x3333_3333_3333_3333,
            "the cached contents"
        );
        assert!(!placer.resume(Gfn(5), 1).unwrap(), "mapped already");
    }

    #[test]
    fn minor_needs_a_page_cache() {
        let ram = GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap();
        let err = Placer::register_range(&ram, Gfn(0), 512, FaultMode::Minor)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("memfd"), "{err}");
    }

    #[test]
    fn a_hugetlb_range_is_placed_2m_at_a_time() {
        let Ok(ram) = GuestRam::new(&[2 << 20], Backing::Hugetlb) else {
            crate::skip!("SKIP: no free 2 MiB huge page here; hugetlb fault test not run");
            return;
        };
        let ram = std::sync::Arc::new(ram);
        assert!(Placer::register_range(&ram, Gfn(1), 511, FaultMode::Missing).is_err());
        let placer = match Placer::register_range(&ram, Gfn(0), 512, FaultMode::Missing) {
            Ok(p) => p,
            Err(e) => {
                crate::skip!("SKIP: userfaultfd unavailable here ({e}); test not run");
                return;
            }
        };
        assert_eq!(placer.granule_pages(), 512);
        let t = toucher(&ram, 100);
        assert_eq!(first_fault(&placer), Gfn(0), "the huge page's first frame");
        let huge: Vec<u8> = (0..2 << 20).map(|i| (i / PAGE_SIZE) as u8).collect();
        assert_eq!(placer.copy(Gfn(0), &huge).unwrap(), Placed::Copied(512));
        assert_eq!(
            t.join().unwrap(),
            0x6464_6464_6464_6464,
            "page 100 of the copy"
        );
    }
}
