//! KVM's dirty log over a VMM's own `VmFd`, as the engine's
//! [`DirtySource`]: a VMM built from rust-vmm crates (its own VM, vCPUs and
//! memory) hands it to the engine through [`ferry_vm::Vm::dirty_sources`]
//! and gets the bitmap or the paced-clear log without writing either.
//!
//! The VMM registers each region of its [`GuestRam`] as the KVM memory slot
//! of the same number ([`ferry_vm::RamSlot::slot`]: region order for
//! [`GuestRam::from_memory`]), at its address. Starting the source
//! re-registers the slots with `KVM_MEM_LOG_DIRTY_PAGES`; stopping it turns
//! logging off again.
//!
//! The dirty ring is per vCPU, so it asks more of the VMM:
//! 1. [`enable_ring`] before the first vCPU exists (KVM refuses it later);
//! 2. [`KvmDirtySource::ring`] with what that returned and every vCPU fd:
//!    it maps each vCPU's ring;
//! 3. each vCPU thread handles [`EXIT_DIRTY_RING_FULL`] (kvm-ioctls reports
//!    it as `VcpuExit::Unsupported`) by calling its [`RingFull::drain`] and
//!    running on.

use super::ring::{DirtyRing, RingPages};
use super::DirtyTracking;
use super::{enable_caps, DirtyLog, EnabledRing};
use crate::error::KvmError;
use ferry_vm::{DirtyPages, DirtySource, DirtySourceError, GuestRam};
use kvm_ioctls::{VcpuFd, VmFd};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// `KVM_EXIT_DIRTY_RING_FULL`: a vCPU's ring has no free entry; see
/// [`RingFull`].
pub const EXIT_DIRTY_RING_FULL: u32 = kvm_bindings::KVM_EXIT_DIRTY_RING_FULL;

/// KVM's dirty log of a VMM's own VM; see the module docs.
pub struct KvmDirtySource {
    log: DirtyLog,
}

/// What a vCPU thread does when its dirty ring is full: the vCPU exits
/// with [`EXIT_DIRTY_RING_FULL`], and its thread calls [`RingFull::drain`]
/// before it runs the vCPU again. The pages stay pending for the engine's
/// next collection.
#[derive(Clone)]
pub struct RingFull(Arc<DirtyRing>);

impl RingFull {
    /// Collects the ring's entries and has KVM recycle them.
    pub fn drain(&self) -> Result<(), KvmError> {
        self.0.drain_full()
    }

    /// The vCPU's ring: its dirty meter for a throttle
    /// ([`crate::throttle::Throttled::ring`]).
    pub fn ring(&self) -> &DirtyRing {
        &self.0
    }
}

impl KvmDirtySource {
    /// The log of `vm`, whose memory slots are `ram`'s, in `mode`: bitmap,
    /// or clear (which turns on `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`). The
    /// ring needs the vCPUs: [`KvmDirtySource::ring`].
    pub fn new(mode: DirtyTracking, vm: Arc<VmFd>, ram: Arc<GuestRam>) -> Result<Self, KvmError> {
        if let DirtyTracking::Ring { .. } = mode {
            return Err(KvmError::Config(
                "the dirty ring is per vCPU: build it with KvmDirtySource::ring and the \
                 vCPU fds"
                    .into(),
            ));
        }
        enable_caps(&vm, mode)?;
        let pending = Arc::new(RingPages::new(ram.pages()));
        Ok(KvmDirtySource {
            log: DirtyLog::new(mode, vm, ram, pending),
        })
    }

    /// The dirty ring `enabled` on `vm` ([`super::enable_ring`], before
    /// its first vCPU), over every one of `vcpus`. Returns, in `vcpus`
    /// order, what each vCPU thread calls when its ring is full.
    pub fn ring(
        vm: Arc<VmFd>,
        ram: Arc<GuestRam>,
        vcpus: &[&VcpuFd],
        enabled: EnabledRing,
    ) -> Result<(Self, Vec<RingFull>), KvmError> {
        if enabled.vm_fd != vm.as_raw_fd() {
            return Err(KvmError::Config(
                "the dirty ring was enabled on another VM".into(),
            ));
        }
        let entries = enabled.entries;
        let mode = DirtyTracking::Ring { entries };
        let pending = Arc::new(RingPages::new(ram.pages()));
        let bases = ram.slot_bases();
        let mut log = DirtyLog::new(mode, Arc::clone(&vm), ram, Arc::clone(&pending));
        let mut full = Vec::with_capacity(vcpus.len());
        for (i, vcpu) in vcpus.iter().enumerate() {
            let mapped = DirtyRing::map(
                vcpu,
                entries,
                Arc::clone(&vm),
                bases.clone(),
                Arc::clone(&pending),
            )
            .map_err(|e| KvmError::Config(format!("vCPU {i}'s dirty ring: {e}")))?;
            let ring = Arc::new(mapped);
            log.add_ring(Arc::clone(&ring));
            full.push(RingFull(ring));
        }
        Ok((KvmDirtySource { log }, full))
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
    fn start(&mut self) -> Result<(), DirtySourceError> {
        self.log
            .start()
            .map_err(|e| DirtySourceError::failed("start logging", e))
    }
    fn collect(&mut self, into: &mut DirtyPages) -> Result<(), DirtySourceError> {
        self.log
            .harvest(into)
            .map(|_| ())
            .map_err(|e| DirtySourceError::failed("harvest", e))
    }
    fn stop(&mut self) {
        if let Err(e) = self.log.stop() {
            tracing::warn!("stopping the kvm dirty log: {}", ferry_vm::error_chain(&e));
        }
    }
}
