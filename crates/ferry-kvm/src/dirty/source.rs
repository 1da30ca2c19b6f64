//! KVM's dirty log over a VMM's own `VmFd`, as the engine's
//! [`DirtySource`]: a VMM built from rust-vmm crates (its own VM, vCPUs and
//! memory) hands it to the engine through [`ferry_backend::Vm::dirty_sources`]
//! and gets the bitmap or the paced-clear log without writing either.
//!
//! The VMM registers each region of its [`GuestRam`] as the KVM memory slot
//! of the same number ([`ferry_backend::RamSlot::slot`]: region order for
//! [`GuestRam::from_memory`]), at its address. Starting the source
//! re-registers the slots with `KVM_MEM_LOG_DIRTY_PAGES`; stopping it turns
//! logging off again. The dirty ring needs each vCPU's ring mapping and is
//! not offered here yet: ferry's own kvm VM runs it.

use super::ring::RingPages;
use super::DirtyLog;
use crate::error::{ioctl, KvmError};
use ferry_backend::{DirtyPages, DirtySource, DirtyTracking, GuestRam};
use kvm_bindings::kvm_enable_cap;
use kvm_ioctls::VmFd;
use std::sync::Arc;

/// MANUAL_PROTECT_ENABLE | INITIALLY_SET.
const MANUAL_PROTECT_FLAGS: u64 = 3;

/// KVM's dirty log of a VMM's own VM; see the module docs.
pub struct KvmDirtySource {
    log: DirtyLog,
}

impl KvmDirtySource {
    /// The log of `vm`, whose memory slots are `ram`'s, in `mode` (bitmap
    /// or clear; clear turns on `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`).
    pub fn new(mode: DirtyTracking, vm: Arc<VmFd>, ram: Arc<GuestRam>) -> Result<Self, KvmError> {
        match mode {
            DirtyTracking::Ring { .. } => {
                return Err(KvmError::Config(
                    "the dirty ring needs each vCPU's ring mapping; use bitmap or clear \
                     with a VM of your own"
                        .into(),
                ))
            }
            DirtyTracking::Clear { .. } => {
                let cap = kvm_bindings::KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2;
                let has = vm.check_extension_raw(u64::from(cap)) as u64;
                if has & MANUAL_PROTECT_FLAGS != MANUAL_PROTECT_FLAGS {
                    return Err(KvmError::MissingCap(
                        "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 with INITIALLY_SET",
                    ));
                }
                let mut enable = kvm_enable_cap {
                    cap,
                    ..Default::default()
                };
                enable.args[0] = MANUAL_PROTECT_FLAGS;
                vm.enable_cap(&enable)
                    .map_err(ioctl("KVM_ENABLE_CAP(MANUAL_DIRTY_LOG_PROTECT2)"))?;
            }
            DirtyTracking::Bitmap => {}
        }
        let pending = Arc::new(RingPages::new(ram.pages()));
        Ok(KvmDirtySource {
            log: DirtyLog::new(mode, vm, ram, pending),
        })
    }
}

impl DirtySource for KvmDirtySource {
    fn name(&self) -> &str {
        match self.log.mode() {
            DirtyTracking::Bitmap => "kvm dirty log (bitmap)",
            DirtyTracking::Clear { .. } => "kvm dirty log (clear)",
            DirtyTracking::Ring { .. } => "kvm dirty ring",
        }
    }
    fn start(&mut self) -> Result<(), String> {
        self.log.start().map_err(|e| ferry_backend::error_chain(&e))
    }
    fn collect(&mut self, into: &mut DirtyPages) -> Result<(), String> {
        self.log
            .harvest(into)
            .map(|_| ())
            .map_err(|e| ferry_backend::error_chain(&e))
    }
    fn stop(&mut self) {
        if let Err(e) = self.log.stop() {
            tracing::warn!(
                "stopping the kvm dirty log: {}",
                ferry_backend::error_chain(&e)
            );
        }
    }
}
