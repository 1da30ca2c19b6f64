//! Saving and restoring everything needed to resume a VM's vCPUs exactly on
//! another host: each vCPU's registers, XSAVE area, MSRs, LAPIC, MP state,
//! events and debug registers, plus the VM-level kvmclock, interrupt
//! controllers and PIT, in one checksummed blob.
//!
//! ```text
//!   blob.rs      header: magic, version, CRC-32, length   (refuses foreign blobs)
//!   mod.rs       { vm: VmSnapshot, vcpus: [VcpuSnapshot] } as JSON
//!   vm_level.rs  kvmclock, PIC master/slave, IOAPIC, PIT  (once per VM)
//!   vcpu.rs      one vCPU, restored in the order KVM needs
//!   msrs.rs      which MSRs this host can save (probed once per VM)
//!   xsave.rs     the XSAVE area of any size (KVM_GET_XSAVE2)
//! ```
//!
//! A destination checks the header, then that the state fits this VM (vCPU
//! count, irqchip, XSAVE size), before it writes anything.

pub mod blob;
pub mod msrs;
mod vcpu;
pub mod vm_level;
pub mod xsave;

pub use blob::BlobError;
pub use msrs::{MsrError, MsrProbe};
pub use vcpu::{tell_guest_it_was_paused, VcpuContext, VcpuError, VcpuSnapshot};
pub use vm_level::{Chips, Irqchip, VmDevices, VmSnapshot, VmStateError};
pub use xsave::{XsaveError, XsaveKind};

use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

/// What went wrong saving or restoring the vCPU state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The blob's header refused it.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// The header was good but the body is not this backend's state.
    #[error("the vCPU state body is not ferry kvm state")]
    Body(#[source] serde_json::Error),
    /// The header was good but the compact body is not this backend's
    /// state.
    #[error("the vCPU state's compact body is not ferry kvm state")]
    CompactBody(#[source] bincode::Error),
    /// The state could not be serialized.
    #[error("cannot encode the vCPU state")]
    Encode(#[source] serde_json::Error),
    /// The state could not be serialized in the compact form.
    #[error("cannot encode the vCPU state in its compact form")]
    CompactEncode(#[source] bincode::Error),
    /// The state is for another number of vCPUs.
    #[error("state for {saved} vCPUs, this VM has {here}")]
    VcpuCount {
        /// vCPUs in the state.
        saved: usize,
        /// vCPUs in this VM.
        here: usize,
    },
    /// This host cannot save or load the XSAVE area.
    #[error(transparent)]
    Xsave(#[from] XsaveError),
    /// VM-level state failed.
    #[error("VM-level state")]
    Vm(#[from] VmStateError),
    /// One vCPU's state failed.
    #[error("vCPU {index}")]
    Vcpu {
        /// The vCPU.
        index: usize,
        /// Why.
        #[source]
        source: VcpuError,
    },
}

impl StateError {
    /// Whether the state was refused as not fitting this VM (rather than KVM
    /// failing to save or load it).
    pub fn is_unfit(&self) -> bool {
        match self {
            StateError::Blob(_)
            | StateError::Body(_)
            | StateError::CompactBody(_)
            | StateError::VcpuCount { .. } => true,
            StateError::Vm(e) => matches!(e, VmStateError::Devices { .. }),
            StateError::Vcpu { source, .. } => source.is_unfit(),
            StateError::Encode(_) | StateError::CompactEncode(_) | StateError::Xsave(_) => false,
        }
    }
}

/// The whole saved state of a VM's vCPUs.
#[derive(Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// Once per VM.
    pub vm: VmSnapshot,
    /// One per vCPU, in vCPU order.
    pub vcpus: Vec<VcpuSnapshot>,
}

impl Snapshot {
    /// The blob: header and JSON body ([`blob::JSON`]), which every
    /// ferry loads.
    pub fn encode(&self) -> Result<Vec<u8>, StateError> {
        let body = serde_json::to_vec(self).map_err(StateError::Encode)?;
        Ok(blob::encode(blob::JSON, &body))
    }

    /// The blob with a bincode body ([`blob::COMPACT`]): for a
    /// destination that loads it, since it is the switchover's to write,
    /// send and parse while the guest is paused.
    pub fn encode_compact(&self) -> Result<Vec<u8>, StateError> {
        let body = bincode::serialize(self).map_err(StateError::CompactEncode)?;
        Ok(blob::encode(blob::COMPACT, &body))
    }

    /// Checks the blob's header and parses its body, in either format.
    pub fn decode(data: &[u8]) -> Result<Self, StateError> {
        match blob::decode(data)? {
            (blob::COMPACT, body) => bincode::deserialize(body).map_err(StateError::CompactBody),
            (_, body) => serde_json::from_slice(body).map_err(StateError::Body),
        }
    }

    /// Checks that the state can load into this VM, before anything is
    /// written.
    pub fn check_fits(&self, devices: VmDevices, cx: &VcpuContext) -> Result<(), StateError> {
        vm_level::check_fits(&self.vm, devices)?;
        for (index, snap) in self.vcpus.iter().enumerate() {
            vcpu::check_fits(snap, cx).map_err(|source| StateError::Vcpu { index, source })?;
        }
        Ok(())
    }
}

/// Whether two saved states (blobs of [`Snapshot::encode`]) are the same
/// but for their clocks, which run on while a VM is paused and between one
/// save and the next: each vCPU's IA32_TSC, Hyper-V reference counter and
/// run time, the kvmclock's readings, each PIT channel's load time. Every other byte
/// must match. What a conformance test compares a state saved, restored
/// and saved again with.
pub fn equal_but_clocks(a: &[u8], b: &[u8]) -> bool {
    a == b || matches!((without_clocks(a), without_clocks(b)), (Some(x), Some(y)) if x == y)
}

/// Where two saved states differ but for their clocks: the path of the
/// first field that does (`vcpus/1/msrs/7/data: 5 != 6`), for a test's
/// failure message; `None` where [`equal_but_clocks`] holds.
pub fn clock_free_difference(a: &[u8], b: &[u8]) -> Option<String> {
    if equal_but_clocks(a, b) {
        return None;
    }
    match (without_clocks(a), without_clocks(b)) {
        (Some(x), Some(y)) => Some(diff_path(&x, &y, String::new())),
        _ => Some("one of the two does not decode".into()),
    }
}

fn diff_path(a: &serde_json::Value, b: &serde_json::Value, at: String) -> String {
    use serde_json::Value;
    let child = |k: &dyn std::fmt::Display| match at.is_empty() {
        true => k.to_string(),
        false => format!("{at}/{k}"),
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) if v != w => return diff_path(v, w, child(k)),
                    None => return format!("{}: only in the first", child(k)),
                    _ => {}
                }
            }
            format!("{at}: keys differ")
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find(|(_, (v, w))| v != w)
            .map_or(format!("{at}: equal"), |(i, (v, w))| match v {
                // A record serialized as bytes (an MSR entry): whole.
                Value::Array(inner) if inner.iter().all(Value::is_number) => {
                    format!("{}: {v} != {w}", child(&i))
                }
                _ => diff_path(v, w, child(&i)),
            }),
        _ => format!("{at}: {a} != {b}"),
    }
}

fn without_clocks(state: &[u8]) -> Option<serde_json::Value> {
    let mut s = Snapshot::decode(state).ok()?;
    for m in s.vcpus.iter_mut().flat_map(|v| v.msrs.iter_mut()) {
        if [msrs::IA32_TSC, msrs::HV_TIME_REF_COUNT, msrs::HV_VP_RUNTIME].contains(&m.index) {
            m.data = 0;
        }
    }
    if let Some(clock) = &mut s.vm.clock {
        (clock.clock, clock.realtime, clock.host_tsc) = (0, 0, 0);
    }
    if let Some(pit) = &mut s.vm.pit {
        pit.channels.iter_mut().for_each(|c| c.count_load_time = 0);
    }
    serde_json::to_value(&s).ok()
}

/// Reads vCPU `index`'s state (stopped).
pub fn save_vcpu(index: usize, fd: &VcpuFd, cx: &VcpuContext) -> Result<VcpuSnapshot, StateError> {
    vcpu::save(fd, cx).map_err(|source| StateError::Vcpu { index, source })
}

/// Loads vCPU `index`'s state (stopped, never run).
pub fn restore_vcpu(
    index: usize,
    fd: &VcpuFd,
    cx: &VcpuContext,
    snap: &VcpuSnapshot,
) -> Result<(), StateError> {
    vcpu::restore(fd, cx, snap).map_err(|source| StateError::Vcpu { index, source })
}
