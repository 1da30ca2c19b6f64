//! Writing guest pages to their fixed places in the file, and reading them
//! back checked against the hashes the snapshot recorded.

use super::chain::PageSource;
use super::format::page_offset;
use crate::digest::{page_hash, zero_page_hash};
use crate::error::SnapshotError;
use ferry_vm::is_zero_page;
use ferry_vm::{DirtyPages, Gfn, GuestRam, PAGE_SIZE};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Pages read from guest memory, or from the file, per call (1 MiB).
const CHUNK_PAGES: u64 = 256;

/// What one pass over a set of pages wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Pages visited (RAM frames of the set).
    pub pages: u64,
    /// Of those, pages written as data.
    pub data: u64,
    /// Bytes written.
    pub bytes: u64,
}

impl Written {
    /// This pass and `other` together.
    pub fn plus(self, other: Written) -> Written {
        Written {
            pages: self.pages + other.pages,
            data: self.data + other.data,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// Writes guest pages into the file and keeps, for each frame, the hash of
/// what the snapshot holds for it (a hole holds zeros; in a diff, a frame
/// the file does not hold is its parent's).
pub struct PageWriter<'a> {
    file: &'a File,
    path: &'a Path,
    /// One hash per frame, holes included.
    pub hashes: Vec<u64>,
    /// A diff's frames that this file holds; `None` for a full snapshot,
    /// which holds them all.
    pub present: Option<DirtyPages>,
    buf: Vec<u8>,
}

impl<'a> PageWriter<'a> {
    /// A writer for a file whose page area holds only holes.
    pub fn new(file: &'a File, path: &'a Path, frames: u64) -> Self {
        PageWriter {
            file,
            path,
            hashes: vec![zero_page_hash(); frames as usize],
            present: None,
            buf: vec![0u8; (CHUNK_PAGES as usize) * PAGE_SIZE],
        }
    }

    /// A writer for a diff against a parent whose frames hash to
    /// `parent`: a page that hashes as the parent's is not written, and
    /// the file does not hold it (until a later round finds it changed).
    pub fn diff(file: &'a File, path: &'a Path, parent: Vec<u64>) -> Self {
        let frames = parent.len() as u64;
        PageWriter {
            hashes: parent,
            present: Some(DirtyPages::new(frames)),
            ..PageWriter::new(file, path, 0)
        }
    }

    /// Frames of RAM whose data this file holds.
    pub fn data_pages(&self) -> u64 {
        let zero = zero_page_hash();
        (0..self.hashes.len())
            .filter(|&g| self.hashes[g] != zero)
            .filter(|&g| {
                self.present
                    .as_ref()
                    .is_none_or(|p| p.contains(Gfn(g as u64)))
            })
            .count() as u64
    }

    /// Copies every RAM frame of `set` from `ram` to its place. A page of
    /// zeros takes no space: it is never written, and a place that held
    /// data is punched back to a hole. `after_chunk` is told what each
    /// chunk (up to 1 MiB) wrote, and may pace the writes or end them with
    /// an error (a cancel).
    pub fn write(
        &mut self,
        ram: &GuestRam,
        set: &DirtyPages,
        after_chunk: &mut dyn FnMut(Written) -> Result<(), SnapshotError>,
    ) -> Result<Written, SnapshotError> {
        let mut done = Written::default();
        for (first, count) in set.runs() {
            for (run, n) in ram.ram_runs(first, count) {
                let mut at = 0;
                while at < n {
                    let chunk = (n - at).min(CHUNK_PAGES);
                    let gfn = Gfn(run.0 + at);
                    let mut this = Written::default();
                    self.write_chunk(ram, gfn, chunk, &mut this)?;
                    done.pages += this.pages;
                    done.data += this.data;
                    done.bytes += this.bytes;
                    after_chunk(this)?;
                    at += chunk;
                }
            }
        }
        Ok(done)
    }

    fn write_chunk(
        &mut self,
        ram: &GuestRam,
        first: Gfn,
        count: u64,
        done: &mut Written,
    ) -> Result<(), SnapshotError> {
        let bytes = &mut self.buf[..count as usize * PAGE_SIZE];
        ram.read_pages_to_send(first, bytes)
            .map_err(SnapshotError::ram("read guest memory for the snapshot"))?;
        // Runs of data pages go out in one write each.
        let mut run: Option<u64> = None;
        for (i, page) in (0..count).zip(bytes.chunks_exact(PAGE_SIZE)) {
            let gfn = first.0 + i;
            let zero = is_zero_page(page);
            let hash = match zero {
                true => zero_page_hash(),
                false => page_hash(page),
            };
            if let Some(present) = &mut self.present {
                if !present.contains(Gfn(gfn)) && hash == self.hashes[gfn as usize] {
                    // The parent holds this very page.
                    write_run(self.file, self.path, bytes, first, run.take(), i, done)?;
                    continue;
                }
                present.set(Gfn(gfn));
            }
            if zero {
                write_run(self.file, self.path, bytes, first, run.take(), i, done)?;
                if self.hashes[gfn as usize] != hash {
                    punch_hole(self.file, self.path, gfn)?;
                }
            } else {
                run.get_or_insert(i);
            }
            self.hashes[gfn as usize] = hash;
        }
        write_run(self.file, self.path, bytes, first, run, count, done)?;
        done.pages += count;
        Ok(())
    }
}

/// Writes the chunk's data pages `from..to` (chunk-relative; none when
/// `from` is `None`) to their places.
fn write_run(
    file: &File,
    path: &Path,
    chunk: &[u8],
    first: Gfn,
    from: Option<u64>,
    to: u64,
    done: &mut Written,
) -> Result<(), SnapshotError> {
    let Some(from) = from else {
        return Ok(());
    };
    let slice = &chunk[from as usize * PAGE_SIZE..to as usize * PAGE_SIZE];
    file.write_all_at(slice, page_offset(first.0 + from))
        .map_err(SnapshotError::io("write", path))?;
    done.data += to - from;
    done.bytes += slice.len() as u64;
    Ok(())
}

/// Gives the place of frame `gfn` back to the file system: it reads as
/// zeros and takes no space.
fn punch_hole(file: &File, path: &Path, gfn: u64) -> Result<(), SnapshotError> {
    // SAFETY: fallocate on a file descriptor we own, with a range inside
    // the file; it touches no memory of ours.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            page_offset(gfn) as libc::off_t,
            PAGE_SIZE as libc::off_t,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // A file system without holes: write the zeros instead.
    file.write_all_at(&[0u8; PAGE_SIZE], page_offset(gfn))
        .map_err(SnapshotError::io("write", path))
}

/// Reads every RAM frame of data from `source` into `ram`, checking each
/// page against `hashes` before it is placed; a frame recorded as zeros is
/// neither read nor written (fresh guest memory is zero). Returns the
/// pages and bytes read.
pub fn read_all(
    source: &PageSource,
    ram: &GuestRam,
    hashes: &[u64],
) -> Result<(u64, u64), SnapshotError> {
    let mut buf = vec![0u8; (CHUNK_PAGES as usize) * PAGE_SIZE];
    let zero = zero_page_hash();
    let (mut pages, mut bytes) = (0, 0);
    for (run, n) in ram.ram_runs(Gfn(0), ram.pages()) {
        let mut at = 0;
        while at < n {
            let first = run.0 + at;
            // A frame recorded as zeros is not read: memory left as it is
            // holds zeros there, which the caller's digest of the whole
            // memory proves.
            if hashes[first as usize] == zero {
                at += 1;
                continue;
            }
            let count = (at..n)
                .take(CHUNK_PAGES as usize)
                .take_while(|&i| hashes[(run.0 + i) as usize] != zero)
                .count() as u64;
            let chunk = &mut buf[..count as usize * PAGE_SIZE];
            bytes += source.read_checked(first, count, chunk, hashes)?;
            ram.write_pages(Gfn(first), chunk)
                .map_err(SnapshotError::ram("place a page from the snapshot"))?;
            pages += count;
            at += count;
        }
    }
    Ok((pages, bytes))
}
