//! The few KVM ioctls that kvm-ioctls does not wrap: `KVM_CLEAR_DIRTY_LOG`,
//! `KVM_RESET_DIRTY_RINGS`, `KVM_GET_STATS_FD`, a vCPU's TSC offset (its device attribute, which
//! kvm-ioctls wraps on aarch64 only), and `KVM_GET_DIRTY_LOG` into a buffer the caller
//! keeps (kvm-ioctls allocates a fresh one per call, and on this class of
//! host first-touching it costs more than the ioctl, inside a same-host
//! pause: docs/results.md, "Same-host upgrade"). Kept here, small and documented,
//! so no other module issues a raw ioctl.

use kvm_bindings::{kvm_clear_dirty_log, kvm_dirty_log};
use kvm_ioctls::{VcpuFd, VmFd};
use vmm_sys_util::errno;
use vmm_sys_util::ioctl::{ioctl, ioctl_with_ref};

/// The two requests' numbers, private to this module.
mod request {
    use kvm_bindings::{kvm_clear_dirty_log, KVMIO};
    use vmm_sys_util::{ioctl_io_nr, ioctl_iowr_nr};

    use kvm_bindings::kvm_dirty_log;
    use vmm_sys_util::ioctl_iow_nr;

    ioctl_iow_nr!(KVM_GET_DIRTY_LOG, KVMIO, 0x42, kvm_dirty_log);
    ioctl_iowr_nr!(KVM_CLEAR_DIRTY_LOG, KVMIO, 0xc0, kvm_clear_dirty_log);
    ioctl_io_nr!(KVM_RESET_DIRTY_RINGS, KVMIO, 0xc7);
    ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);
    use kvm_bindings::kvm_device_attr;
    ioctl_iow_nr!(KVM_SET_DEVICE_ATTR, KVMIO, 0xe1, kvm_device_attr);
    ioctl_iow_nr!(KVM_GET_DEVICE_ATTR, KVMIO, 0xe2, kvm_device_attr);
}
use request::{
    KVM_CLEAR_DIRTY_LOG, KVM_GET_DEVICE_ATTR, KVM_GET_DIRTY_LOG, KVM_GET_STATS_FD,
    KVM_RESET_DIRTY_RINGS, KVM_SET_DEVICE_ATTR,
};

/// The vCPU's binary statistics file (`KVM_GET_STATS_FD`, Linux 5.14 on;
/// [`crate::stats`] reads it).
pub fn stats_fd(vcpu: &VcpuFd) -> errno::Result<std::fs::File> {
    // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1.
    let ret = unsafe { ioctl(vcpu, KVM_GET_STATS_FD()) };
    if ret < 0 {
        return Err(errno::Error::last());
    }
    use std::os::fd::FromRawFd;
    // SAFETY: `ret` is a file descriptor KVM just opened for this call;
    // nothing else owns it.
    Ok(unsafe { std::fs::File::from_raw_fd(ret) })
}

/// The vCPU's TSC offset (`KVM_VCPU_TSC_CTRL`/`KVM_VCPU_TSC_OFFSET`,
/// Linux 5.16 on): the guest's TSC is the host's, scaled, plus it.
pub fn tsc_offset(vcpu: &VcpuFd) -> errno::Result<u64> {
    let mut offset = 0u64;
    let attr = tsc_offset_attr(&mut offset);
    // SAFETY: `attr.addr` points at `offset`, a u64 this frame owns, which
    // KVM writes for this attribute; nothing else is read or written.
    let ret = unsafe { ioctl_with_ref(vcpu, KVM_GET_DEVICE_ATTR(), &attr) };
    if ret == 0 {
        Ok(offset)
    } else {
        Err(errno::Error::last())
    }
}

/// Sets the vCPU's TSC offset ([`tsc_offset`]).
pub fn set_tsc_offset(vcpu: &VcpuFd, mut offset: u64) -> errno::Result<()> {
    let attr = tsc_offset_attr(&mut offset);
    // SAFETY: `attr.addr` points at `offset`, a u64 this frame owns, which
    // KVM reads for this attribute.
    let ret = unsafe { ioctl_with_ref(vcpu, KVM_SET_DEVICE_ATTR(), &attr) };
    if ret == 0 {
        Ok(())
    } else {
        Err(errno::Error::last())
    }
}

fn tsc_offset_attr(offset: &mut u64) -> kvm_bindings::kvm_device_attr {
    kvm_bindings::kvm_device_attr {
        group: kvm_bindings::KVM_VCPU_TSC_CTRL,
        attr: u64::from(kvm_bindings::KVM_VCPU_TSC_OFFSET),
        addr: offset as *mut u64 as u64,
        flags: 0,
    }
}

/// Writes `slot`'s dirty bitmap into `bitmap` (bit 0: the slot's first
/// page), which must hold a bit for each of the slot's `pages` pages.
/// Without manual protect, KVM re-protects the pages it reports.
pub fn get_dirty_log_into(
    vm: &VmFd,
    slot: u32,
    pages: u64,
    bitmap: &mut [u64],
) -> errno::Result<()> {
    assert!(
        bitmap.len() as u64 * 64 >= pages,
        "bitmap too short for the slot"
    );
    let mut arg = kvm_dirty_log {
        slot,
        ..Default::default()
    };
    arg.__bindgen_anon_1.dirty_bitmap = bitmap.as_mut_ptr() as *mut libc::c_void;
    // SAFETY: `arg` is a valid kvm_dirty_log whose bitmap pointer covers the
    // slot's pages (asserted above; KVM writes one bit per page, rounded up
    // to a long) and is borrowed mutably for the call's length.
    let ret = unsafe { ioctl_with_ref(vm, KVM_GET_DIRTY_LOG(), &arg) };
    if ret == 0 {
        Ok(())
    } else {
        Err(errno::Error::last())
    }
}

/// Clears (re-protects) the pages whose bits are set in `bitmap`, for
/// `num_pages` pages of `slot` starting at `first_page` (a multiple of 64).
pub fn clear_dirty_log(
    vm: &VmFd,
    slot: u32,
    first_page: u64,
    num_pages: u32,
    bitmap: &[u64],
) -> errno::Result<()> {
    assert!(
        first_page.is_multiple_of(64),
        "CLEAR_DIRTY_LOG needs 64-page alignment"
    );
    assert!(bitmap.len() * 64 >= num_pages as usize, "bitmap too short");
    let mut arg = kvm_clear_dirty_log {
        slot,
        num_pages,
        first_page,
        ..Default::default()
    };
    arg.__bindgen_anon_1.dirty_bitmap = bitmap.as_ptr() as *mut libc::c_void;
    // SAFETY: `arg` is a valid kvm_clear_dirty_log whose bitmap pointer covers
    // `num_pages` bits (asserted above) and outlives the call; KVM only reads it.
    let ret = unsafe { ioctl_with_ref(vm, KVM_CLEAR_DIRTY_LOG(), &arg) };
    if ret == 0 {
        Ok(())
    } else {
        Err(errno::Error::last())
    }
}

/// Re-protects every page whose ring entry has been marked harvested, in every
/// vCPU's dirty ring. Returns the number of entries reset.
///
/// A signal that lands during the reset makes KVM bail out with EINTR, and it
/// can leave pages it has already taken off the ring unprotected: their next
/// writes then go unlogged and the migration's digest disagrees (seen under
/// auto-converge, whose `SIGRTMIN` kicks are frequent, with pages lost in
/// 64-page batches, when a vCPU thread reset its full ring). So every signal
/// that can be held waits until the reset is done, on whichever thread
/// resets; a kicked vCPU loop takes its sleep before it re-enters KVM_RUN.
pub fn reset_dirty_rings(vm: &VmFd) -> errno::Result<u32> {
    let _held = SignalsHeld::new();
    // SAFETY: KVM_RESET_DIRTY_RINGS takes no argument and only touches the
    // rings KVM itself mapped for this VM.
    let ret = unsafe { ioctl(vm, KVM_RESET_DIRTY_RINGS()) };
    if ret >= 0 {
        Ok(ret as u32)
    } else {
        Err(errno::Error::last())
    }
}

/// Holds back every signal that can be held, on this thread, while it lives;
/// a signal sent meanwhile is delivered when it drops.
/// Not `Send`: the mask it restores is its own thread's.
struct SignalsHeld(libc::sigset_t, std::marker::PhantomData<*const ()>);

impl SignalsHeld {
    fn new() -> Self {
        // SAFETY: sigset_t is plain data, and sigfillset initialises it
        // before use.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; pthread_sigmask fills it in.
        let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: both sets are valid, initialised sigset_t values owned by
        // this frame; pthread_sigmask only changes this thread's mask (the
        // kernel ignores SIGKILL and SIGSTOP in it).
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut before);
        }
        SignalsHeld(before, std::marker::PhantomData)
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`, on the same thread
        // (SignalsHeld is not Send).
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}
