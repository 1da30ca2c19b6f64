//! The digest of memory two processes share, kept off the downtime path.
//!
//! Both ends hash every page while the guest still runs on the source,
//! with the source's dirty logs on. While a busy guest leaves many pages
//! dirty, both rehash those (the source sends the list) and go again; at
//! the pause each rehashes only what was dirtied since, so the digest at
//! the pause costs the last few dirty pages, not the memory. A page
//! that lies in a hole of its file (never written) hashes as zeros without
//! being read, so an idle guest's memory is not faulted in.
//!
//! The digest is a sum over pages of a mix of the frame number and the
//! page's hash, so a rehash updates it in place. It proves the destination
//! maps the same bytes at the same guest addresses as the source.

use super::LocalError;
use crate::digest::{page_hash, zero_page_hash};
use ferry_vm::{DirtyPages, Gfn, GuestRam, PAGE_SIZE};
use std::os::fd::AsRawFd;

/// Pages read at a time.
const CHUNK: u64 = 256;

/// Per-page hashes of guest memory and their digest.
pub struct LocalDigest {
    hashes: Vec<u64>,
    sum: u64,
}

/// The frame number and the page's hash, mixed (splitmix64's finalizer).
fn mix(gfn: u64, hash: u64) -> u64 {
    let mut z = gfn.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ hash;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl LocalDigest {
    /// Hashes every page of `ram`.
    pub fn scan(ram: &GuestRam) -> Result<Self, LocalError> {
        let mut d = LocalDigest {
            hashes: vec![0; ram.pages() as usize],
            sum: 0,
        };
        let zero = zero_page_hash();
        let files = ram.region_files();
        for (i, slot) in ram.slots().iter().enumerate() {
            let first = slot.first_gfn().0;
            for g in first..first + slot.pages() {
                d.set(g, zero);
            }
            let data = match files.as_ref().map(|f| &f[i]) {
                Some((_, file, offset)) => data_runs(file.as_raw_fd(), *offset, slot.size),
                None => vec![(0, slot.pages())],
            };
            for (start, count) in data {
                d.hash_pages(ram, first + start, count)?;
            }
        }
        Ok(d)
    }

    /// Rehashes the pages in `dirty`; returns how many.
    pub fn refresh(&mut self, ram: &GuestRam, dirty: &DirtyPages) -> Result<u64, LocalError> {
        self.refresh_runs(ram, &dirty.runs())
    }

    /// Rehashes the pages in `runs` (first page, count); returns how many.
    pub fn refresh_runs(&mut self, ram: &GuestRam, runs: &[(Gfn, u64)]) -> Result<u64, LocalError> {
        let mut n = 0;
        for &(first, count) in runs {
            self.hash_pages(ram, first.0, count)?;
            n += count;
        }
        Ok(n)
    }

    /// The digest.
    pub fn value(&self) -> u64 {
        self.sum
    }

    fn set(&mut self, gfn: u64, hash: u64) {
        let old = std::mem::replace(&mut self.hashes[gfn as usize], hash);
        if old != 0 {
            self.sum = self.sum.wrapping_sub(mix(gfn, old));
        }
        self.sum = self.sum.wrapping_add(mix(gfn, hash));
    }

    fn hash_pages(&mut self, ram: &GuestRam, first: u64, count: u64) -> Result<(), LocalError> {
        let mut buf = vec![0u8; (CHUNK as usize) * PAGE_SIZE];
        let mut g = first;
        while g < first + count {
            let n = CHUNK.min(first + count - g);
            let chunk = &mut buf[..n as usize * PAGE_SIZE];
            ram.read_pages(Gfn(g), chunk)
                .map_err(|e| LocalError::Protocol(format!("reading guest memory: {e}")))?;
            for (i, page) in chunk.chunks(PAGE_SIZE).enumerate() {
                self.set(g + i as u64, page_hash(page));
            }
            g += n;
        }
        Ok(())
    }
}

/// The runs of pages, `(first page, count)` within the region, that hold
/// data in the file `fd` between `offset` and `offset + size`. Where the
/// file cannot say (no SEEK_DATA), all of it.
fn data_runs(fd: i32, offset: u64, size: u64) -> Vec<(u64, u64)> {
    let page = PAGE_SIZE as u64;
    let end = offset + size;
    let mut runs = Vec::new();
    let mut at = offset;
    while at < end {
        // SAFETY: lseek on a valid fd; it returns the position it found
        // without our needing the file's own offset (which another process
        // may move: the description is shared).
        let data = unsafe { libc::lseek(fd, at as i64, libc::SEEK_DATA) };
        if data < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break; // no data after `at`
            }
            return vec![(0, size / page)];
        }
        let data = data as u64;
        if data >= end {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as i64, libc::SEEK_HOLE) };
        let hole = if hole < 0 {
            end
        } else {
            (hole as u64).min(end)
        };
        let first = (data - offset) / page;
        let last = (hole - offset).div_ceil(page);
        runs.push((first, last - first));
        at = hole.max(data + page);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_vm::{Backing, Gpa};

    #[test]
    fn an_idle_memfd_is_hashed_from_its_data_alone_and_refresh_tracks_writes() {
        let ram = GuestRam::with_regions(
            &[(Gpa(0), 4 << 20), (Gpa(8 << 20), 2 << 20)],
            Backing::Memfd,
        )
        .unwrap();
        ram.store_u64(Gpa(0x5000), 1).unwrap();
        ram.store_u64(Gpa((8 << 20) + 0x1000), 2).unwrap();
        let a = LocalDigest::scan(&ram).unwrap();
        // The same memory, every page read: the same digest.
        let anon = GuestRam::with_regions(
            &[(Gpa(0), 4 << 20), (Gpa(8 << 20), 2 << 20)],
            Backing::Anonymous,
        )
        .unwrap();
        anon.store_u64(Gpa(0x5000), 1).unwrap();
        anon.store_u64(Gpa((8 << 20) + 0x1000), 2).unwrap();
        let mut b = LocalDigest::scan(&anon).unwrap();
        assert_eq!(a.value(), b.value());
        // A write the digest has not seen changes nothing until refreshed.
        anon.store_u64(Gpa(0x9000), 3).unwrap();
        assert_eq!(b.value(), a.value());
        let mut dirty = DirtyPages::new(anon.pages());
        dirty.set(Gfn(9));
        assert_eq!(b.refresh(&anon, &dirty).unwrap(), 1);
        assert_ne!(b.value(), a.value());
        // Moving a page's bytes to another frame is caught too.
        ram.store_u64(Gpa(0x5000), 0).unwrap();
        ram.store_u64(Gpa(0x9000), 1).unwrap();
        let mut c = LocalDigest::scan(&ram).unwrap();
        dirty.set(Gfn(5));
        c.refresh(&ram, &dirty).unwrap();
        assert_ne!(c.value(), a.value());
    }
}
