//! A snapshot file read and checked, everything but the guest's pages:
//! the superblock, the manifest, the vCPU state, the sections, the page
//! hashes, the working set and a diff's present frames, each against its
//! CRC32, before anything is built from them (a restore, a diff's chain,
//! an inspection, a merge).

use super::format::{decode_present, page_offset, Manifest, Superblock};
use super::working_set;
use crate::error::SnapshotError;
use std::fs::File;
use std::path::Path;

/// What a file holds, checked: everything but the pages.
pub(super) struct Checked {
    pub manifest: Manifest,
    pub vcpus: Vec<u8>,
    pub sections: Vec<ferry_vm::Section>,
    pub hashes: Vec<u64>,
    /// Runs of frames, newest first (empty: none recorded).
    pub working_set: Vec<(u64, u64)>,
    /// A diff's frames that the file holds (`None`: all of them).
    pub present: Option<ferry_vm::DirtyPages>,
}

/// Reads and checks everything in the file but the pages.
pub(super) fn check(file: &File, path: &Path) -> Result<Checked, SnapshotError> {
    let size = file
        .metadata()
        .map_err(SnapshotError::io("stat", path))?
        .len();
    let superblock = Superblock::read(file, size, path)?;
    let json = superblock.manifest.read(file, size, path, "manifest")?;
    let manifest: Manifest =
        serde_json::from_slice(&json).map_err(|e| SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    let frames = manifest.header.pages();
    if manifest.digest_pages != frames {
        return Err(SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: format!(
                "its digest covers {} frames, its memory {frames}",
                manifest.digest_pages
            ),
        });
    }
    let pages_end = page_offset(frames);
    if pages_end > size {
        return Err(SnapshotError::Truncated {
            path: path.to_path_buf(),
            part: "pages",
            offset: page_offset(0),
            len: pages_end - page_offset(0),
            size,
        });
    }
    let vcpus = manifest.vcpus.read(file, size, path, "vCPU state")?;
    let sections = manifest.sections.read(file, size, path, "sections")?;
    let sections =
        crate::wire::sections::decode(&sections).map_err(|e| SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: format!("its sections cannot be decoded: {e}"),
        })?;
    let raw = manifest.page_hashes.read(file, size, path, "page hashes")?;
    if raw.len() as u64 != frames * 8 {
        return Err(SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: format!("it holds {} page hashes for {frames} frames", raw.len() / 8),
        });
    }
    let hashes: Vec<u64> = raw
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    if crate::digest::digest_of(&hashes).value != manifest.digest {
        return Err(SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: "its page hashes do not make its digest".into(),
        });
    }
    let working_set = match &manifest.working_set {
        Some(part) => {
            let raw = part.read(file, size, path, "working set")?;
            working_set::decode(&raw, frames).map_err(|detail| SnapshotError::Manifest {
                path: path.to_path_buf(),
                detail,
            })?
        }
        None => Vec::new(),
    };
    let present = match &manifest.present {
        Some(part) => {
            let raw = part.read(file, size, path, "present frames")?;
            Some(
                decode_present(&raw, frames).map_err(|detail| SnapshotError::Manifest {
                    path: path.to_path_buf(),
                    detail,
                })?,
            )
        }
        None => None,
    };
    if present.is_some() != manifest.parent.is_some() {
        return Err(SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: "it names a parent without its present frames, or the other way".into(),
        });
    }
    Ok(Checked {
        manifest,
        vcpus,
        sections,
        hashes,
        working_set,
        present,
    })
}
