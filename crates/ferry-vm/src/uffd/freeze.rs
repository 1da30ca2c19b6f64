//! Freezing guest RAM while the guest runs on: userfaultfd's write-protect
//! mode, as QEMU's background snapshot uses it.
//!
//! [`Placer::freeze`] write-protects every slot. From then on a write to a
//! frozen page, by a vCPU (through KVM's fault path), by a device thread,
//! or by KVM itself (its clock and steal-time pages), blocks the writer and
//! queues a fault event ([`Placer::wait_faults`]). [`Placer::thaw`] lifts
//! the protection from a range and wakes its writers. Reads never block. So
//! a reader that thaws each range only after it has read it reads memory
//! exactly as it was when frozen.
//!
//! Only memory that no other process maps can be frozen this way: a write
//! through another process's mapping of a shared file would not see this
//! mapping's protection. So only the private backings (anonymous, THP) are
//! taken; [`Placer::freeze`] refuses the others, and hugetlb.

use super::abi::*;
use super::{Placer, Range};
use crate::ram::{Backing, GuestRam};
use crate::types::{Gfn, PAGE_SIZE};
use std::io;

impl Placer {
    /// Write-protects all of `ram` (see the module's docs). Fails where
    /// the kernel has no write-protect mode for userfaultfd, and for RAM
    /// that is not private to this process.
    pub fn freeze(ram: &GuestRam) -> io::Result<Placer> {
        Self::freeze_as(ram, true)
    }

    /// [`Placer::freeze`], with WP_UNPOPULATED only where `may_skip_populate`
    /// (a test takes the older kernels' way on a new one).
    fn freeze_as(ram: &GuestRam, may_skip_populate: bool) -> io::Result<Placer> {
        if let Some(slot) = ram
            .slots()
            .iter()
            .find(|s| !matches!(s.backing, Backing::Anonymous | Backing::Thp))
        {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "slot at frame {:#x} is {:?}: only private RAM (anonymous, THP) can be frozen, \
                     as another process may write a shared one",
                    slot.first_gfn().0,
                    slot.backing
                ),
            ));
        }
        // Without WP_UNPOPULATED (before Linux 6.4) a page never touched has
        // no entry to protect, and a write there would go unseen: those
        // kernels get every page mapped first (the zero page, for one never
        // written).
        let wp = UFFD_FEATURE_PAGEFAULT_FLAG_WP;
        let with_unpopulated = match may_skip_populate {
            true => open(wp | UFFD_FEATURE_WP_UNPOPULATED).ok(),
            false => None,
        };
        let (fd, unpopulated) = match with_unpopulated {
            Some(fd) => (fd, true),
            None => (open(wp)?, false),
        };
        let mut placer = Placer {
            fd,
            ranges: Vec::new(),
            granule: 1,
            foreign: false,
            frozen: true,
        };
        for slot in ram.slots() {
            placer.add(ram, slot.first_gfn(), slot.pages(), UFFDIO_REGISTER_MODE_WP)?;
        }
        for r in placer.ranges.clone() {
            if !unpopulated {
                populate_read(r)?;
            }
            placer.protect(r, UFFDIO_WRITEPROTECT_MODE_WP)?;
        }
        Ok(placer)
    }

    /// Lifts the write protection from `pages` frames from `first` (every
    /// registered range they cross; holes are skipped), waking whoever
    /// waits to write them.
    pub fn thaw(&self, first: Gfn, pages: u64) -> io::Result<()> {
        let end = first.0 + pages;
        for r in &self.ranges {
            let (from, to) = (first.0.max(r.first), end.min(r.first + r.pages));
            if from < to {
                let part = Range {
                    first: from,
                    pages: to - from,
                    host: r.host + (from - r.first) * PAGE_SIZE as u64,
                };
                self.protect(part, 0)?;
            }
        }
        Ok(())
    }

    /// UFFDIO_WRITEPROTECT over `r` with `mode` (WP sets, 0 lifts and wakes).
    fn protect(&self, r: Range, mode: u64) -> io::Result<()> {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange {
                start: r.host,
                len: r.pages * PAGE_SIZE as u64,
            },
            mode,
        };
        // SAFETY: UFFDIO_WRITEPROTECT takes a uffdio_writeprotect over a
        // range this Placer registered; it changes page protections only.
        unsafe { uffd_ioctl(&self.fd, UFFDIO_WRITEPROTECT, &mut wp) }
    }
}

/// Maps every page of `r` for reading (`MADV_POPULATE_READ`): pages already
/// present cost a page-table walk, the rest map the zero page.
fn populate_read(r: Range) -> io::Result<()> {
    let len = r.pages as usize * PAGE_SIZE;
    // SAFETY: the range is this process's mapping of a RAM slot; populating
    // it for reading changes no contents.
    let rc = unsafe { libc::madvise(r.host as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn frozen(ram: &GuestRam, may_skip_populate: bool) -> Option<Placer> {
        match Placer::freeze_as(ram, may_skip_populate) {
            Ok(p) => Some(p),
            Err(e) => {
                crate::skip!("SKIP: userfaultfd write-protect unavailable here ({e}); not run");
                None
            }
        }
    }

    #[test]
    fn a_write_to_frozen_ram_waits_for_its_thaw_and_a_read_does_not() {
        // Both ways: pages never touched protected by the kernel
        // (WP_UNPOPULATED), or mapped first as older kernels need.
        for may_skip_populate in [true, false] {
            writes_wait_for_their_thaw(may_skip_populate);
        }
    }

    fn writes_wait_for_their_thaw(may_skip_populate: bool) {
        let ram = Arc::new(GuestRam::new(&[2 << 20, 2 << 20], Backing::Thp).unwrap());
        ram.store_u64(Gfn(600).gpa(), 1).unwrap();
        let Some(placer) = frozen(&ram, may_skip_populate) else {
            return;
        };
        // A page never written (its slot never touched) is frozen too.
        assert_eq!(ram.load_u64(Gfn(3).gpa()).unwrap(), 0);
        let writer = |gfn: u64, v: u64| {
            let ram = Arc::clone(&ram);
            std::thread::spawn(move || ram.store_u64(Gfn(gfn).gpa(), v).unwrap())
        };
        let (a, b) = (writer(600, 2), writer(3, 5));
        let mut faults = Vec::new();
        while faults.len() < 2 {
            placer
                .wait_faults(Duration::from_secs(5), &mut faults)
                .unwrap();
        }
        let mut touched: Vec<u64> = faults.iter().map(|f| f.gfn.0).collect();
        touched.sort();
        assert_eq!(touched, [3, 600]);
        // Both writers wait: memory is as it was when frozen.
        assert_eq!(ram.load_u64(Gfn(600).gpa()).unwrap(), 1);
        assert_eq!(ram.load_u64(Gfn(3).gpa()).unwrap(), 0);
        assert!(!a.is_finished() && !b.is_finished());
        placer.thaw(Gfn(600), 1).unwrap();
        a.join().unwrap();
        assert_eq!(ram.load_u64(Gfn(600).gpa()).unwrap(), 2);
        assert!(!b.is_finished(), "page 3 is still frozen");
        // Dropping the placer thaws the rest.
        drop(placer);
        b.join().unwrap();
        assert_eq!(ram.load_u64(Gfn(3).gpa()).unwrap(), 5);
        ram.store_u64(Gfn(4).gpa(), 6).unwrap();
    }

    #[test]
    fn shared_ram_is_not_frozen() {
        let ram = GuestRam::new(&[2 << 20], Backing::Memfd).unwrap();
        let err = Placer::freeze(&ram).err().expect("refused");
        assert!(err.to_string().contains("private"), "{err}");
    }
}
