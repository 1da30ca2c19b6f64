//! The configuration of a VM that runs memstress: the workload, and the
//! backing of its RAM.
//!
//! A migration stream names the VMM (each VM crate's `VMM_ID`) and carries
//! the workload as the VMM's own configuration, which the engine hands to
//! the destination's VM factory without reading it
//! ([`VmConfig::from_stream`]). Which VM runs it (kvm or soft) is the
//! caller's choice, not part of the configuration.

use crate::{MemoryLayout, Workload};
use ferry_vm::{admission, Backing, VmError};
use serde::{Deserialize, Serialize};

/// What a memstress VM is built from; both ends of a migration agree on
/// the workload (the stream carries it), and each picks its own backing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmConfig {
    /// The guest workload, which fixes the memory layout.
    pub workload: Workload,
    /// Host backing of guest RAM (each end may choose its own).
    pub backing: Backing,
}

impl VmConfig {
    /// The guest-physical layout.
    pub fn layout(&self) -> MemoryLayout {
        MemoryLayout::for_workload(&self.workload)
    }

    /// The VMM configuration a migration stream carries for this VM: the
    /// workload, which the engine carries without reading it.
    pub fn vmm_config(&self) -> serde_json::Value {
        serde_json::to_value(&self.workload).unwrap_or_default()
    }

    /// The configuration a destination builds from a stream's VMM
    /// configuration, with its own `backing`.
    pub fn from_stream(vmm_config: &serde_json::Value, backing: Backing) -> Result<Self, VmError> {
        let workload: Workload = serde_json::from_value(vmm_config.clone())
            .map_err(|e| VmError::Guest(format!("not a memstress workload: {e}")))?;
        workload
            .validate()
            .map_err(|e| VmError::Guest(e.to_string()))?;
        Ok(VmConfig { workload, backing })
    }

    /// Refuses a guest that does not fit on this host, with both sizes.
    pub fn admit(&self) -> Result<(), admission::AdmissionError> {
        admission::admit(self.layout().total_bytes(), self.backing)
    }
}
