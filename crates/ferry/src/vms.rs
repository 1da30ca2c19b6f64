//! Building a VM for a backend: the one place the CLI chooses between kvm and
//! soft. The engine only ever sees `Box<dyn Vm>`.

use crate::args::BackendArgs;
use crate::backend::BackendKind;
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::KvmVm;
/// Which end of a migration the VM is.
pub use ferry_kvm_memstress::Role;
use ferry_memstress::VmConfig;
use ferry_soft::SoftVm;
use ferry_vm::{Backing, GuestRam, Vm, VmError};

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
