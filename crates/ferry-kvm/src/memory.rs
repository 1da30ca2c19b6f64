//! Registering guest RAM slots with KVM.

use crate::error::{ioctl, KvmError};
use ferry_vm::{GuestRam, RamSlot};
use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::VmFd;

/// (Re-)registers `slot` with dirty logging on or off, keeping the flags
/// the VMM gave it (`KVM_MEM_READONLY`).
pub fn set_slot_logging(
    vm: &VmFd,
    ram: &GuestRam,
    slot: &RamSlot,
    log_dirty: bool,
) -> Result<(), KvmError> {
    let region = kvm_userspace_memory_region {
        slot: slot.slot,
        flags: if log_dirty {
            slot.flags | KVM_MEM_LOG_DIRTY_PAGES
        } else {
            slot.flags & !KVM_MEM_LOG_DIRTY_PAGES
        },
        guest_phys_addr: slot.gpa.0,
        memory_size: slot.size,
        userspace_addr: ram.host_address(slot) as u64,
    };
    // SAFETY: the host range is a live mapping owned by `ram`, which the VM
    // keeps alive (via Arc) for as long as the slot is registered.
    unsafe { vm.set_user_memory_region(region) }.map_err(ioctl("KVM_SET_USER_MEMORY_REGION"))
}
