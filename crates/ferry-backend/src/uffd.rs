//! Placing received pages without the kernel zeroing them first.
//!
//! A destination writing a page into fresh anonymous memory pays twice: the
//! first touch faults, the kernel zeroes the page (`clear_page_erms`, 2 MiB
//! at a time with THP), then the received data overwrites it. On this
//! project's nested hosts that zeroing took 82% of a destination's time.
//! `UFFDIO_COPY` into a region registered with userfaultfd in MISSING mode
//! allocates each page and fills it from our buffer in one step: no zeroing.
//! Postcopy needs the same registration to serve faults, so this is also
//! where its page placement starts.
//!
//! ```text
//!   register(ram)        /dev/userfaultfd (O_NONBLOCK), UFFDIO_API with SIGBUS,
//!                        UFFDIO_REGISTER MISSING over every slot
//!   copy(gfn, data)      UFFDIO_COPY: missing pages only; EEXIST stops at a
//!                        present page, which the caller writes normally
//!   drop                 UFFDIO_UNREGISTER (before the guest runs)
//! ```
//!
//! With `UFFD_FEATURE_SIGBUS` a stray touch of a missing page while the
//! region is registered is a SIGBUS, never a thread blocked for ever: no
//! handler thread serves faults here. Postcopy registers without it
//! ([`Placer::register_for_faults`]): a touch of a missing page blocks the
//! toucher (a vCPU inside `KVM_RUN`, or any thread) and queues a fault
//! event, which a handler reads with [`Placer::wait_faults`]; the
//! `UFFDIO_COPY` that places the page wakes every thread waiting on it. Hugetlb slots are not registered
//! (UFFDIO_COPY there needs whole 2 MiB pages, and a batch is smaller); their
//! pages are written as before.
//!
//! The kernel structures and ioctl numbers are written out here (they are
//! part of the stable uapi, `linux/userfaultfd.h`) and checked by a test.

use crate::ram::{Backing, GuestRam};
use crate::types::{Gfn, PAGE_SIZE};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const UFFD_API: u64 = 0xaa;
const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
/// Bytes of one `struct uffd_msg`.
const UFFD_MSG_LEN: usize = 32;

/// `_IOC(dir, 0xaa, nr, size)` of `linux/userfaultfd.h`.
const fn uffd_ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (0xaa << 8) | nr
}
const IOC_READ: u64 = 2;
const IOC_RW: u64 = 3;
const USERFAULTFD_IOC_NEW: u64 = uffd_ioc(0, 0x00, 0);
const UFFDIO_API: u64 = uffd_ioc(IOC_RW, 0x3f, 24);
const UFFDIO_REGISTER: u64 = uffd_ioc(IOC_RW, 0x00, 32);
const UFFDIO_UNREGISTER: u64 = uffd_ioc(IOC_READ, 0x01, 16);
const UFFDIO_COPY: u64 = uffd_ioc(IOC_RW, 0x03, 40);

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// Guest RAM registered for placement by copy.
pub struct Placer {
    fd: OwnedFd,
    /// Registered host ranges, one per non-hugetlb slot: (first gfn, pages, host address).
    ranges: Vec<(u64, u64, u64)>,
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

/// `ioctl` on a userfaultfd with a pointer argument.
///
/// # Safety
/// `arg` must point to the structure `req` expects, valid for the call.
unsafe fn uffd_ioctl<T>(fd: &OwnedFd, req: u64, arg: *mut T) -> io::Result<()> {
    // SAFETY: the caller passes the structure `req` expects.
    if unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Placer {
    /// Registers every slot of `ram` that can take page-sized copies; a
    /// touch of a missing page is a SIGBUS. Fails where userfaultfd is
    /// unavailable; callers then write as before.
    pub fn register(ram: &GuestRam) -> io::Result<Placer> {
        Self::open(ram, UFFD_FEATURE_SIGBUS)
    }

    /// Registers all of `ram` for postcopy: a touch of a missing page
    /// blocks the toucher until the page is placed, and queues a fault for
    /// [`Placer::wait_faults`]. Hugetlb backing is refused (it needs
    /// 2 MiB placements).
    pub fn register_for_faults(ram: &GuestRam) -> io::Result<Placer> {
        if ram.backing() == Backing::Hugetlb {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "postcopy on hugetlb backing is not supported yet (it needs 2 MiB placements)",
            ));
        }
        Self::open(ram, 0)
    }

    fn open(ram: &GuestRam, features: u64) -> io::Result<Placer> {
        // SAFETY: opening a device node; the path is a valid C string.
        let dev =
            unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if dev < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dev` is a freshly opened descriptor we own.
        let dev = unsafe { OwnedFd::from_raw_fd(dev) };
        let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as libc::c_int;
        // SAFETY: USERFAULTFD_IOC_NEW takes its flags by value and returns a new fd.
        let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the ioctl returned a new descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API takes a uffdio_api.
        unsafe { uffd_ioctl(&fd, UFFDIO_API, &mut api)? };
        let mut ranges = Vec::new();
        if ram.backing() != Backing::Hugetlb {
            for slot in ram.slots() {
                let host = ram.host_address(slot) as u64;
                let mut reg = UffdioRegister {
                    range: UffdioRange {
                        start: host,
                        len: slot.size,
                    },
                    mode: UFFDIO_REGISTER_MODE_MISSING,
                    ioctls: 0,
                };
                // SAFETY: UFFDIO_REGISTER takes a uffdio_register; the range is
                // our own mapping of the slot, which outlives this Placer
                // (the caller keeps `ram` alive; Drop unregisters).
                unsafe { uffd_ioctl(&fd, UFFDIO_REGISTER, &mut reg)? };
                ranges.push((slot.first_gfn().0, slot.pages(), host));
            }
        }
        Ok(Placer { fd, ranges })
    }

    /// Places `data` (whole pages) at frame `first` by copy, as far as the
    /// pages are missing and lie in `first`'s slot (see [`Placed`]).
    pub fn copy(&self, first: Gfn, data: &[u8]) -> io::Result<Placed> {
        let Some(&(slot_first, slot_pages, host)) = self
            .ranges
            .iter()
            .find(|(f, n, _)| first.0 >= *f && first.0 < f + n)
        else {
            return Ok(Placed::Unregistered);
        };
        // Up to the end of this slot; the caller goes on from there.
        let pages = ((data.len() / PAGE_SIZE) as u64).min(slot_first + slot_pages - first.0);
        let mut done = 0u64;
        while done < pages {
            let mut c = UffdioCopy {
                dst: host + (first.0 - slot_first + done) * PAGE_SIZE as u64,
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
}

impl Placer {
    /// Waits up to `timeout` for fault events and appends the frame of each
    /// missing page touched to `out` (a page touched by several threads may
    /// appear more than once). Returns with `out` unchanged on timeout.
    pub fn wait_faults(&self, timeout: std::time::Duration, out: &mut Vec<Gfn>) -> io::Result<()> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        let mut buf = [0u8; UFFD_MSG_LEN * 64];
        loop {
            // SAFETY: reading into our own buffer of the length given; the fd
            // is non-blocking, so this returns EAGAIN once the queue is empty.
            let got =
                unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if got < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(()),
                    _ => Err(e),
                };
            }
            if got == 0 {
                return Ok(());
            }
            for msg in buf[..got as usize].chunks_exact(UFFD_MSG_LEN) {
                if msg[0] != UFFD_EVENT_PAGEFAULT {
                    continue;
                }
                let mut a = [0u8; 8];
                a.copy_from_slice(&msg[16..24]);
                if let Some(gfn) = self.gfn_of(u64::from_ne_bytes(a)) {
                    out.push(gfn);
                }
            }
        }
    }

    /// The guest frame at host address `addr`, if registered here.
    fn gfn_of(&self, addr: u64) -> Option<Gfn> {
        self.ranges.iter().find_map(|&(first, pages, host)| {
            let off = addr.checked_sub(host)? / PAGE_SIZE as u64;
            (off < pages).then_some(Gfn(first + off))
        })
    }
}

impl Drop for Placer {
    fn drop(&mut self) {
        for &(_, pages, host) in &self.ranges {
            let mut range = UffdioRange {
                start: host,
                len: pages * PAGE_SIZE as u64,
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
    fn ioctl_numbers_match_the_uapi() {
        // From linux/userfaultfd.h on x86-64.
        assert_eq!(USERFAULTFD_IOC_NEW, 0xaa00);
        assert_eq!(UFFDIO_API, 0xc018_aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020_aa00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_aa01);
        assert_eq!(UFFDIO_COPY, 0xc028_aa03);
    }

    #[test]
    fn copies_missing_pages_and_stops_at_present_ones() {
        let ram = GuestRam::new(&[2 << 20], Backing::Thp).unwrap();
        let placer = match Placer::register(&ram) {
            Ok(p) => p,
            Err(e) => {
                println!("SKIP: userfaultfd unavailable here ({e}); placement test not run");
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
                println!("SKIP: userfaultfd unavailable here ({e}); fault test not run");
                return;
            }
        };
        let toucher = {
            let ram = std::sync::Arc::clone(&ram);
            std::thread::spawn(move || ram.load_u64(Gfn(7).gpa()).unwrap())
        };
        let mut faults = Vec::new();
        while faults.is_empty() {
            placer
                .wait_faults(std::time::Duration::from_secs(5), &mut faults)
                .unwrap();
        }
        assert_eq!(faults[0], Gfn(7));
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
    fn hugetlb_is_refused_for_faults() {
        if let Ok(ram) = GuestRam::new(&[2 << 20], Backing::Hugetlb) {
            let err = Placer::register_for_faults(&ram).err().expect("refused");
            assert!(err.to_string().contains("hugetlb"), "{err}");
        }
    }
}
