//! A memory fault as a vCPU reports it, and the set of pages present: the
//! plain types the MMU, the errors and the fault paths share
//! ([`crate::fault_exit`] resolves the faults).

use ferry_vm::{Gfn, Gpa, PageBits};
use std::sync::Arc;

/// A guest access that needs a page first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryFault {
    /// Guest-physical address of the page.
    pub gpa: Gpa,
    /// Bytes that must be made present.
    pub size: u64,
    /// What the access was.
    pub flags: FaultFlags,
}

/// Flags of a [`MemoryFault`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultFlags {
    /// The access was a write.
    pub write: bool,
}

/// Which guest pages are present on this host (postcopy destination): a
/// view of a [`PageBits`] set, which the engine shares when it places pages
/// itself.
pub struct Residency {
    bits: Arc<PageBits>,
}

impl Residency {
    /// No page present among `frames`.
    pub fn new(frames: u64) -> Self {
        Residency {
            bits: Arc::new(PageBits::new(frames)),
        }
    }

    /// Pages present exactly when they are in `bits`.
    pub fn shared(bits: Arc<PageBits>) -> Self {
        Residency { bits }
    }

    /// Marks `gfn` present (after its contents are in RAM).
    pub fn mark_present(&self, gfn: Gfn) {
        self.bits.insert(gfn);
    }

    /// Whether `gfn` is present.
    #[inline]
    pub fn is_present(&self, gfn: Gfn) -> bool {
        self.bits.contains(gfn)
    }
}
