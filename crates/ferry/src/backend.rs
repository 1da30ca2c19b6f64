//! Which of ferry's two memstress VMs a command means: the kind the
//! arguments name (`--backend`), the stream carries (its VMM id) and
//! [`crate::vms`] builds. Below both, so that the arguments can resolve
//! `auto` without reaching the code that builds VMs.

use ferry_vm::VmError;

/// Which of ferry's two memstress VMs runs the guest. Both ends of a
/// migration must use the same one, because their vCPU state differs; the
/// stream names it by its VMM id.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Real vCPUs on `/dev/kvm` (`ferry-kvm-memstress`).
    #[default]
    Kvm,
    /// The software second-level MMU (`ferry-soft`).
    Soft,
}

impl BackendKind {
    /// The VMM id a migration stream carries for this backend's VMs.
    pub fn vmm_id(self) -> &'static str {
        match self {
            BackendKind::Kvm => ferry_kvm_memstress::VMM_ID,
            BackendKind::Soft => ferry_soft::VMM_ID,
        }
    }

    /// The backend whose VMs carry `vmm_id`, if it is one of ferry's.
    pub fn from_vmm_id(vmm_id: &str) -> Result<Self, VmError> {
        [BackendKind::Kvm, BackendKind::Soft]
            .into_iter()
            .find(|b| b.vmm_id() == vmm_id)
            .ok_or_else(|| {
                VmError::Guest(format!(
                    "the stream comes from a {vmm_id} VM; this ferry builds {} and {} VMs",
                    BackendKind::Kvm.vmm_id(),
                    BackendKind::Soft.vmm_id()
                ))
            })
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
    /// `kvm`, `soft`, or `auto` ([`BackendKind::detect`]).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kvm" => Ok(BackendKind::Kvm),
            "soft" => Ok(BackendKind::Soft),
            "auto" => Ok(BackendKind::detect()),
            other => Err(format!(
                "unknown backend '{other}': expected auto, kvm or soft"
            )),
        }
    }
}

impl BackendKind {
    /// The backend for `--backend auto`: kvm where this machine's KVM can
    /// run a VM, soft otherwise. The first call that falls back says so, in
    /// one line on stderr with the reason; later calls are silent.
    pub fn detect() -> BackendKind {
        static DETECTED: std::sync::OnceLock<BackendKind> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| match ferry_kvm::kvm_usable() {
            Ok(()) => BackendKind::Kvm,
            Err(why) => {
                eprintln!("ferry: {why}; running on the soft backend (software MMU)");
                BackendKind::Soft
            }
        })
    }
}
