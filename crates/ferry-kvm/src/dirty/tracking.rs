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
    /// The method, as a VM's dirty log reports it.
    pub fn method(&self) -> ferry_vm::DirtyLogMethod {
        match self {
            DirtyTracking::Bitmap => ferry_vm::DirtyLogMethod::KvmBitmap,
            DirtyTracking::Clear { .. } => ferry_vm::DirtyLogMethod::KvmClear,
            DirtyTracking::Ring { .. } => ferry_vm::DirtyLogMethod::KvmRing,
        }
    }

    /// Short name used in reports and JSON.
    pub fn name(&self) -> &'static str {
        match self {
            DirtyTracking::Bitmap => "bitmap",
            DirtyTracking::Clear { .. } => "clear",
            DirtyTracking::Ring { .. } => "ring",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_reports_its_method_by_its_name() {
        for mode in [
            DirtyTracking::Bitmap,
            DirtyTracking::Clear {
                chunk_pages: 512,
                pace_us: 0,
            },
            DirtyTracking::Ring { entries: 1024 },
        ] {
            assert_eq!(mode.method().to_string(), mode.name());
        }
    }
}
