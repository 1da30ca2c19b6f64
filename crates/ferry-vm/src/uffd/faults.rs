//! Reading fault events: a handler thread's side of a [`Placer`].

use super::abi::{UFFD_EVENT_PAGEFAULT, UFFD_MSG_LEN};
use super::Placer;
use crate::types::{Gfn, PAGE_SIZE};
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// One fault event: the page touched, and the thread that touched it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The guest frame touched (on hugetlb, its huge page's first frame).
    pub gfn: Gfn,
    /// The kernel's id of the thread that waits for the page (a vCPU's,
    /// or a device's), where the registration asked for it
    /// ([`Placer::register_for_faults`]); 0 where it did not.
    pub thread: u32,
}

/// Which faults a range reports.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FaultMode {
    /// A touch of a page that has no contents yet (resolved by copy).
    Missing,
    /// A touch of a page whose contents are in the page cache but not
    /// mapped here (resolved by [`Placer::resume`]; memfd or hugetlb).
    Minor,
}

impl Placer {
    /// Waits up to `timeout` for fault events and appends each to `out` (a
    /// page touched by several threads appears once per thread, or more).
    /// Returns with `out` unchanged on timeout.
    pub fn wait_faults(&self, timeout: Duration, out: &mut Vec<Fault>) -> io::Result<()> {
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
        self.read_faults(out)
    }

    /// Appends every fault event queued now to `out`, without waiting: the
    /// step of a handler that busy-polls (no sleep, so no wake-up latency,
    /// at the price of a CPU).
    pub fn read_faults(&self, out: &mut Vec<Fault>) -> io::Result<()> {
        let mut buf = [0u8; UFFD_MSG_LEN * 64];
        loop {
            // The fd is non-blocking: this returns EAGAIN once the queue is empty.
            let (fd, len) = (self.fd.as_raw_fd(), buf.len());
            // SAFETY: reads at most `len` bytes into our own buffer of that length.
            let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), len) };
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
                let mut t = [0u8; 4];
                t.copy_from_slice(&msg[24..28]);
                if let Some(gfn) = self.gfn_of(u64::from_ne_bytes(a)) {
                    out.push(Fault {
                        gfn,
                        thread: u32::from_ne_bytes(t),
                    });
                }
            }
        }
    }

    /// The guest frame at host address `addr`, if registered here.
    fn gfn_of(&self, addr: u64) -> Option<Gfn> {
        self.ranges.iter().find_map(|r| {
            let off = addr.checked_sub(r.host)? / PAGE_SIZE as u64;
            (off < r.pages).then_some(Gfn(r.first + off))
        })
    }
}
