//! Sparse memory: guests too big to back with RAM here (64 GiB and more).
//!
//! The page tables are real (every leaf, every table, in the arena) and so is
//! the dirty bitmap; only page contents are implied, so a vCPU access through
//! [`crate::guest_mem::HostView::sparse`] exercises the TLB and the MMU but
//! moves no data. The write-protect and zap experiments scale to 64 GiB this
//! way on a machine with 24 GiB.

use crate::config::Mechanisms;
use crate::error::SoftError;
use crate::mmu::Mmu;
use ferry_vm::Gfn;

/// A sparse guest of `bytes`, every page mapped with leaves of `level` and
/// (if `written`) writable and marked dirty, as after a round in which the
/// guest wrote all of its memory under dirty logging.
pub fn fully_mapped(
    bytes: u64,
    level: u8,
    written: bool,
    mech: Mechanisms,
    vcpus: usize,
) -> Result<Mmu, SoftError> {
    let frames = bytes / ferry_vm::PAGE_SIZE as u64;
    let mmu = Mmu::new(frames, vcpus, mech)?;
    if written {
        mmu.start_dirty_log()?;
    }
    mmu.populate(0, frames, level, written)?;
    if written {
        let bitmap = mmu.dirty_bitmap();
        for g in 0..frames {
            bitmap.mark(Gfn(g));
        }
    }
    Ok(mmu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LeafSize;

    #[test]
    fn sparse_guest_has_real_tables_and_dirty_bits() {
        let m = fully_mapped(
            64 << 20,
            1,
            true,
            Mechanisms {
                leaf: LeafSize::K4,
                ..Mechanisms::default()
            },
            0,
        )
        .unwrap();
        let c = m.census();
        assert_eq!(c.leaves[0], 16384);
        assert_eq!(c.writable, 16384);
        assert_eq!(c.tables, 32 + 1 + 1 + 1);
        assert!(m.dirty_bitmap().is_marked(Gfn(16383)));
    }
}
