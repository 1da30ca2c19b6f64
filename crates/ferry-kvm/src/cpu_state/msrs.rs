//! Which MSRs a vCPU's state carries, and reading and writing them.
//!
//! KVM names the MSRs it can save in `KVM_GET_MSR_INDEX_LIST` (plus the
//! feature MSRs of `KVM_GET_MSR_FEATURE_INDEX_LIST`), but a name in the list
//! is no promise: on some hosts an MSR fails `KVM_GET_MSRS`, or refuses its own
//! value back (this host's `MSR_KVM_ASYNC_PF_INT` without an in-kernel LAPIC).
//! So each VM probes once, on vCPU 0 before it first runs, and keeps what
//! both reads and takes its value back; a save then reads exactly those, and a
//! restore writes them all or says which MSR was refused.

use kvm_bindings::{kvm_msr_entry, MsrList, Msrs, KVM_MAX_MSR_ENTRIES};
use kvm_ioctls::{Cap, Kvm, VcpuFd};
use vmm_sys_util::errno;

/// IA32_TSC: the guest's TSC. Kept without the write-back probe (writing it
/// would move vCPU 0's TSC); every restore writes it.
pub const IA32_TSC: u32 = 0x10;

/// MSR_KVM_SYSTEM_TIME_NEW: where the guest asks KVM to keep its kvmclock
/// page (bit 0: enabled); once written, the guest is on kvmclock.
pub const KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;

/// HV_X64_MSR_TIME_REF_COUNT: Hyper-V's reference counter (100 ns units),
/// which KVM lists as saveable where it offers Hyper-V (the SVM host, not
/// kvm_pvm). KVM derives it from the VM's kvmclock: a clock, not state.
pub const HV_TIME_REF_COUNT: u32 = 0x4000_0020;

/// HV_X64_MSR_VP_RUNTIME: the time the vCPU has run (100 ns units), listed
/// beside it; a clock too.
pub const HV_VP_RUNTIME: u32 = 0x4000_0010;

/// What went wrong with MSRs.
#[derive(Debug, thiserror::Error)]
pub enum MsrError {
    /// An MSR ioctl failed outright.
    #[error("{0} failed")]
    Ioctl(&'static str, #[source] errno::Error),
    /// A list of MSRs could not be built.
    #[error("cannot build a list of {0} MSRs")]
    List(usize),
    /// `KVM_GET_MSRS` stopped before the end.
    #[error("KVM_GET_MSRS read {read} of {total} MSRs: MSR {index:#x} did not read")]
    Unreadable {
        /// MSRs read.
        read: usize,
        /// MSRs asked for.
        total: usize,
        /// The first MSR that failed.
        index: u32,
    },
    /// `KVM_SET_MSRS` stopped before the end.
    #[error(
        "KVM_SET_MSRS wrote {written} of {total} MSRs: MSR {index:#x} (value {value:#x}) was refused"
    )]
    Refused {
        /// MSRs written.
        written: usize,
        /// MSRs given.
        total: usize,
        /// The first MSR refused.
        index: u32,
        /// The value it refused.
        value: u64,
    },
}

/// What the per-VM probe found.
#[derive(Clone, Debug, Default)]
pub struct MsrProbe {
    /// MSRs `KVM_GET_MSR_INDEX_LIST` names.
    pub listed: usize,
    /// Feature MSRs `KVM_GET_MSR_FEATURE_INDEX_LIST` names (0 where it fails).
    pub feature_listed: usize,
    /// The MSRs a vCPU state carries, in list order.
    pub saveable: Vec<u32>,
    /// Listed MSRs that failed `KVM_GET_MSRS`.
    pub unreadable: Vec<u32>,
    /// Listed MSRs that read but refused their own value back.
    pub unwritable: Vec<u32>,
}

/// The feature MSRs of `KVM_GET_MSR_FEATURE_INDEX_LIST`, where the kernel
/// has the list (`KVM_CAP_GET_MSR_FEATURES`): `None` on an older kernel.
/// On a kernel that has it, a failure is an error, not an empty list: the
/// CPU check and the probe would otherwise miss MSRs without a word.
pub fn feature_msrs(kvm: &Kvm) -> Result<Option<MsrList>, errno::Error> {
    if !kvm.check_extension(Cap::GetMsrFeatures) {
        return Ok(None);
    }
    kvm.get_msr_feature_index_list().map(Some)
}

/// Finds the MSRs that `fd` (a vCPU that has not run yet) can save and
/// restore.
pub fn probe(kvm: &Kvm, fd: &VcpuFd) -> Result<MsrProbe, MsrError> {
    let listed = kvm
        .get_msr_index_list()
        .map_err(|e| MsrError::Ioctl("KVM_GET_MSR_INDEX_LIST", e))?;
    // Older kernels lack the feature list; it only adds candidates.
    let features =
        feature_msrs(kvm).map_err(|e| MsrError::Ioctl("KVM_GET_MSR_FEATURE_INDEX_LIST", e))?;
    let mut probe = MsrProbe {
        listed: listed.as_slice().len(),
        feature_listed: features.as_ref().map_or(0, |f| f.as_slice().len()),
        ..MsrProbe::default()
    };
    let mut keep: Vec<u32> = Vec::new();
    for &index in listed
        .as_slice()
        .iter()
        .chain(features.iter().flat_map(|f| f.as_slice()))
    {
        if !keep.contains(&index) {
            keep.push(index);
        }
    }

    // KVM_GET_MSRS returns how many it read, stopping at the first failure:
    // drop that one and carry on after it.
    let mut entries = Vec::with_capacity(keep.len());
    let mut at = 0;
    while at < keep.len() {
        let (read, got) = get_prefix(fd, &keep[at..])?;
        entries.extend(got);
        at += read;
        if at < keep.len() {
            probe.unreadable.push(keep.remove(at));
        }
    }

    // The same for writing each value back, except the TSC.
    let mut at = 0;
    while at < entries.len() {
        if entries[at].index == IA32_TSC {
            at += 1;
            continue;
        }
        let end = entries[at..]
            .iter()
            .position(|e| e.index == IA32_TSC)
            .map_or(entries.len(), |p| at + p);
        let written = set_prefix(fd, &entries[at..end])?;
        at += written;
        if at < end {
            probe.unwritable.push(entries.remove(at).index);
        }
    }
    probe.saveable = entries.iter().map(|e| e.index).collect();
    Ok(probe)
}

/// Reads `indices`, all of them or an error naming the first that failed.
pub fn read(fd: &VcpuFd, indices: &[u32]) -> Result<Vec<kvm_msr_entry>, MsrError> {
    let (read, entries) = get_prefix(fd, indices)?;
    if read < indices.len() {
        return Err(MsrError::Unreadable {
            read,
            total: indices.len(),
            index: indices[read],
        });
    }
    Ok(entries)
}

/// Writes `entries`, all of them or an error naming the first refused.
pub fn write(fd: &VcpuFd, entries: &[kvm_msr_entry]) -> Result<(), MsrError> {
    let written = set_prefix(fd, entries)?;
    if written < entries.len() {
        return Err(MsrError::Refused {
            written,
            total: entries.len(),
            index: entries[written].index,
            value: entries[written].data,
        });
    }
    Ok(())
}

/// Reads `indices` in as many calls as the batch limit needs; returns how many
/// read before the first failure, and their entries.
fn get_prefix(fd: &VcpuFd, indices: &[u32]) -> Result<(usize, Vec<kvm_msr_entry>), MsrError> {
    let mut out = Vec::with_capacity(indices.len());
    for chunk in indices.chunks(KVM_MAX_MSR_ENTRIES) {
        let mut msrs = entries_of(chunk)?;
        let read = fd
            .get_msrs(&mut msrs)
            .map_err(|e| MsrError::Ioctl("KVM_GET_MSRS", e))?;
        out.extend_from_slice(&msrs.as_slice()[..read.min(chunk.len())]);
        if read < chunk.len() {
            break;
        }
    }
    Ok((out.len(), out))
}

/// Writes `entries` in batches; returns how many were written before the
/// first refusal.
fn set_prefix(fd: &VcpuFd, entries: &[kvm_msr_entry]) -> Result<usize, MsrError> {
    let mut done = 0;
    for chunk in entries.chunks(KVM_MAX_MSR_ENTRIES) {
        let msrs = Msrs::from_entries(chunk).map_err(|_| MsrError::List(chunk.len()))?;
        let written = fd
            .set_msrs(&msrs)
            .map_err(|e| MsrError::Ioctl("KVM_SET_MSRS", e))?;
        done += written.min(chunk.len());
        if written < chunk.len() {
            break;
        }
    }
    Ok(done)
}

fn entries_of(indices: &[u32]) -> Result<Msrs, MsrError> {
    let entries: Vec<kvm_msr_entry> = indices
        .iter()
        .map(|&index| kvm_msr_entry {
            index,
            ..Default::default()
        })
        .collect();
    Msrs::from_entries(&entries).map_err(|_| MsrError::List(indices.len()))
}
