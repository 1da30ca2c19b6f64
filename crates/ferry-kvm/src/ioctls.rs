//! The few KVM ioctls that kvm-ioctls does not wrap: `KVM_CLEAR_DIRTY_LOG` and
//! `KVM_RESET_DIRTY_RINGS`. Kept here, small and documented, so no other module
//! issues a raw ioctl.

use kvm_bindings::{kvm_clear_dirty_log, KVMIO};
use kvm_ioctls::VmFd;
use vmm_sys_util::errno;
use vmm_sys_util::ioctl::{ioctl, ioctl_with_ref};
use vmm_sys_util::{ioctl_io_nr, ioctl_iowr_nr};

ioctl_iowr_nr!(KVM_CLEAR_DIRTY_LOG, KVMIO, 0xc0, kvm_clear_dirty_log);
ioctl_io_nr!(KVM_RESET_DIRTY_RINGS, KVMIO, 0xc7);

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
pub fn reset_dirty_rings(vm: &VmFd) -> errno::Result<u32> {
    // SAFETY: KVM_RESET_DIRTY_RINGS takes no argument and only touches the
    // rings KVM itself mapped for this VM.
    let ret = unsafe { ioctl(vm, KVM_RESET_DIRTY_RINGS()) };
    if ret >= 0 {
        Ok(ret as u32)
    } else {
        Err(errno::Error::last())
    }
}
