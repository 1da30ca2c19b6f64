//! Guest memory as vm-memory builds it: two regions with the hole between
//! them (see [`crate::layout`]), each with the `AtomicBitmap` that records
//! the VMM's own writes, on anonymous memory or a memfd (the backing a
//! same-host upgrade hands to the next VMM process).
//!
//! Each region is mapped at a 2 MiB-aligned address, and anonymous memory
//! is advised for transparent huge pages, as QEMU maps guest RAM. KVM maps
//! a guest's memory with 2 MiB pages only where the guest-physical and the
//! host-virtual address agree modulo 2 MiB; otherwise every 4 KiB page of
//! the guest takes its own nested-paging fault, and a destination that
//! just received a busy guest pays one per page the guest touches after
//! the move (docs/svm-host-runs.md has what that cost a Linux guest).

use crate::layout::{DATA_GPA, SYSTEM_BYTES};
use ferry_engine::vmm::{Backing, PAGE_SIZE};
use std::num::NonZeroUsize;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Why memory could not be had.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// A backing minivmm does not offer.
    #[error("minivmm backs guest memory with anon or memfd, not {0:?}")]
    Backing(Backing),
    /// The data region's size.
    #[error("a data region of {0} MiB: use a positive multiple of 2 MiB, at most 3 GiB")]
    Size(u64),
    /// memfd_create or ftruncate failed.
    #[error("cannot create a memfd of {bytes} bytes")]
    Memfd {
        /// Its size.
        bytes: u64,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// vm-memory refused a region.
    #[error("cannot map guest memory: {0}")]
    Map(String),
    /// mmap failed.
    #[error("cannot map {bytes} bytes of guest memory")]
    Mmap {
        /// The region's size.
        bytes: usize,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The alignment of every region's mapping: an x86 huge page.
const HUGE_PAGE: usize = 2 << 20;

/// The two regions, the data one `data_mib` MiB.
pub fn build(
    data_mib: u64,
    backing: Backing,
) -> Result<GuestMemoryMmap<AtomicBitmap>, MemoryError> {
    if data_mib == 0 || !data_mib.is_multiple_of(2) || data_mib > 3 << 10 {
        return Err(MemoryError::Size(data_mib));
    }
    let regions = [(0, SYSTEM_BYTES), (DATA_GPA, data_mib << 20)]
        .into_iter()
        .map(|(gpa, bytes)| region(gpa, bytes, backing))
        .collect::<Result<Vec<_>, _>>()?;
    GuestMemoryMmap::from_regions(regions).map_err(|e| MemoryError::Map(e.to_string()))
}

fn region(
    gpa: u64,
    bytes: u64,
    backing: Backing,
) -> Result<GuestRegionMmap<AtomicBitmap>, MemoryError> {
    let page = NonZeroUsize::new(PAGE_SIZE).expect("non-zero");
    let builder =
        MmapRegionBuilder::new_with_bitmap(bytes as usize, AtomicBitmap::new(bytes as usize, page))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE);
    let (flags, file) = match backing {
        Backing::Anonymous => (
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            None,
        ),
        Backing::Memfd => (
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            Some(memfd(c"minivmm-guest", bytes)?),
        ),
        other => return Err(MemoryError::Backing(other)),
    };
    let addr = map_aligned(bytes as usize, flags, file.as_ref())?;
    if backing == Backing::Anonymous {
        // SAFETY: the range is the mapping just made, which nothing else
        // uses yet; the advice changes only how the kernel backs it.
        if unsafe { libc::madvise(addr.cast(), bytes as usize, libc::MADV_HUGEPAGE) } != 0 {
            eprintln!(
                "minivmm: madvise(MADV_HUGEPAGE): {}; guest memory stays on 4 KiB pages",
                std::io::Error::last_os_error()
            );
        }
    }
    let builder = builder.with_mmap_flags(flags);
    let builder = match file {
        Some(f) => builder.with_file_offset(FileOffset::new(f, 0)),
        None => builder,
    };
    // SAFETY: `addr` starts a mapping of exactly `bytes` that this process
    // keeps for its whole life (see `map_aligned`).
    let mapping = unsafe { builder.with_raw_mmap_pointer(addr.cast()) }
        .build()
        .map_err(|e| MemoryError::Map(e.to_string()))?;
    GuestRegionMmap::new(mapping, GuestAddress(gpa))
        .ok_or_else(|| MemoryError::Map(format!("a region at {gpa:#x} overflows")))
}

/// Maps `bytes` read-write with `flags` (of `file`, at offset 0, where
/// given) at a [`HUGE_PAGE`]-aligned address: a reservation a huge page
/// larger, the mapping placed over its aligned part, the rest given back.
///
/// The mapping is never unmapped: guest memory lives as long as the VMM
/// process, one VM per process, as Firecracker's does (vm-memory does not
/// unmap a mapping it did not make, and its clones may outlive any owner
/// here).
fn map_aligned(
    bytes: usize,
    flags: libc::c_int,
    file: Option<&std::fs::File>,
) -> Result<*mut libc::c_void, MemoryError> {
    use std::os::fd::AsRawFd;
    let err = |source| MemoryError::Mmap { bytes, source };
    let span = bytes + HUGE_PAGE;
    // SAFETY: a fresh inaccessible reservation at an address the kernel
    // picks; the result is checked.
    let reserved = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if reserved == libc::MAP_FAILED {
        return Err(err(std::io::Error::last_os_error()));
    }
    let start = (reserved as usize).next_multiple_of(HUGE_PAGE);
    let fd = file.map_or(-1, |f| f.as_raw_fd());
    // SAFETY: MAP_FIXED over [start, start + bytes), which lies inside the
    // reservation just made and owned by nothing else; the result is
    // checked.
    let addr = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    let mapped = addr != libc::MAP_FAILED;
    let failure = std::io::Error::last_os_error();
    let head = start - reserved as usize;
    let tail = span - head - bytes;
    let unmap = |at: usize, len: usize| {
        if len > 0 {
            // SAFETY: [at, at + len) is a part of the reservation that
            // holds no mapping of ours.
            unsafe { libc::munmap(at as *mut libc::c_void, len) };
        }
    };
    if !mapped {
        unmap(reserved as usize, span);
        return Err(err(failure));
    }
    unmap(reserved as usize, head);
    unmap(start + bytes, tail);
    Ok(addr)
}

/// A memfd of `bytes` named `name` (close-on-exec: handed to another
/// process only explicitly, over a UNIX socket).
pub fn memfd(name: &std::ffi::CStr, bytes: u64) -> Result<std::fs::File, MemoryError> {
    use std::os::fd::FromRawFd;
    let err = |source| MemoryError::Memfd { bytes, source };
    // SAFETY: a NUL-terminated name and valid flags; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(bytes).map_err(err)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

    #[test]
    fn every_region_is_mapped_where_kvm_can_use_huge_pages() {
        for backing in [Backing::Anonymous, Backing::Memfd] {
            let mem = build(8, backing).unwrap();
            for r in mem.iter() {
                let host = r.as_ptr() as usize;
                let gpa = r.start_addr().0 as usize;
                assert_eq!(host % HUGE_PAGE, 0, "{backing:?}: host address {host:#x}");
                assert_eq!((host ^ gpa) % HUGE_PAGE, 0, "{backing:?}: gpa {gpa:#x}");
                assert_eq!(
                    r.file_offset().is_some(),
                    backing == Backing::Memfd,
                    "{backing:?}: the memfd stays the region's file, for the handover"
                );
                // The whole mapping is there, writable, and starts zeroed.
                // SAFETY: within the region just mapped, which nothing else uses.
                unsafe {
                    let last = r.as_ptr().add(r.len() as usize - 1);
                    assert_eq!(*last, 0);
                    *last = 7;
                    assert_eq!(*r.as_ptr(), 0);
                }
            }
        }
    }
}
