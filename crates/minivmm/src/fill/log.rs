//! The vhost-user dirty log: a memfd the backend maps (`SET_LOG_BASE` with
//! `LOG_SHMFD`), one bit per 4 KiB guest page by guest physical address,
//! which the backend sets with an atomic OR for every page it writes. Each
//! harvest swaps every word with zero, so a bit set while it reads is kept
//! for the next one. The engine reads it through the device
//! ([`super::dirty_source`]).

use super::FillError;
use ferry_engine::vmm::{DirtyPages, Gfn, PAGE_SIZE};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use vhost::VhostUserDirtyLogRegion;

/// The log, mapped here and in the backend.
pub struct Log {
    words: *const AtomicU64,
    len: usize,
    file: File,
}

// SAFETY: the mapping is only touched through atomics, and lives until
// Drop; the pointer moves between threads with the Log.
unsafe impl Send for Log {}
// SAFETY: as above: shared access is atomic.
unsafe impl Sync for Log {}

impl Log {
    /// A zeroed log for guest memory up to `bytes` of guest physical
    /// address space (holes included: the log is indexed by address).
    pub fn new(bytes: u64) -> Result<Self, FillError> {
        let pages = bytes.div_ceil(PAGE_SIZE as u64);
        let len = pages.div_ceil(64) as usize;
        let file = crate::memory::memfd(c"minivmm-vhost-log", (len * 8) as u64)
            .map_err(|e| FillError::Memory(format!("the dirty log's memfd: {e}")))?;
        // SAFETY: a fresh shared mapping of the whole memfd, which is
        // `len * 8` bytes long; checked for failure below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(FillError::Memory(format!(
                "mapping the dirty log: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Log {
            words: map.cast(),
            len,
            file,
        })
    }

    /// What `SET_LOG_BASE` sends the backend.
    pub fn region(&self) -> VhostUserDirtyLogRegion {
        VhostUserDirtyLogRegion {
            mmap_size: (self.len * 8) as u64,
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }

    /// Moves every page marked since the last call into `into`.
    pub fn take(&self, into: &mut DirtyPages) {
        let mut words = vec![0u64; self.len];
        for (i, w) in words.iter_mut().enumerate() {
            // SAFETY: i < len, inside the mapping; u64 words are aligned
            // (the mapping is page-aligned).
            let word = unsafe { &*self.words.add(i) };
            // The backend ORs bytes: as a little-endian u64, bit n of the
            // word is page 64 i + n.
            *w = u64::from_le(word.swap(0, Ordering::AcqRel));
        }
        into.merge_words(Gfn(0), &words);
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of this length, unmapped once.
        unsafe { libc::munmap(self.words as *mut libc::c_void, self.len * 8) };
    }
}
