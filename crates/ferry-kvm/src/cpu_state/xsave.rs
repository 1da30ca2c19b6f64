//! The XSAVE area (x87, SSE, AVX and later register state) of any size.
//!
//! The legacy `kvm_xsave` is 4 KiB; an area with AMX tiles or other dynamic
//! features is larger, and only `KVM_GET_XSAVE2` (with `KVM_CAP_XSAVE2`, whose
//! value is the area's size for this VM) reads it whole. The area travels as
//! 32-bit words, exactly as large as the source's KVM made it.

use kvm_bindings::{kvm_xsave, Xsave, KVM_CAP_XSAVE, KVM_CAP_XSAVE2};
use kvm_ioctls::{VcpuFd, VmFd};
use vmm_sys_util::errno;

/// Words in the legacy `kvm_xsave` region.
const LEGACY_WORDS: usize = std::mem::size_of::<kvm_xsave>() / 4;

/// What went wrong with XSAVE.
#[derive(Debug, thiserror::Error)]
pub enum XsaveError {
    /// An XSAVE ioctl failed.
    #[error("{0} failed")]
    Ioctl(&'static str, #[source] errno::Error),
    /// This host's KVM has neither `KVM_CAP_XSAVE2` nor `KVM_CAP_XSAVE`.
    #[error("this host's KVM cannot save the XSAVE area (no KVM_CAP_XSAVE or KVM_CAP_XSAVE2)")]
    Unsupported,
    /// The saved area does not fit this host's.
    #[error("the XSAVE area is {blob} bytes, this host's KVM takes at most {host}")]
    TooLarge {
        /// Bytes in the saved area.
        blob: usize,
        /// Bytes this host's area has.
        host: usize,
    },
    /// The saved area is shorter than even the legacy region.
    #[error("the XSAVE area is {0} bytes, shorter than the 4096-byte legacy region")]
    TooShort(usize),
    /// The wrapper for the area could not be allocated.
    #[error("cannot allocate a {0}-byte XSAVE area")]
    Alloc(usize),
}

/// How this VM's XSAVE area is read and written.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum XsaveKind {
    /// `KVM_GET_XSAVE2`/`KVM_SET_XSAVE` with an area of this many bytes.
    Xsave2(usize),
    /// The 4 KiB `kvm_xsave` of `KVM_GET_XSAVE`.
    Legacy,
}

impl XsaveKind {
    /// Asks `vm`'s KVM. ferry never enables dynamic XSAVE features
    /// (`arch_prctl(ARCH_REQ_XCOMP_GUEST_PERM)`), so the size cannot grow
    /// after this; callers still ask again for each save or restore.
    pub fn of(vm: &VmFd) -> Result<Self, XsaveError> {
        let size = vm.check_extension_raw(u64::from(KVM_CAP_XSAVE2));
        if size > 0 {
            return Ok(XsaveKind::Xsave2((size as usize).max(LEGACY_WORDS * 4)));
        }
        if vm.check_extension_raw(u64::from(KVM_CAP_XSAVE)) > 0 {
            return Ok(XsaveKind::Legacy);
        }
        Err(XsaveError::Unsupported)
    }

    /// The area's size in bytes.
    pub fn bytes(self) -> usize {
        match self {
            XsaveKind::Xsave2(size) => size,
            XsaveKind::Legacy => LEGACY_WORDS * 4,
        }
    }

    /// Words of the area beyond the legacy region.
    fn extra_words(self) -> usize {
        (self.bytes() - LEGACY_WORDS * 4).div_ceil(4)
    }
}

/// Reads the whole XSAVE area of a stopped vCPU.
pub fn save(fd: &VcpuFd, kind: XsaveKind) -> Result<Vec<u32>, XsaveError> {
    match kind {
        XsaveKind::Legacy => {
            let area = fd
                .get_xsave()
                .map_err(|e| XsaveError::Ioctl("KVM_GET_XSAVE", e))?;
            Ok(area.region.to_vec())
        }
        XsaveKind::Xsave2(_) => {
            let mut area = alloc(kind)?;
            // SAFETY: `area` holds the legacy region plus `extra_words` words,
            // at least the size KVM_CAP_XSAVE2 gave for this VM, which is all
            // KVM_GET_XSAVE2 writes.
            unsafe { fd.get_xsave2(&mut area) }
                .map_err(|e| XsaveError::Ioctl("KVM_GET_XSAVE2", e))?;
            let mut words = area.as_fam_struct_ref().xsave.region.to_vec();
            words.extend_from_slice(area.as_slice());
            Ok(words)
        }
    }
}

/// Writes a saved XSAVE area into a stopped vCPU; a smaller area than this
/// host's is padded with zeros (components past it are in their init state,
/// as its header's XSTATE_BV says).
pub fn restore(fd: &VcpuFd, kind: XsaveKind, words: &[u32]) -> Result<(), XsaveError> {
    if words.len() < LEGACY_WORDS {
        return Err(XsaveError::TooShort(words.len() * 4));
    }
    if words.len() * 4 > kind.bytes().next_multiple_of(4) {
        return Err(XsaveError::TooLarge {
            blob: words.len() * 4,
            host: kind.bytes(),
        });
    }
    let (region, extra) = words.split_at(LEGACY_WORDS);
    match kind {
        XsaveKind::Legacy => {
            let mut area = kvm_xsave::default();
            area.region.copy_from_slice(region);
            // SAFETY: without KVM_CAP_XSAVE2 the area is the legacy 4 KiB
            // `kvm_xsave`, so KVM reads no further than its end.
            unsafe { fd.set_xsave(&area) }.map_err(|e| XsaveError::Ioctl("KVM_SET_XSAVE", e))
        }
        XsaveKind::Xsave2(_) => {
            let mut area = alloc(kind)?;
            // SAFETY: only the fixed `region` is written; the length that
            // the wrapper's safety rests on is left alone.
            unsafe { area.as_mut_fam_struct() }
                .xsave
                .region
                .copy_from_slice(region);
            area.as_mut_slice()[..extra.len()].copy_from_slice(extra);
            // SAFETY: `area` is as large as KVM_CAP_XSAVE2 says this VM's
            // area is, which is all KVM_SET_XSAVE reads.
            unsafe { fd.set_xsave2(&area) }.map_err(|e| XsaveError::Ioctl("KVM_SET_XSAVE", e))
        }
    }
}

fn alloc(kind: XsaveKind) -> Result<Xsave, XsaveError> {
    Xsave::new(kind.extra_words()).map_err(|_| XsaveError::Alloc(kind.bytes()))
}
