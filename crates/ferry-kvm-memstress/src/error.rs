//! Errors of ferry's memstress VM on KVM.

use ferry_kvm::KvmError;
use ferry_vm::VmError;

/// What went wrong building or running the VM.
#[derive(Debug, thiserror::Error)]
pub enum KvmVmError {
    /// KVM refused something.
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// A configuration this VM cannot run.
    #[error("{0}")]
    Config(String),
    /// Building the guest image failed.
    #[error(transparent)]
    Boot(#[from] crate::guest::boot::BootError),
    /// Guest RAM could not be created.
    #[error(transparent)]
    Ram(#[from] ferry_vm::RamError),
    /// A vCPU thread could not be started.
    #[error("cannot start vCPU thread {0}")]
    Thread(u32, #[source] std::io::Error),
    /// A vCPU thread could not be pinned to a host CPU.
    #[error("cannot pin vCPU thread {0} to its host CPU")]
    Pin(u32, #[source] std::io::Error),
    /// The throttle thread could not be started.
    #[error("cannot start the vCPU throttle thread")]
    ThrottleThread(#[source] std::io::Error),
}

impl From<KvmVmError> for VmError {
    /// Flattens the error chain into one message, so the engine's report shows
    /// the cause (the errno) without repeating any level.
    fn from(e: KvmVmError) -> Self {
        VmError::Operation {
            backend: "kvm".into(),
            what: ferry_vm::error_chain(&e),
            source: None,
        }
    }
}
