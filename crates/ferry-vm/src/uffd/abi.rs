//! The userfaultfd uapi this crate uses, written out from
//! `linux/userfaultfd.h` (stable uapi; a test checks the ioctl numbers).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub(super) const UFFD_API: u64 = 0xaa;
/// Write-protect faults are reported (`UFFDIO_REGISTER_MODE_WP`).
pub(super) const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
pub(super) const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
/// Fault events name the faulting thread (`uffd_msg.pagefault.feat.ptid`).
pub(super) const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
pub(super) const UFFD_FEATURE_MINOR_HUGETLBFS: u64 = 1 << 9;
pub(super) const UFFD_FEATURE_MINOR_SHMEM: u64 = 1 << 10;
/// A write-protect reaches pages never touched too (Linux 6.4).
pub(super) const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
pub(super) const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
pub(super) const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
pub(super) const UFFDIO_REGISTER_MODE_MINOR: u64 = 1 << 2;
pub(super) const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
pub(super) const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
/// Bytes of one `struct uffd_msg`; the fault address is at offset 16 and,
/// with [`UFFD_FEATURE_THREAD_ID`], the faulting thread's id at 24.
pub(super) const UFFD_MSG_LEN: usize = 32;

/// `_IOC(dir, 0xaa, nr, size)` of `linux/userfaultfd.h`.
const fn uffd_ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (0xaa << 8) | nr
}
const IOC_READ: u64 = 2;
const IOC_RW: u64 = 3;
pub(super) const USERFAULTFD_IOC_NEW: u64 = uffd_ioc(0, 0x00, 0);
pub(super) const UFFDIO_API: u64 = uffd_ioc(IOC_RW, 0x3f, 24);
pub(super) const UFFDIO_REGISTER: u64 = uffd_ioc(IOC_RW, 0x00, 32);
pub(super) const UFFDIO_UNREGISTER: u64 = uffd_ioc(IOC_READ, 0x01, 16);
pub(super) const UFFDIO_COPY: u64 = uffd_ioc(IOC_RW, 0x03, 40);
pub(super) const UFFDIO_ZEROPAGE: u64 = uffd_ioc(IOC_RW, 0x04, 32);
pub(super) const UFFDIO_WRITEPROTECT: u64 = uffd_ioc(IOC_RW, 0x06, 24);
pub(super) const UFFDIO_CONTINUE: u64 = uffd_ioc(IOC_RW, 0x07, 32);
pub(super) const UFFDIO_WAKE: u64 = uffd_ioc(IOC_READ, 0x02, 16);

#[repr(C)]
pub(super) struct UffdioApi {
    pub api: u64,
    pub features: u64,
    pub ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct UffdioRange {
    pub start: u64,
    pub len: u64,
}

#[repr(C)]
pub(super) struct UffdioRegister {
    pub range: UffdioRange,
    pub mode: u64,
    pub ioctls: u64,
}

#[repr(C)]
pub(super) struct UffdioCopy {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub mode: u64,
    pub copy: i64,
}

#[repr(C)]
pub(super) struct UffdioZeropage {
    pub range: UffdioRange,
    pub mode: u64,
    pub zeropage: i64,
}

#[repr(C)]
pub(super) struct UffdioWriteprotect {
    pub range: UffdioRange,
    pub mode: u64,
}

#[repr(C)]
pub(super) struct UffdioContinue {
    pub range: UffdioRange,
    pub mode: u64,
    pub mapped: i64,
}

/// `ioctl` on a userfaultfd with a pointer argument.
///
/// # Safety
/// `arg` must point to the structure `req` expects, valid for the call.
pub(super) unsafe fn uffd_ioctl<T>(fd: &OwnedFd, req: u64, arg: *mut T) -> io::Result<()> {
    // SAFETY: the caller passes the structure `req` expects.
    if unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A new non-blocking userfaultfd from `/dev/userfaultfd`, with the API
/// handshake done for `features`.
pub(super) fn open(features: u64) -> io::Result<OwnedFd> {
    // SAFETY: opening a device node; the path is a valid C string.
    let dev = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dev` is a freshly opened descriptor we own.
    let dev = unsafe { OwnedFd::from_raw_fd(dev) };
    // Non-blocking: on this project's hosts a blocking read hung after poll.
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
    Ok(fd)
}

/// [`open`] with `features` and [`UFFD_FEATURE_THREAD_ID`], so that each
/// fault names its thread; where the kernel refuses that, without it: the
/// thread ids are worth a report, not a postcopy.
pub(super) fn open_naming_threads(features: u64) -> io::Result<OwnedFd> {
    open(features | UFFD_FEATURE_THREAD_ID).or_else(|e| {
        tracing::debug!("userfaultfd without thread ids: {e}");
        open(features)
    })
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
        assert_eq!(UFFDIO_ZEROPAGE, 0xc020_aa04);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xc018_aa06);
        assert_eq!(UFFDIO_CONTINUE, 0xc020_aa07);
    }
}
