//! Address and frame newtypes. A bare `u64` that is a frame number in one place
//! and an address in another is a bug waiting to happen, so ferry never passes one.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Size of the base page that dirty tracking and the stream work in.
pub const PAGE_SIZE: usize = 4096;
/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 12;

/// Whether every byte of `page` is zero. It ORs 64-byte blocks as u64
/// words, which the compiler turns into wide vector loads.
pub fn is_zero_page(page: &[u8]) -> bool {
    let mut blocks = page.chunks_exact(64);
    let blocks_zero = blocks.by_ref().all(|block| {
        block.chunks_exact(8).fold(0u64, |acc, w| {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            acc | u64::from_ne_bytes(b)
        }) == 0
    });
    blocks_zero && blocks.remainder().iter().all(|&b| b == 0)
}

/// A guest frame number: guest-physical address >> 12.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Gfn(pub u64);

/// A guest-physical address in bytes.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Gpa(pub u64);

impl Gfn {
    /// The address of the first byte of this frame.
    pub const fn gpa(self) -> Gpa {
        Gpa(self.0 << PAGE_SHIFT)
    }
}

impl Gpa {
    /// The frame containing this address.
    pub const fn gfn(self) -> Gfn {
        Gfn(self.0 >> PAGE_SHIFT)
    }

    /// This address plus `bytes`.
    pub const fn add(self, bytes: u64) -> Gpa {
        Gpa(self.0 + bytes)
    }
}

impl fmt::Display for Gfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gfn {:#x}", self.0)
    }
}

impl fmt::Display for Gpa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpa {:#x}", self.0)
    }
}

/// Formats a byte count the way people read it (`1.5 GiB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection() {
        let mut page = vec![0u8; PAGE_SIZE];
        assert!(is_zero_page(&page));
        for at in [0, 7, 63, 64, 2048, PAGE_SIZE - 1] {
            page[at] = 1;
            assert!(!is_zero_page(&page), "byte {at}");
            page[at] = 0;
        }
        assert!(is_zero_page(&[0u8; 70]));
        assert!(!is_zero_page(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 9]));
    }

    #[test]
    fn gfn_gpa_round_trip() {
        assert_eq!(Gfn(3).gpa(), Gpa(3 * 4096));
        assert_eq!(Gpa(3 * 4096 + 17).gfn(), Gfn(3));
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
    }
}
