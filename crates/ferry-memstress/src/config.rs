//! The configuration of ferry's own VMs: which backend runs memstress, with
//! which workload, on which backing.
//!
//! A migration stream names the VMM (`ferry-kvm` or `ferry-soft`, see
//! [`BackendKind::vmm_id`]) and carries the workload as the VMM's own
//! configuration, which the engine hands to the destination's VM factory
//! without reading it ([`VmConfig::from_stream`]).

use crate::{MemoryLayout, Workload};
use ferry_backend::{admission, BackendError, Backing};
use serde::{Deserialize, Serialize};

/// Which backend runs the VM. Both ends of a migration must use the same one,
/// because their vCPU state differs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Real vCPUs on `/dev/kvm`.
    #[default]
    Kvm,
    /// The software second-level MMU.
    Soft,
}

impl BackendKind {
    /// The VMM id a migration stream carries for this backend's VMs.
    pub fn vmm_id(self) -> &'static str {
        match self {
            BackendKind::Kvm => "ferry-kvm",
            BackendKind::Soft => "ferry-soft",
        }
    }

    /// The backend whose VMs carry `vmm_id`, if it is one of ferry's.
    pub fn from_vmm_id(vmm_id: &str) -> Option<Self> {
        [BackendKind::Kvm, BackendKind::Soft]
            .into_iter()
            .find(|b| b.vmm_id() == vmm_id)
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Kvm => "kvm",
            BackendKind::Soft => "soft",
        })
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kvm" => Ok(BackendKind::Kvm),
            "soft" => Ok(BackendKind::Soft),
            other => Err(format!("unknown backend '{other}': expected kvm or soft")),
        }
    }
}

/// What ferry's own VMs are built from; both ends of a migration agree on
/// the backend and the workload (the stream carries them), and each picks
/// its own backing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmConfig {
    /// The backend running the VM.
    pub backend: BackendKind,
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

    /// The configuration a destination builds from a stream's VMM id and
    /// VMM configuration, with its own `backing`.
    pub fn from_stream(
        vmm_id: &str,
        vmm_config: &serde_json::Value,
        backing: Backing,
    ) -> Result<Self, BackendError> {
        let backend = BackendKind::from_vmm_id(vmm_id).ok_or_else(|| {
            BackendError::Guest(format!(
                "the stream comes from a {vmm_id} VM; this ferry builds {} and {} VMs",
                BackendKind::Kvm.vmm_id(),
                BackendKind::Soft.vmm_id()
            ))
        })?;
        let workload: Workload = serde_json::from_value(vmm_config.clone())
            .map_err(|e| BackendError::Guest(format!("not a memstress workload: {e}")))?;
        workload
            .validate()
            .map_err(|e| BackendError::Guest(e.to_string()))?;
        Ok(VmConfig {
            backend,
            workload,
            backing,
        })
    }

    /// Refuses a guest that does not fit on this host, with both sizes.
    pub fn admit(&self) -> Result<(), admission::AdmissionError> {
        admission::admit(self.layout().total_bytes(), self.backing)
    }
}
