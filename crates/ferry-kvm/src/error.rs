//! Errors talking to KVM.

use crate::cpu_state::StateError;
use ferry_vm::VmError;
use vmm_sys_util::errno;

/// What went wrong talking to KVM.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    /// /dev/kvm could not be opened.
    #[error("cannot open /dev/kvm (is KVM available and are you allowed to use it?)")]
    Open(#[source] errno::Error),
    /// /dev/kvm opened but is not KVM, or not the API ferry speaks.
    #[error("{0} (the soft backend needs no /dev/kvm: --backend soft)")]
    Unusable(String),
    /// A KVM ioctl failed.
    #[error("{0} failed")]
    Ioctl(&'static str, #[source] errno::Error),
    /// A capability ferry needs is missing.
    #[error("this host's KVM lacks {0}")]
    MissingCap(&'static str),
    /// A configuration KVM cannot run.
    #[error("{0}")]
    Config(String),
    /// Guest RAM could not be created.
    #[error(transparent)]
    Ram(#[from] ferry_vm::RamError),
    /// Probing which MSRs this host can save failed.
    #[error("probing the MSRs a vCPU state carries")]
    MsrProbe(#[source] crate::cpu_state::MsrError),
    /// Saving or loading vCPU state failed in KVM.
    #[error(transparent)]
    State(#[from] StateError),
}

impl From<KvmError> for VmError {
    /// Flattens the error chain into one message, so the engine's report shows
    /// the cause (the errno) without repeating any level.
    fn from(e: KvmError) -> Self {
        VmError::Operation {
            backend: "kvm".into(),
            what: ferry_vm::error_chain(&e),
            source: None,
        }
    }
}

impl From<StateError> for VmError {
    /// State that does not fit is `BadVcpuState`; a KVM failure is an
    /// operation error of the kvm backend.
    fn from(e: StateError) -> Self {
        if e.is_unfit() {
            VmError::BadVcpuState(ferry_vm::error_chain(&e))
        } else {
            KvmError::State(e).into()
        }
    }
}

/// Shorthand for mapping an ioctl error.
pub fn ioctl(name: &'static str) -> impl FnOnce(errno::Error) -> KvmError {
    move |e| KvmError::Ioctl(name, e)
}
