//! The proof of a snapshot whose guest runs on, made after the pause.
//!
//! A snapshot proves itself by hashing the guest's memory as it was at the
//! pause, on its own, and holding that to the page hashes the file holds: a
//! write the dirty logs missed shows as a mismatch. Made inside the pause,
//! the proof made the pause as long as a hash of all memory (about 1 s of a
//! 1.1 s pause for 512 MiB inside the SVM host, where the last pages took
//! under 100 ms).
//!
//! So where the guest runs on, the pause freezes its memory instead
//! (userfaultfd's write-protect: `ferry_vm::uffd::Placer::freeze`, as QEMU's
//! background snapshot does) and ends. Threads then hash memory in address
//! order, a block of 2 MiB at a time, and thaw each block once it is
//! hashed. A writer (a vCPU, a device, KVM) that touches a block not yet
//! hashed waits until it is: the block's fault jumps the queue, so the
//! writer waits for at most one block's hash. Every hash is therefore of
//! the memory at the pause.
//!
//! Where memory cannot be frozen (shared or hugetlb RAM, or a kernel
//! without the write-protect mode) the proof is made inside the pause, as
//! before. A guest left stopped needs no freezing.

use crate::digest::{page_hash, MemoryDigest, PageHashes};
use ferry_vm::uffd::{Fault, Placer};
use ferry_vm::{Gfn, GuestRam, RamError, PAGE_SIZE};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Frames in a block: 2 MiB, a transparent huge page.
const BLOCK_PAGES: u64 = 512;

/// Where a snapshot's proof was made.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProofAt {
    /// Inside the pause, memory hashed while the guest was stopped.
    Pause,
    /// After the pause, memory frozen while the guest ran on.
    Frozen,
    /// Not made ([`super::SnapshotOptions::verify`] off).
    Skipped,
}

impl ProofAt {
    /// Its name, as the JSON spells it.
    pub fn name(self) -> &'static str {
        match self {
            ProofAt::Pause => "pause",
            ProofAt::Frozen => "frozen",
            ProofAt::Skipped => "skipped",
        }
    }

    /// The guest's pause in words, with where the proof's `digest_ms` went.
    pub fn pause_words(self, pause_ms: f64, digest_ms: f64) -> String {
        match self {
            ProofAt::Pause => {
                format!("{pause_ms:.0} ms ({digest_ms:.0} ms of it the proof's hash)")
            }
            ProofAt::Frozen => format!(
                "{pause_ms:.0} ms (the proof's hash after it, memory frozen: {digest_ms:.0} ms)"
            ),
            ProofAt::Skipped => format!("{pause_ms:.0} ms (no proof)"),
        }
    }
}

/// Guest memory frozen at the pause: [`Frozen::hash`] hashes and thaws it.
pub(super) struct Frozen<'a> {
    ram: &'a GuestRam,
    placer: Placer,
}

/// Freezes `ram`, or says why it cannot (the caller proves in the pause).
pub(super) fn freeze(ram: &GuestRam) -> Option<Frozen<'_>> {
    match Placer::freeze(ram) {
        Ok(placer) => Some(Frozen { ram, placer }),
        Err(e) => {
            tracing::info!("the snapshot's proof is made in the pause: {e}");
            None
        }
    }
}

impl Frozen<'_> {
    /// Hashes all memory as it was frozen, on `threads` threads, thawing
    /// each block once hashed, and returns the digest. Whatever happens,
    /// all memory is thawed when this returns.
    pub(super) fn hash(self, threads: usize) -> Result<MemoryDigest, RamError> {
        let pages = self.ram.pages();
        let blocks = pages.div_ceil(BLOCK_PAGES) as usize;
        let work = Work {
            ram: self.ram,
            placer: &self.placer,
            hashes: PageHashes::zeroed(pages),
            claimed: (0..blocks).map(|_| AtomicBool::new(false)).collect(),
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
        };
        std::thread::scope(|s| {
            // Named for a VMM's seccomp list (`ferry_engine::seccomp::THREADS`).
            let workers: Vec<_> = (0..threads.max(1))
                .map(|t| {
                    std::thread::Builder::new()
                        .name(format!("digest-{}", t + 1))
                        .spawn_scoped(s, || work.run())
                        // As `Scope::spawn` does: no thread, no proof.
                        .expect("a digest thread")
                })
                .collect();
            workers
                .into_iter()
                .try_for_each(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        })?;
        Ok(work.hashes.digest())
    }
}

/// What the hashing threads share.
struct Work<'a> {
    ram: &'a GuestRam,
    placer: &'a Placer,
    hashes: PageHashes,
    /// A block is hashed by whoever claims it first.
    claimed: Vec<AtomicBool>,
    /// The next block in address order.
    next: AtomicUsize,
    failed: AtomicBool,
}

impl Work<'_> {
    /// One thread: blocks that writers wait on first, then the next in
    /// address order, until every block is claimed. A thread that fails
    /// stops the others.
    fn run(&self) -> Result<(), RamError> {
        let result = self.serve();
        if result.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        result
    }

    fn serve(&self) -> Result<(), RamError> {
        let mut buf = vec![0u8; BLOCK_PAGES as usize * PAGE_SIZE];
        let mut faults: Vec<Fault> = Vec::new();
        while !self.failed.load(Ordering::Relaxed) {
            faults.clear();
            // A fault that cannot be read is still served: its block comes
            // in address order, and the end thaws everything.
            if let Err(e) = self.placer.read_faults(&mut faults) {
                tracing::warn!("the snapshot's proof cannot read write faults: {e}");
            }
            for f in &faults {
                self.hash_block((f.gfn.0 / BLOCK_PAGES) as usize, &mut buf)?;
            }
            let b = self.next.fetch_add(1, Ordering::Relaxed);
            if b >= self.claimed.len() {
                break;
            }
            self.hash_block(b, &mut buf)?;
        }
        Ok(())
    }

    /// Hashes block `b` and thaws it, unless another thread claimed it.
    fn hash_block(&self, b: usize, buf: &mut [u8]) -> Result<(), RamError> {
        let Some(claim) = self.claimed.get(b) else {
            return Ok(());
        };
        if claim.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let first = b as u64 * BLOCK_PAGES;
        let count = BLOCK_PAGES.min(self.ram.pages() - first);
        for (gfn, n) in self.ram.ram_runs(Gfn(first), count) {
            let bytes = &mut buf[..n as usize * PAGE_SIZE];
            self.ram.read_pages(gfn, bytes)?;
            for (i, page) in bytes.chunks_exact(PAGE_SIZE).enumerate() {
                self.hashes.set(Gfn(gfn.0 + i as u64), page_hash(page));
            }
        }
        // Hashed: its writers may go on. A thaw that fails leaves the
        // block to the end's, which thaws all memory.
        if let Err(e) = self.placer.thaw(Gfn(first), count) {
            tracing::warn!("the snapshot's proof cannot thaw frame {first:#x}: {e}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::memory_digest;
    use ferry_vm::Backing;
    use std::sync::Arc;

    /// A writer running through the whole hash changes nothing the proof
    /// sees: the digest is the one of memory at the freeze, and every
    /// write lands once the hash is done.
    #[test]
    fn the_digest_is_of_memory_at_the_freeze_while_a_writer_runs_on() {
        let ram = Arc::new(GuestRam::new(&[8 << 20, 4 << 20], Backing::Thp).unwrap());
        for g in (0..ram.pages()).step_by(3) {
            ram.store_u64(Gfn(g).gpa(), g * 7 + 1).unwrap();
        }
        let before = memory_digest(&ram, 1).unwrap();
        let Some(frozen) = freeze(&ram) else {
            ferry_vm::skip!("SKIP: userfaultfd write-protect unavailable here; not run");
            return;
        };
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (ram, stop) = (Arc::clone(&ram), Arc::clone(&stop));
            std::thread::spawn(move || {
                // From the top down, against the hash's order.
                let mut writes = 0u64;
                for g in (0..ram.pages()).rev() {
                    ram.store_u64(Gfn(g).gpa().add(8), u64::MAX - g).unwrap();
                    writes += 1;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                writes
            })
        };
        let proof = frozen.hash(2).unwrap();
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        assert_eq!(proof, before, "the frozen memory's digest");
        assert!(writes > 0);
        let top = ram.pages() - 1;
        assert_eq!(ram.load_u64(Gfn(top).gpa().add(8)).unwrap(), u64::MAX - top);
        assert_ne!(memory_digest(&ram, 1).unwrap(), before, "the writes landed");
    }
}
