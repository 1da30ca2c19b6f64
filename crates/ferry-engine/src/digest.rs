//! The memory digest that proves source and destination hold the same guest
//! memory at switchover.
//!
//! Hashing all memory takes far longer than the downtime budget, so the digest
//! is built from per-page hashes: `digest = xxh3_64(h[0] ‖ h[1] ‖ … ‖ h[n-1])`
//! with `h[i] = xxh3_64(page i)` (little-endian u64s). The destination keeps
//! `h` up to date as pages arrive, so its digest at switchover is one hash
//! over 8 bytes per page (2 MiB for a 1 GiB guest). The source hashes its
//! actual, frozen memory, independent of dirty tracking, so a page the
//! tracking missed shows up as a mismatch; it does so after the destination
//! has resumed, on [`source_digest_threads`] threads.

use ferry_vm::{is_zero_page, Gfn, GuestRam, RamError, PAGE_SIZE};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// A digest of all guest memory: the page count and one xxh3-64 over the
/// per-page hash array (see the module's docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryDigest {
    /// Pages covered.
    pub pages: u64,
    /// xxh3-64 over the per-page hash array.
    pub value: u64,
}

/// The most threads the source hashes its memory on.
pub const SOURCE_DIGEST_THREADS: usize = 8;

/// Threads the source hashes its memory on: one per CPU it may run on
/// (its affinity mask), up to [`SOURCE_DIGEST_THREADS`]. The guest's
/// outputs are held until the digest's verdict, so the source, whose guest
/// no longer runs, uses the CPUs it has; more threads than CPUs would only
/// take CPU time from whatever else runs on them (on one host, the
/// destination's guest). Only `sched_getaffinity`, which a seccomp filter
/// allows ([`crate::seccomp`]).
pub fn source_digest_threads() -> usize {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, and the call writes
    // at most its size.
    let cpus = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        match libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) {
            0 => libc::CPU_COUNT(&set) as usize,
            _ => 2,
        }
    };
    cpus.clamp(1, SOURCE_DIGEST_THREADS)
}

/// Pages hashed per in-place borrow of guest memory (1 MiB).
const CHUNK_PAGES: usize = 256;

/// Hash of one page (xxh3-64; of any bytes, though a whole page takes the
/// CPU's widest vectors, see `page_xxh3`).
#[inline]
pub fn page_hash(page: &[u8]) -> u64 {
    match page.try_into() {
        Ok(page) => crate::page_xxh3::hash(page),
        Err(_) => xxh3_64(page),
    }
}

/// Hash of a page of zeros.
pub fn zero_page_hash() -> u64 {
    static ZERO: OnceLock<u64> = OnceLock::new();
    *ZERO.get_or_init(|| xxh3_64(&[0u8; PAGE_SIZE]))
}

/// Feeds `values` to `h` as little-endian u64s (the layout both the digest
/// and the frame's page check hash).
pub(crate) fn hash_u64s(h: &mut Xxh3, values: &[u64]) {
    let mut buf = [0u8; 8 * 512];
    for chunk in values.chunks(512) {
        for (dst, v) in buf.chunks_exact_mut(8).zip(chunk) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 8]);
    }
}

/// The digest of a per-page hash array.
pub fn digest_of(hashes: &[u64]) -> MemoryDigest {
    let mut h = Xxh3::new();
    hash_u64s(&mut h, hashes);
    MemoryDigest {
        pages: hashes.len() as u64,
        value: h.digest(),
    }
}

/// The destination's per-page hashes, updated as pages arrive (by several
/// receiver threads at once; a page is written by one of them at a time).
#[derive(Debug)]
pub struct PageHashes {
    hashes: Vec<AtomicU64>,
}

impl PageHashes {
    /// Hashes of `pages` zero pages (what fresh guest RAM holds).
    pub fn zeroed(pages: u64) -> Self {
        PageHashes {
            hashes: (0..pages)
                .map(|_| AtomicU64::new(zero_page_hash()))
                .collect(),
        }
    }

    /// Records the hash of frame `gfn`. Out-of-range frames are ignored
    /// (batches are bounds-checked before they get here).
    #[inline]
    pub fn set(&self, gfn: Gfn, hash: u64) {
        if let Some(h) = self.hashes.get(gfn.0 as usize) {
            h.store(hash, Ordering::Relaxed);
        }
    }

    /// The digest of the memory these hashes describe.
    pub fn digest(&self) -> MemoryDigest {
        let all: Vec<u64> = self
            .hashes
            .iter()
            .map(|h| h.load(Ordering::Relaxed))
            .collect();
        dump_if_asked("destination", &all);
        digest_of(&all)
    }
}

/// A diagnostic: with `FERRY_DIGEST_DUMP=DIR` set, each side writes the
/// per-page hashes its digest is made of to `DIR/SIDE-PID.hashes` (one
/// little-endian u64 per page), so that after a digest mismatch the pages
/// that differ can be named by comparing the two files.
fn dump_if_asked(side: &str, hashes: &[u64]) {
    let Some(dir) = std::env::var_os("FERRY_DIGEST_DUMP") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(format!("{side}-{}.hashes", std::process::id()));
    let bytes: Vec<u8> = hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
    match std::fs::write(&path, bytes) {
        Ok(()) => tracing::info!("page hashes written to {}", path.display()),
        Err(e) => tracing::warn!("cannot write page hashes to {}: {e}", path.display()),
    }
}

/// Hashes every page of `ram` on `threads` threads and returns the digest.
/// A hole between regions counts as a zero page, as on a destination that
/// never receives it. The caller keeps the guest paused, or the result
/// describes no single moment of memory.
pub fn memory_digest(ram: &GuestRam, threads: usize) -> Result<MemoryDigest, RamError> {
    let pages = ram.pages() as usize;
    let mut hashes = vec![0u64; pages];
    let per_thread = pages.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        // Named for a VMM's seccomp list (`ferry_engine::seccomp::THREADS`).
        let workers: Vec<_> = hashes
            .chunks_mut(per_thread)
            .enumerate()
            .map(|(t, out)| {
                let first = t * per_thread;
                std::thread::Builder::new()
                    .name(format!("digest-{}", t + 1))
                    .spawn_scoped(s, move || hash_range(ram, first, out))
                    // As `Scope::spawn` does: no thread, no digest.
                    .expect("a digest thread")
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })?;
    dump_if_asked("source", &hashes);
    Ok(digest_of(&hashes))
}

fn hash_range(ram: &GuestRam, first: usize, out: &mut [u64]) -> Result<(), RamError> {
    let zero = zero_page_hash();
    for (c, hashes) in out.chunks_mut(CHUNK_PAGES).enumerate() {
        let chunk = (first + c * CHUNK_PAGES) as u64;
        hashes.fill(zero);
        for (gfn, n) in ram.ram_runs(Gfn(chunk), hashes.len() as u64) {
            let at = (gfn.0 - chunk) as usize;
            let run = &mut hashes[at..at + n as usize];
            // SAFETY: memory_digest's caller keeps the guest paused and its
            // devices quiet (its documented contract), so nothing writes
            // these frames while they are read.
            unsafe { ram.with_frames(gfn, n, |bytes| hash_pages(bytes, run)) }?;
        }
    }
    Ok(())
}

/// Hashes each page of `bytes` into `hashes`. A page of zeros (most of an
/// idle guest's memory) gets [`zero_page_hash`] after a scan that costs
/// about half of hashing it, and a page with data stops the scan at its
/// first nonzero word.
fn hash_pages(bytes: &[u8], hashes: &mut [u64]) {
    let zero = zero_page_hash();
    for (h, page) in hashes.iter_mut().zip(bytes.chunks_exact(PAGE_SIZE)) {
        *h = match is_zero_page(page) {
            true => zero,
            false => page_hash(page),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_vm::{Backing, Gpa};

    /// One thread per CPU the source may run on: pinned to one CPU, it
    /// hashes on one thread.
    #[test]
    fn the_source_hashes_on_one_thread_per_cpu_it_may_use() {
        let all = source_digest_threads();
        assert!((1..=SOURCE_DIGEST_THREADS).contains(&all), "{all}");
        let pinned = std::thread::spawn(|| {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU 0 is
            // added, and the call reads at most its size.
            let r = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
            };
            assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
            source_digest_threads()
        });
        assert_eq!(pinned.join().unwrap(), 1);
    }

    #[test]
    fn zero_hash_is_hash_of_zero_page() {
        assert_eq!(zero_page_hash(), page_hash(&[0u8; PAGE_SIZE]));
        assert_ne!(zero_page_hash(), page_hash(&[1u8; PAGE_SIZE]));
    }

    #[test]
    fn digest_of_memory_equals_digest_of_tracked_hashes() {
        let ram = GuestRam::new(&[2 << 20, 2 << 20], Backing::Anonymous).unwrap();
        let tracked = PageHashes::zeroed(ram.pages());
        for (g, fill) in [(3u64, 7u8), (700, 9), (1023, 1)] {
            let page = [fill; PAGE_SIZE];
            ram.write_pages(Gfn(g), &page).unwrap();
            tracked.set(Gfn(g), page_hash(&page));
        }
        for threads in [1, 2, 3] {
            assert_eq!(memory_digest(&ram, threads).unwrap(), tracked.digest());
        }
        // One byte changed anywhere in a page of zeros changes the digest,
        // its last byte too (the zero scan reads every byte).
        for (g, at) in [(512u64, 100u64), (513, 0), (514, PAGE_SIZE as u64 - 1)] {
            let ram = GuestRam::new(&[2 << 20, 2 << 20], Backing::Anonymous).unwrap();
            ram.write_bytes(Gfn(g).gpa().add(at), &[1]).unwrap();
            let mut page = [0u8; PAGE_SIZE];
            page[at as usize] = 1;
            let tracked = PageHashes::zeroed(ram.pages());
            tracked.set(Gfn(g), page_hash(&page));
            assert_eq!(memory_digest(&ram, 2).unwrap(), tracked.digest(), "{g}");
            assert_ne!(tracked.digest(), PageHashes::zeroed(ram.pages()).digest());
        }
    }

    #[test]
    fn a_hole_hashes_as_the_zero_pages_a_destination_never_receives() {
        let layout = [(Gpa(0), 2 << 20), (Gpa(6 << 20), 2 << 20)];
        let ram = GuestRam::with_regions(&layout, Backing::Anonymous).unwrap();
        let tracked = PageHashes::zeroed(ram.pages());
        let page = [5u8; PAGE_SIZE];
        ram.write_pages(Gfn(1536), &page).unwrap();
        tracked.set(Gfn(1536), page_hash(&page));
        for threads in [1, 3] {
            assert_eq!(memory_digest(&ram, threads).unwrap(), tracked.digest());
        }
    }

    #[test]
    fn digests_differ_with_order_and_content() {
        let a = digest_of(&[1, 2, 3]);
        assert_eq!(a, digest_of(&[1, 2, 3]));
        assert_ne!(a, digest_of(&[3, 2, 1]));
        assert_ne!(a, digest_of(&[1, 2, 3, 4]));
    }
}
