//! The snapshot file's layout: a superblock, guest pages at fixed offsets,
//! then the parts written at the pause and the manifest that indexes them.
//! See the module's docs ([`super`]) for the picture.

use crate::error::SnapshotError;
use crate::wire::StreamHeader;
use ferry_vm::{DirtyPages, Gfn, PAGE_SIZE};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The superblock's first bytes.
pub const MAGIC: [u8; 8] = *b"FERRYSNP";
/// The newest format this release reads and writes: 2 is a diff snapshot
/// (a parent named by digest, and the frames this file holds); a full
/// snapshot is still written as 1, which releases before diffs read.
pub const FORMAT: u32 = 2;
/// The format of a full snapshot.
pub const FULL_FORMAT: u32 = 1;
/// The oldest format this release reads.
pub const OLDEST_FORMAT: u32 = 1;
/// Bytes of the superblock: one page, so that guest pages start aligned.
pub const SUPERBLOCK_LEN: u64 = PAGE_SIZE as u64;
/// Bytes of the superblock that carry anything (the rest is zero).
const SUPERBLOCK_USED: usize = 40;

/// Where guest frame `gfn` lives in the file.
pub fn page_offset(gfn: u64) -> u64 {
    SUPERBLOCK_LEN + gfn * PAGE_SIZE as u64
}

/// A part of the file written at the pause: where, how long, its CRC32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// Offset in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// CRC32 (crc32fast) of its bytes.
    pub crc32: u32,
}

impl Part {
    /// The part `bytes` will be once written at `offset`.
    pub fn of(offset: u64, bytes: &[u8]) -> Self {
        Part {
            offset,
            len: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        }
    }

    /// Reads the part from `file` (`size` bytes long) and checks it.
    pub fn read(
        &self,
        file: &std::fs::File,
        size: u64,
        path: &Path,
        part: &'static str,
    ) -> Result<Vec<u8>, SnapshotError> {
        let end = self.offset.checked_add(self.len);
        if end.is_none_or(|end| end > size) {
            return Err(SnapshotError::Truncated {
                path: path.to_path_buf(),
                part,
                offset: self.offset,
                len: self.len,
                size,
            });
        }
        let mut bytes = vec![0u8; self.len as usize];
        file.read_exact_at(&mut bytes, self.offset)
            .map_err(SnapshotError::io("read", path))?;
        if crc32fast::hash(&bytes) != self.crc32 {
            return Err(SnapshotError::Damaged {
                path: path.to_path_buf(),
                part,
                offset: self.offset,
                len: self.len,
            });
        }
        Ok(bytes)
    }
}

/// What the file holds, written last before the superblock: the VM it
/// describes (the header a migration would send), the digest of its
/// memory, and where the parts are.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// The ferry release that wrote the file.
    pub ferry: String,
    /// The VM, as a migration's stream header describes it: a restore
    /// builds the VM with the same factory a destination uses.
    pub header: StreamHeader,
    /// Frames the digest covers (holes included).
    pub digest_pages: u64,
    /// The memory digest (see [`crate::digest`]) at the pause.
    pub digest: u64,
    /// The vCPU state blob.
    pub vcpus: Part,
    /// The device-state sections, encoded as a migration sends them.
    pub sections: Part,
    /// One xxh3 per frame (little-endian u64s): what each page in the
    /// file must hash to.
    pub page_hashes: Part,
    /// The working set, newest first ([`super::working_set`]); absent
    /// where the guest was not running, and in files of releases before
    /// it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set: Option<Part>,
    /// A diff snapshot's parent: the frames this file does not hold are
    /// the parent's (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRef>,
    /// A diff snapshot's frames that this file holds, one bit per frame
    /// (a hole among them holds zeros); the rest are the parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<Part>,
    /// Frames of RAM that held data (the rest are holes in the file).
    pub data_pages: u64,
    /// Whether the guest was left stopped after the snapshot.
    pub stopped: bool,
    /// When the pause ended, in seconds since the epoch.
    pub created_unix_s: u64,
}

/// Writes the parts after the pages, one after another, then the manifest
/// and, last, the superblock: a file without one was never finished.
pub struct Tail<'a> {
    file: &'a std::fs::File,
    path: &'a Path,
    at: u64,
}

impl<'a> Tail<'a> {
    /// Parts from `at` on (the end of the pages).
    pub fn new(file: &'a std::fs::File, path: &'a Path, at: u64) -> Self {
        Tail { file, path, at }
    }

    /// Writes `bytes` as the next part.
    pub fn put(&mut self, bytes: &[u8]) -> Result<Part, SnapshotError> {
        let part = Part::of(self.at, bytes);
        self.file
            .write_all_at(bytes, self.at)
            .map_err(SnapshotError::io("write", self.path))?;
        self.at += bytes.len() as u64;
        Ok(part)
    }

    /// Writes `manifest`, syncs everything, then writes the superblock of
    /// `format` and syncs again.
    pub fn finish(mut self, manifest: &Manifest, format: u32) -> Result<(), SnapshotError> {
        let json = serde_json::to_vec(manifest).map_err(|e| SnapshotError::Manifest {
            path: self.path.to_path_buf(),
            detail: e.to_string(),
        })?;
        let superblock = Superblock {
            format,
            manifest: self.put(&json)?,
        };
        let sync = |f: &std::fs::File| f.sync_all().map_err(SnapshotError::io("sync", self.path));
        sync(self.file)?;
        self.file
            .write_all_at(&superblock.encode(), 0)
            .map_err(SnapshotError::io("write", self.path))?;
        sync(self.file)
    }
}

/// The snapshot a diff snapshot was taken against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    /// Where it was, as given (relative paths are the diff file's
    /// directory's).
    pub path: String,
    /// Its memory digest: a parent file that holds another is refused.
    pub digest: u64,
}

/// The fixed first page of the file: the magic, the format, and where the
/// manifest is. Written last, so a file without one was never finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The file's format.
    pub format: u32,
    /// Where the manifest is.
    pub manifest: Part,
}

impl Superblock {
    /// The superblock's bytes (one page).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_LEN as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.format.to_le_bytes());
        b[16..24].copy_from_slice(&self.manifest.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.manifest.len.to_le_bytes());
        b[32..36].copy_from_slice(&self.manifest.crc32.to_le_bytes());
        let crc = crc32fast::hash(&b[..36]);
        b[36..SUPERBLOCK_USED].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads and checks the superblock of `file` (`size` bytes long).
    pub fn read(file: &std::fs::File, size: u64, path: &Path) -> Result<Self, SnapshotError> {
        if size < SUPERBLOCK_USED as u64 {
            // Too short even for the magic: say which of the two it is.
            let mut head = vec![0u8; size as usize];
            file.read_exact_at(&mut head, 0)
                .map_err(SnapshotError::io("read", path))?;
            if !MAGIC.starts_with(&head[..head.len().min(8)]) || head.is_empty() {
                return Err(SnapshotError::NotASnapshot {
                    path: path.to_path_buf(),
                });
            }
            return Err(SnapshotError::Truncated {
                path: path.to_path_buf(),
                part: "superblock",
                offset: 0,
                len: SUPERBLOCK_LEN,
                size,
            });
        }
        let mut b = [0u8; SUPERBLOCK_USED];
        file.read_exact_at(&mut b, 0)
            .map_err(SnapshotError::io("read", path))?;
        if b[0..8] != MAGIC {
            return Err(SnapshotError::NotASnapshot {
                path: path.to_path_buf(),
            });
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        if crc32fast::hash(&b[..36]) != u32_at(36) {
            return Err(SnapshotError::Damaged {
                path: path.to_path_buf(),
                part: "superblock",
                offset: 0,
                len: SUPERBLOCK_USED as u64,
            });
        }
        let format = u32_at(8);
        if !(OLDEST_FORMAT..=FORMAT).contains(&format) {
            return Err(SnapshotError::Version {
                path: path.to_path_buf(),
                found: format,
                oldest: OLDEST_FORMAT,
                newest: FORMAT,
            });
        }
        Ok(Superblock {
            format,
            manifest: Part {
                offset: u64_at(16),
                len: u64_at(24),
                crc32: u32_at(32),
            },
        })
    }
}

/// A diff's present bits, as the file holds them: bit `g % 8` of byte
/// `g / 8` for frame `g`.
pub fn encode_present(bits: &DirtyPages) -> Vec<u8> {
    let mut bytes = vec![0u8; bits.pages().div_ceil(8) as usize];
    for g in bits.iter() {
        bytes[(g.0 / 8) as usize] |= 1 << (g.0 % 8);
    }
    bytes
}

/// Reads [`encode_present`]'s form back for a guest of `frames` frames.
pub fn decode_present(bytes: &[u8], frames: u64) -> Result<DirtyPages, String> {
    if bytes.len() as u64 != frames.div_ceil(8) {
        return Err(format!(
            "its present bits are {} bytes for {frames} frames",
            bytes.len()
        ));
    }
    let mut bits = DirtyPages::new(frames);
    (0..frames)
        .filter(|g| bytes[(g / 8) as usize] & (1 << (g % 8)) != 0)
        .for_each(|g| bits.set(Gfn(g)));
    Ok(bits)
}

/// Creates (or empties) the file at `path` with room for `frames` pages
/// after the superblock: every page a hole until written.
pub fn create_sized(path: &Path, frames: u64) -> Result<std::fs::File, SnapshotError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(SnapshotError::io("create", path))?;
    file.set_len(page_offset(frames))
        .map_err(SnapshotError::io("size", path))?;
    Ok(file)
}

/// Where a file is written until it is complete (it is renamed over
/// `path` only then).
pub fn partial_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> (tempfile_path::TempPath, std::fs::File) {
        tempfile_path::with(bytes)
    }

    /// A throwaway file under the system's temporary directory.
    mod tempfile_path {
        use std::sync::atomic::{AtomicU32, Ordering};

        pub struct TempPath(pub std::path::PathBuf);
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        pub fn with(bytes: &[u8]) -> (TempPath, std::fs::File) {
            static N: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "ferry-format-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&path, bytes).unwrap();
            let file = std::fs::File::open(&path).unwrap();
            (TempPath(path), file)
        }
    }

    fn superblock() -> Superblock {
        Superblock {
            format: FORMAT,
            manifest: Part {
                offset: 1 << 20,
                len: 300,
                crc32: 0xdead_beef,
            },
        }
    }

    #[test]
    fn a_superblock_reads_back_as_written() {
        let bytes = superblock().encode();
        let (p, f) = file_with(&bytes);
        assert_eq!(
            Superblock::read(&f, bytes.len() as u64, &p.0).unwrap(),
            superblock()
        );
    }

    #[test]
    fn every_flipped_bit_of_the_superblock_is_refused() {
        let good = superblock().encode();
        for bit in 0..SUPERBLOCK_USED * 8 {
            let mut bad = good.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            let (p, f) = file_with(&bad);
            let e = Superblock::read(&f, bad.len() as u64, &p.0).unwrap_err();
            assert!(
                matches!(
                    e,
                    SnapshotError::Damaged {
                        part: "superblock",
                        ..
                    } | SnapshotError::NotASnapshot { .. }
                ),
                "bit {bit}: {e}"
            );
        }
    }

    #[test]
    fn another_format_is_refused_naming_both() {
        let mut sb = superblock();
        sb.format = FORMAT + 1;
        let bytes = sb.encode();
        let (p, f) = file_with(&bytes);
        let e = Superblock::read(&f, bytes.len() as u64, &p.0).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!("format {}", FORMAT + 1))
                && text.contains(&format!("{OLDEST_FORMAT} to {FORMAT}")),
            "{text}"
        );
    }

    #[test]
    fn a_short_file_is_truncated_or_not_a_snapshot() {
        let good = superblock().encode();
        let (p, f) = file_with(&good[..20]);
        assert!(matches!(
            Superblock::read(&f, 20, &p.0).unwrap_err(),
            SnapshotError::Truncated {
                part: "superblock",
                size: 20,
                ..
            }
        ));
        let (p, f) = file_with(b"#!/bin/sh\n");
        assert!(matches!(
            Superblock::read(&f, 10, &p.0).unwrap_err(),
            SnapshotError::NotASnapshot { .. }
        ));
    }

    #[test]
    fn a_part_past_the_end_is_truncated_and_a_changed_one_damaged() {
        let data = b"the vCPU state".to_vec();
        let part = Part::of(4, &data);
        let mut file = b"....".to_vec();
        file.extend_from_slice(&data);
        let (p, f) = file_with(&file);
        assert_eq!(
            part.read(&f, file.len() as u64, &p.0, "vCPU state")
                .unwrap(),
            data
        );
        let e = part
            .read(&f, file.len() as u64 - 1, &p.0, "vCPU state")
            .unwrap_err();
        assert!(matches!(
            e,
            SnapshotError::Truncated {
                part: "vCPU state",
                offset: 4,
                ..
            }
        ));
        file[6] ^= 0x20;
        let (p, f) = file_with(&file);
        let e = part
            .read(&f, file.len() as u64, &p.0, "vCPU state")
            .unwrap_err();
        assert!(matches!(
            e,
            SnapshotError::Damaged {
                part: "vCPU state",
                offset: 4,
                ..
            }
        ));
    }
}
