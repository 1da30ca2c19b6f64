//! What fails in a VM, as its VMM tells the engine, and turning an error
//! with its causes into one line for people.

use crate::ram::RamError;
use std::error::Error;

/// What failed in a VM: its memory, one of its vCPUs, a device's section,
/// a CPU check, or an operation of its VMM.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// Guest RAM failed.
    #[error("guest RAM")]
    Ram(#[from] RamError),
    /// A backend operation failed.
    #[error("{backend} backend: {what}")]
    Operation {
        /// Which backend (the VM's [`crate::Vm::vmm_id`]).
        backend: String,
        /// What it was doing.
        what: String,
        /// Why it failed.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A vCPU stopped running the guest.
    #[error("vCPU {vcpu} stopped: {reason}")]
    VcpuFailed {
        /// vCPU index.
        vcpu: u32,
        /// Why.
        reason: String,
    },
    /// The call needs paused vCPUs.
    #[error("the VM must be paused to {0}")]
    NotPaused(&'static str),
    /// Saved vCPU state that this VM cannot take.
    #[error("vCPU state does not fit this VM: {0}")]
    BadVcpuState(String),
    /// A device section this VM cannot load (its data, not its name or
    /// version: the engine refuses those before any memory moves).
    #[error("device section {section} cannot be loaded: {reason}")]
    BadSection {
        /// The section, as `SectionId` displays it.
        section: String,
        /// Why, in the device's words.
        reason: String,
    },
    /// A migration stream's guest section this ferry cannot run.
    #[error("the stream's guest section cannot run here: {0}")]
    Guest(String),
    /// This host cannot give the guest the CPU it was given on its source
    /// (see [`crate::Vm::check_cpu`]); the text names what it lacks.
    #[error("{0}")]
    Cpu(String),
    /// The guest does not fit on this host.
    #[error(transparent)]
    Admission(#[from] crate::admission::AdmissionError),
}

impl VmError {
    /// The VM of `vmm` was asked for a capability it does not declare
    /// (`what`: "time throttle", ...).
    pub fn undeclared(vmm: &str, what: &str) -> Self {
        VmError::Operation {
            backend: vmm.to_string(),
            what: format!("this VM declares no {what}"),
            source: None,
        }
    }
}

/// `e` and every cause under it, joined by `": "`. A cause whose text the
/// message already contains is skipped, so wrapping errors that repeat their
/// source (as `thiserror`'s `transparent` or `{0}` do) print it once.
pub fn error_chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open /dev/kvm")]
    struct Open(#[source] std::io::Error);

    #[test]
    fn causes_are_joined_once() {
        let e = Open(std::io::Error::other("permission denied"));
        assert_eq!(error_chain(&e), "cannot open /dev/kvm: permission denied");
    }
}
