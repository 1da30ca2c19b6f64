//! Building a VM for a backend: the one place the CLI chooses between kvm and
//! soft. The engine only ever sees `Box<dyn Vm>`.

use crate::args::BackendArgs;
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::KvmVm;
/// Which end of a migration the VM is.
pub use ferry_kvm_memstress::Role;
use ferry_memstress::VmConfig;
use ferry_soft::SoftVm;
use ferry_vm::{Backing, GuestRam, Vm, VmError};

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

/// The backend and configuration a destination builds from a stream's VMM
/// id and VMM configuration, with its own `backing`.
pub fn from_stream(
    vmm_id: &str,
    vmm_config: &serde_json::Value,
    backing: Backing,
) -> Result<(BackendKind, VmConfig), VmError> {
    let kind = BackendKind::from_vmm_id(vmm_id)?;
    Ok((kind, VmConfig::from_stream(vmm_config, backing)?))
}

/// Creates a `kind` VM for `config`, once the guest is known to fit on
/// this host.
pub fn create(
    kind: BackendKind,
    config: &VmConfig,
    backend: &BackendArgs,
    role: Role,
) -> Result<Box<dyn Vm>, VmError> {
    config.admit()?;
    match kind {
        BackendKind::Kvm => {
            let tracking = kvm_tracking(backend)?;
            Ok(Box::new(KvmVm::new(config.clone(), tracking, role)?))
        }
        BackendKind::Soft => {
            let mech = backend.mechanisms();
            Ok(match role {
                Role::Source => Box::new(SoftVm::new_source(config.clone(), mech)?),
                Role::Destination => Box::new(SoftVm::new_destination(config.clone(), mech)?),
            })
        }
    }
}

/// A destination `kind` VM for `config` (`ferry receive`) whose host offers
/// a migrating guest a CPU without `cpu_without`: a guest given one of
/// those features is refused before any memory moves. Soft vCPUs have no
/// CPUID, so the soft backend takes no such list.
pub fn create_destination(
    kind: BackendKind,
    config: &VmConfig,
    backend: &BackendArgs,
    cpu_without: &[String],
) -> Result<Box<dyn Vm>, VmError> {
    match kind {
        BackendKind::Kvm if !cpu_without.is_empty() => {
            config.admit()?;
            let tracking = kvm_tracking(backend)?;
            let vm = KvmVm::new(config.clone(), tracking, Role::Destination)?
                .without_cpu_features(cpu_without)?;
            Ok(Box::new(vm))
        }
        BackendKind::Soft if !cpu_without.is_empty() => Err(VmError::Operation {
            backend: kind.to_string(),
            what: "--cpu-without applies to the kvm backend: soft vCPUs have no CPUID".into(),
            source: None,
        }),
        _ => create(kind, config, backend, Role::Destination),
    }
}

/// A destination `kind` VM for `config` on memory another process made (a
/// same-host upgrade maps the source's memfd files).
pub fn create_on_ram(
    kind: BackendKind,
    config: &VmConfig,
    backend: &BackendArgs,
    ram: GuestRam,
) -> Result<Box<dyn Vm>, VmError> {
    match kind {
        BackendKind::Kvm => {
            let tracking = kvm_tracking(backend)?;
            Ok(Box::new(KvmVm::on_ram(config.clone(), tracking, ram)?))
        }
        BackendKind::Soft => Ok(Box::new(SoftVm::on_ram(
            config.clone(),
            backend.mechanisms(),
            ram,
        )?)),
    }
}

/// The kvm dirty tracking `backend` asks for.
fn kvm_tracking(backend: &BackendArgs) -> Result<DirtyTracking, VmError> {
    backend.tracking().map_err(|what| VmError::Operation {
        backend: BackendKind::Kvm.to_string(),
        what,
        source: None,
    })
}
