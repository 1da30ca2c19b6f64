//! Building a VM for a backend: the one place the CLI chooses between kvm and
//! soft. The engine only ever sees `Box<dyn Vm>`.

use crate::args::BackendArgs;
use ferry_backend::{BackendError, Vm};
use ferry_kvm::KvmVm;
/// Which end of a migration the VM is.
pub use ferry_kvm::Role;
use ferry_memstress::{BackendKind, VmConfig};
use ferry_soft::SoftVm;

/// Creates a VM for `config` on the backend it names, once the guest is
/// known to fit on this host.
pub fn create(
    config: &VmConfig,
    backend: &BackendArgs,
    role: Role,
) -> Result<Box<dyn Vm>, BackendError> {
    config.admit()?;
    match config.backend {
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

/// A destination VM for `config` on memory another process made (a
/// same-host upgrade maps the source's memfd files).
pub fn create_on_ram(
    config: &VmConfig,
    backend: &BackendArgs,
    ram: ferry_backend::GuestRam,
) -> Result<Box<dyn Vm>, BackendError> {
    match config.backend {
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
fn kvm_tracking(backend: &BackendArgs) -> Result<ferry_backend::DirtyTracking, BackendError> {
    backend.tracking().map_err(|what| BackendError::Operation {
        backend: BackendKind::Kvm.to_string(),
        what,
        source: None,
    })
}
