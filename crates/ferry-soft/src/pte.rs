//! Page-table entry encoding.
//!
//! An entry is one `AtomicU64`, so a fault can install or upgrade it with a
//! single compare-exchange while other vCPUs walk the same table:
//!
//! ```text
//!  63                                12 11    4  3      2     1     0
//!  ┌──────────────────────────────────┬───────┬──────┬─────┬─────┬───────┐
//!  │ payload: child table index, or    │   0   │FROZEN│HUGE │  W  │PRESENT│
//!  │ first frame (gfn) of a leaf       │       │      │     │     │       │
//!  └──────────────────────────────────┴───────┴──────┴─────┴─────┴───────┘
//! ```
//!
//! A present entry at level 1 is always a 4 KiB leaf; above level 1 it is a
//! leaf only with `HUGE` (2 MiB at level 2, 1 GiB at level 3), otherwise it
//! points to a child table. `FROZEN` is the break-before-make placeholder of a
//! huge leaf being split (KVM's `FROZEN_SPTE`): walkers that meet it retry.

/// Entry maps something.
pub const PRESENT: u64 = 1 << 0;
/// Leaf allows writes.
pub const WRITABLE: u64 = 1 << 1;
/// Leaf above level 1.
pub const HUGE: u64 = 1 << 2;
/// Placeholder during break-before-make.
pub const FROZEN: u64 = 1 << 3;
const PAYLOAD_SHIFT: u32 = 12;

/// Entries per table.
pub const ENTRIES: usize = 512;
/// Index bits per level.
pub const LEVEL_BITS: u32 = 9;
/// Level of the root table.
pub const ROOT_LEVEL: u8 = 4;

/// Frames covered by one entry at `level` (1 = 4 KiB ... 4 = 512 GiB).
#[inline]
pub const fn frames_per_entry(level: u8) -> u64 {
    1 << (LEVEL_BITS * (level as u32 - 1))
}

/// Index of `gfn` in a table at `level`.
#[inline]
pub const fn index(gfn: u64, level: u8) -> usize {
    ((gfn >> (LEVEL_BITS * (level as u32 - 1))) & (ENTRIES as u64 - 1)) as usize
}

/// An entry pointing to child table `child`.
#[inline]
pub const fn table(child: u32) -> u64 {
    PRESENT | ((child as u64) << PAYLOAD_SHIFT)
}

/// A leaf at `level` mapping frames from `gfn`.
#[inline]
pub const fn leaf(gfn: u64, level: u8, writable: bool) -> u64 {
    let huge = if level > 1 { HUGE } else { 0 };
    let w = if writable { WRITABLE } else { 0 };
    PRESENT | huge | w | (gfn << PAYLOAD_SHIFT)
}

/// Whether the entry maps something (frozen entries do not).
#[inline]
pub const fn is_present(e: u64) -> bool {
    e & PRESENT != 0
}

/// Whether a present entry at `level` is a leaf.
#[inline]
pub const fn is_leaf(e: u64, level: u8) -> bool {
    level == 1 || e & HUGE != 0
}

/// Whether the entry allows writes.
#[inline]
pub const fn is_writable(e: u64) -> bool {
    e & WRITABLE != 0
}

/// Child table index of a non-leaf entry.
#[inline]
pub const fn child(e: u64) -> u32 {
    (e >> PAYLOAD_SHIFT) as u32
}

/// First frame of a leaf.
#[inline]
pub const fn frame(e: u64) -> u64 {
    e >> PAYLOAD_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip() {
        let t = table(77);
        assert!(is_present(t) && !is_leaf(t, 2) && child(t) == 77);
        let l = leaf(0x1234, 2, true);
        assert!(is_present(l) && is_leaf(l, 2) && is_writable(l) && frame(l) == 0x1234);
        let s = leaf(9, 1, false);
        assert!(is_leaf(s, 1) && !is_writable(s) && s & HUGE == 0);
        assert!(!is_present(FROZEN));
    }

    #[test]
    fn indices_per_level() {
        let gfn = (3 << 27) | (5 << 18) | (7 << 9) | 11;
        assert_eq!(index(gfn, 4), 3);
        assert_eq!(index(gfn, 3), 5);
        assert_eq!(index(gfn, 2), 7);
        assert_eq!(index(gfn, 1), 11);
        assert_eq!(frames_per_entry(2), 512);
        assert_eq!(frames_per_entry(3), 512 * 512);
    }
}
