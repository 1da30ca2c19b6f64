//! Which of KVM's dirty-tracking interfaces a VM uses.

use serde::{Deserialize, Serialize};

/// KVM's dirty-tracking interfaces (the kvm backend's modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "mode")]
pub enum DirtyTracking {
    /// `KVM_GET_DIRTY_LOG`: get and write-protect the whole slot in one ioctl.
    #[default]
    Bitmap,
    /// `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` + `KVM_CLEAR_DIRTY_LOG` in chunks of
    /// `chunk_pages`, sleeping `pace_us` between chunks (eager-split seed).
    Clear {
        /// Pages cleared per `KVM_CLEAR_DIRTY_LOG` call.
        chunk_pages: u32,
        /// Microseconds slept between two chunks.
        pace_us: u32,
    },
    /// The per-vCPU dirty ring of `entries` entries, harvested then reset.
    Ring {
        /// Entries of each vCPU's ring.
        entries: u32,
    },
}

impl DirtyTracking {
    /// Short name used in reports and JSON.
    pub fn name(&self) -> &'static str {
        match self {
            DirtyTracking::Bitmap => "bitmap",
            DirtyTracking::Clear { .. } => "clear",
            DirtyTracking::Ring { .. } => "ring",
        }
    }
}
