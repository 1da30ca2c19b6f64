//! Guest memory as vm-memory builds it: two regions with the hole between
//! them (see [`crate::layout`]), each with the `AtomicBitmap` that records
//! the VMM's own writes, on anonymous memory or a memfd (the backing a
//! same-host upgrade hands to the next VMM process).

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
}

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
    let builder = match backing {
        Backing::Anonymous => {
            builder.with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE)
        }
        Backing::Memfd => builder
            .with_mmap_flags(libc::MAP_SHARED | libc::MAP_NORESERVE)
            .with_file_offset(FileOffset::new(memfd(c"minivmm-guest", bytes)?, 0)),
        other => return Err(MemoryError::Backing(other)),
    };
    let mapping = builder
        .build()
        .map_err(|e| MemoryError::Map(e.to_string()))?;
    GuestRegionMmap::new(mapping, GuestAddress(gpa))
        .ok_or_else(|| MemoryError::Map(format!("a region at {gpa:#x} overflows")))
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
