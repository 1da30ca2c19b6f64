//! The disk worker: appends numbered records ([`ferry_guest_checker::record`])
//! around the disk, each written and read back with O_DIRECT and O_SYNC,
//! so that every record the checker counts reached the device and came
//! back from it.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ferry_guest_checker::record::{self, BYTES};

/// What the disk worker publishes.
#[derive(Default)]
pub struct DiskCounters {
    /// Records written and acknowledged.
    pub writes: AtomicU64,
    /// Records read back that did not hold what was written.
    pub bad_reads: AtomicU64,
    /// Writes or reads the device failed.
    pub errors: AtomicU64,
}

/// A block, aligned as O_DIRECT wants it.
#[repr(C, align(4096))]
struct Aligned([u8; BYTES]);

/// Opens `path` for records; `None` (said on stderr) if it cannot.
pub fn open(path: &str) -> Option<(File, u64)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_SYNC)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) => {
            eprintln!("checker: no disk records: cannot open {path}: {e}");
            return None;
        }
    };
    let bytes = std::io::Seek::seek(&mut &file, std::io::SeekFrom::End(0)).unwrap_or(0);
    let blocks = bytes / BYTES as u64;
    if blocks == 0 {
        eprintln!("checker: no disk records: {path} holds no whole block");
        return None;
    }
    Some((file, blocks))
}

/// Writes records 1, 2, ... until `stop`, one every `pace`.
pub fn run(file: File, blocks: u64, pace: Duration, c: &DiskCounters, stop: &AtomicBool) {
    let mut out = Box::new(Aligned([0; BYTES]));
    let mut back = Box::new(Aligned([0; BYTES]));
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let block = record::block_of(seq, blocks);
        let at = block * BYTES as u64;
        out.0 = record::encode(seq, block);
        if file.write_all_at(&out.0, at).is_err() || file.read_exact_at(&mut back.0, at).is_err() {
            c.errors.fetch_add(1, Ordering::Relaxed);
        } else {
            c.writes.fetch_add(1, Ordering::Relaxed);
            if record::decode(&back.0, block) != Ok(Some(seq)) {
                c.bad_reads.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::sleep(pace);
    }
}
