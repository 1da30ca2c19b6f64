//! Diff snapshots: a file that holds only the frames that changed since
//! its parent, the chain a restore follows to find every other frame, and
//! the merge that flattens a chain into one full file.
//!
//! **Why by content, not by dirty logs kept running since the parent.** A
//! parent is a file; the VM that wrote it may have been restored, migrated
//! or restarted since, and no log ran in between. The parent's page hashes
//! say what it holds: a diff hashes every frame as a full snapshot does
//! (it reads all of memory anyway), and writes only the frames whose hash
//! differs. Each file's page hashes are the whole memory's at its own
//! pause, so a page read from any file of the chain is checked against
//! the newest file's hash for it, and the digest is the whole memory's.
//!
//! ```text
//!  child.snap   present bits: 0 1 0 0 1 ...   parent: {path, digest}
//!  parent.snap  a full snapshot (or a diff itself, up to MAX_CHAIN files)
//!  frame g      from the first file of [child, parent, ...] that holds it
//! ```

use super::checked::{check, Checked};
use super::format::{create_sized, page_offset, partial_path, Manifest, Tail, FULL_FORMAT};
use crate::digest::page_hash;
use crate::error::SnapshotError;
use ferry_vm::is_zero_page;
use ferry_vm::{DirtyPages, Gfn, PAGE_SIZE};
use serde::Serialize;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The most files a chain may have, the newest included.
pub const MAX_CHAIN: usize = 32;

/// A parent as a diff's save takes it: its page hashes, and how the diff
/// names it.
pub struct Parent {
    /// What each of its frames hashes to.
    pub hashes: Vec<u64>,
    /// The diff's reference to it.
    pub reference: super::format::ParentRef,
}

impl Parent {
    /// Opens and checks the parent at `path` for a VM described by
    /// `header`: a parent of another VM (its VMM, vCPUs or memory layout)
    /// is refused, naming what differs.
    pub fn open(path: &Path, header: &crate::wire::StreamHeader) -> Result<Self, SnapshotError> {
        let file = File::open(path).map_err(SnapshotError::io("open the parent", path))?;
        let c = check(&file, path)?;
        let theirs = &c.manifest.header;
        let differs = [
            (theirs.vmm != header.vmm, "VMM"),
            (theirs.vcpus != header.vcpus, "vCPUs"),
            (theirs.regions != header.regions, "memory layout"),
        ];
        if let Some((_, what)) = differs.iter().find(|(d, _)| *d) {
            return Err(SnapshotError::Parent {
                path: path.to_path_buf(),
                detail: format!("it holds another VM (its {what} differs)"),
            });
        }
        Ok(Parent {
            hashes: c.hashes,
            reference: super::format::ParentRef {
                path: path.display().to_string(),
                digest: c.manifest.digest,
            },
        })
    }
}

/// Where each frame's page lies: in the file restored, or (a diff) in the
/// nearest file of its chain that holds it.
pub struct PageSource {
    /// The file restored, then its parents, newest first.
    files: Vec<(File, PathBuf)>,
    /// Per frame, the index of the file that holds it; empty when the
    /// first file holds them all.
    owner: Vec<u8>,
}

impl PageSource {
    /// The chain of `file` at `path`, whose checked contents are `c`: the
    /// file itself, and each parent its manifest names (its path relative
    /// to the child's directory), each checked and held to the digest its
    /// child recorded.
    pub fn open(file: File, path: &Path, c: &Checked) -> Result<Self, SnapshotError> {
        let frames = c.hashes.len() as u64;
        let mut files = vec![(file, path.to_path_buf())];
        let Some(mut present) = c.present.clone() else {
            return Ok(PageSource {
                files,
                owner: Vec::new(),
            });
        };
        let mut owner = vec![u8::MAX; frames as usize];
        let mut next = c.manifest.parent.clone();
        let mut child = path.to_path_buf();
        loop {
            let index = (files.len() - 1) as u8;
            for g in present.iter() {
                if owner[g.0 as usize] == u8::MAX {
                    owner[g.0 as usize] = index;
                }
            }
            let Some(reference) = next else { break };
            if files.len() == MAX_CHAIN {
                return Err(SnapshotError::Parent {
                    path: child,
                    detail: format!("its chain is longer than {MAX_CHAIN} files: merge it"),
                });
            }
            let at = resolve(&child, &reference.path);
            let parent = File::open(&at).map_err(SnapshotError::io("open the parent", &at))?;
            let pc = check(&parent, &at)?;
            if pc.manifest.digest != reference.digest {
                return Err(SnapshotError::Parent {
                    path: at,
                    detail: format!(
                        "it holds memory of digest {:#018x}, and {} was taken against \
                         {:#018x}: not its parent",
                        pc.manifest.digest,
                        child.display(),
                        reference.digest
                    ),
                });
            }
            if pc.hashes.len() as u64 != frames {
                return Err(SnapshotError::Parent {
                    path: at,
                    detail: format!("it holds {} frames, its child {frames}", pc.hashes.len()),
                });
            }
            present = match &pc.present {
                Some(p) => p.clone(),
                // A full snapshot: it holds every frame left.
                None => {
                    let mut all = DirtyPages::new(frames);
                    (0..frames).for_each(|g| all.set(Gfn(g)));
                    all
                }
            };
            next = pc.manifest.parent.clone();
            files.push((parent, at.clone()));
            child = at;
        }
        if let Some(g) = owner.iter().position(|&o| o == u8::MAX) {
            return Err(SnapshotError::Parent {
                path: child,
                detail: format!("no file of the chain holds frame {g:#x}"),
            });
        }
        Ok(PageSource { files, owner })
    }

    /// The files of the chain, newest first.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Reads frames `first..first + n` into `buf` (`n` pages), each from
    /// the file that holds it, and checks each against `hashes`; a damaged
    /// page is named with the file and offset it was read from. Returns
    /// the bytes read.
    pub fn read_checked(
        &self,
        first: u64,
        n: u64,
        buf: &mut [u8],
        hashes: &[u64],
    ) -> Result<u64, SnapshotError> {
        let owner = |g: u64| self.owner.get(g as usize).copied().unwrap_or(0);
        let mut at = 0;
        while at < n {
            let which = owner(first + at);
            let run = (at..n).take_while(|&i| owner(first + i) == which).count() as u64;
            let (file, path) = &self.files[which as usize];
            let bytes = &mut buf[at as usize * PAGE_SIZE..(at + run) as usize * PAGE_SIZE];
            file.read_exact_at(bytes, page_offset(first + at))
                .map_err(SnapshotError::io("read", path))?;
            for (i, page) in bytes.chunks_exact(PAGE_SIZE).enumerate() {
                let gfn = first + at + i as u64;
                if page_hash(page) != hashes[gfn as usize] {
                    return Err(SnapshotError::DamagedPage {
                        path: path.clone(),
                        gfn,
                        offset: page_offset(gfn),
                    });
                }
            }
            at += run;
        }
        Ok(n * PAGE_SIZE as u64)
    }
}

/// A parent's path as its child names it: relative ones are the child's
/// directory's.
fn resolve(child: &Path, parent: &str) -> PathBuf {
    let p = Path::new(parent);
    match (p.is_absolute(), child.parent()) {
        (false, Some(dir)) => dir.join(p),
        _ => p.to_path_buf(),
    }
}

/// What a merge did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MergeSummary {
    /// Files of the chain flattened, the newest included.
    pub chain: usize,
    /// RAM frames written as data.
    pub data_pages: u64,
    /// Bytes the merged file takes on disk.
    pub bytes: u64,
    /// Wall time.
    pub total_ms: f64,
}

/// Flattens the chain that ends in `child` into one full snapshot at `out`
/// (written beside it and renamed into place once complete): every frame
/// read from the file that holds it and checked, the child's vCPU state,
/// sections and working set kept. Restoring `out` is restoring `child`.
pub fn merge(child: &Path, out: &Path) -> Result<MergeSummary, SnapshotError> {
    let start = Instant::now();
    let file = File::open(child).map_err(SnapshotError::io("open", child))?;
    let c = check(&file, child)?;
    let source = PageSource::open(file, child, &c)?;
    let partial = partial_path(out);
    let written = write_merged(&c, &source, &partial);
    let written = written.and_then(|w| {
        std::fs::rename(&partial, out).map_err(SnapshotError::io("rename", &partial))?;
        Ok(w)
    });
    match written {
        Ok((data_pages, bytes)) => Ok(MergeSummary {
            chain: source.len(),
            data_pages,
            bytes,
            total_ms: crate::summary::ms(start.elapsed()),
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

fn write_merged(
    c: &Checked,
    source: &PageSource,
    path: &Path,
) -> Result<(u64, u64), SnapshotError> {
    let frames = c.hashes.len() as u64;
    let file = create_sized(path, frames)?;
    let pages_end = page_offset(frames);
    const CHUNK: u64 = 256;
    let mut buf = vec![0u8; CHUNK as usize * PAGE_SIZE];
    let mut data_pages = 0;
    let mut first = 0;
    while first < frames {
        let n = (frames - first).min(CHUNK);
        let bytes = &mut buf[..n as usize * PAGE_SIZE];
        source.read_checked(first, n, bytes, &c.hashes)?;
        for (i, page) in bytes.chunks_exact(PAGE_SIZE).enumerate() {
            if !is_zero_page(page) {
                file.write_all_at(page, page_offset(first + i as u64))
                    .map_err(SnapshotError::io("write", path))?;
                data_pages += 1;
            }
        }
        first += n;
    }
    let mut tail = Tail::new(&file, path, pages_end);
    let hashes: Vec<u8> = c.hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
    let manifest = Manifest {
        vcpus: tail.put(&c.vcpus)?,
        sections: tail.put(&crate::wire::sections::encode(&c.sections))?,
        page_hashes: tail.put(&hashes)?,
        working_set: match c.working_set.is_empty() {
            true => None,
            false => Some(tail.put(&super::working_set::encode(&c.working_set))?),
        },
        parent: None,
        present: None,
        data_pages,
        ..c.manifest.clone()
    };
    tail.finish(&manifest, FULL_FORMAT)?;
    let meta = file.metadata().map_err(SnapshotError::io("stat", path))?;
    Ok((data_pages, meta.blocks() * 512))
}
