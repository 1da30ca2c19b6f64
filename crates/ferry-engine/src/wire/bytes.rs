//! Reading fixed-width fields of a payload. Every message and page batch
//! decoder reads them, so they sit below all of them.

/// Little-endian u64 at `at`; callers have checked the length.
pub(crate) fn u64_at(p: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Little-endian u32 at `at`; callers have checked the length.
pub(crate) fn u32_at(p: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&p[at..at + 4]);
    u32::from_le_bytes(b)
}
