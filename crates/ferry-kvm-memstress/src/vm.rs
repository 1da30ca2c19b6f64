//! `KvmVm`: a VM on `/dev/kvm` running the memstress guest, implementing the
//! engine's `Vm` trait.

use crate::error::KvmVmError;
use crate::guest::boot::{self, Program};
use crate::vcpu::{Sleeper, VcpuState, VcpuThread};
use ferry_kvm::cpu_check::{CpuProfile, HostCpu};
use ferry_kvm::cpu_state::{
    self, MsrProbe, Snapshot, StateError, VcpuContext, VmDevices, XsaveKind,
};
use ferry_kvm::dirty::ring::{DirtyRing, RingPages};
use ferry_kvm::dirty::{DirtyLog, DirtyTracking};
use ferry_kvm::error::{ioctl, KvmError};
use ferry_kvm::memory::set_slot_logging;
use ferry_kvm::throttle::{Throttled, Throttler};
use ferry_memstress::VmConfig;
use ferry_vm::capability;
use ferry_vm::{DirtyMeter, DirtyPages, GuestRam, HarvestStats, Quota, TimeThrottle, Vm, VmError};
use kvm_bindings::{
    kvm_mp_state, kvm_pit_config, KVM_MAX_CPUID_ENTRIES, KVM_MP_STATE_RUNNABLE,
    KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Kvm, VmFd};
use std::sync::Arc;

/// Address of the (unused) real-mode TSS Intel VMX wants; outside guest RAM.
const TSS_ADDRESS: usize = 0xfffb_d000;

/// The VMM id this VM's migration streams carry; a destination builds a
/// `KvmVm` for a stream that names it.
pub const VMM_ID: &str = "ferry-kvm";

/// Which end of a migration a VM is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Boots the guest image and runs it.
    Source,
    /// Starts with empty RAM and vCPUs; the stream fills both.
    Destination,
}

/// A VM on /dev/kvm.
pub struct KvmVm {
    config: VmConfig,
    // Field order is drop order: the throttler (which kicks vCPU threads)
    // stops first, then the vCPU threads, then the VM and RAM go.
    throttler: Option<Throttler>,
    vcpus: Vec<VcpuThread>,
    dirty: DirtyLog,
    ram: Arc<GuestRam>,
    vm: Arc<VmFd>,
    devices: VmDevices,
    msrs: MsrProbe,
    /// What the guest was given: the CPUID set on its vCPUs (or restored
    /// into them) and the MSRs its state carries.
    cpu: CpuProfile,
    /// Features this VM's host does not offer a migrating guest, though
    /// KVM has them (a fleet's baseline CPU).
    cpu_without: Vec<String>,
    running: bool,
    kvm: Kvm,
}

impl KvmVm {
    /// The configuration the VM was built from.
    pub fn config(&self) -> &VmConfig {
        &self.config
    }

    /// Creates the VM, its RAM and its vCPUs (paused). A source also gets the
    /// guest image.
    pub fn new(config: VmConfig, mode: DirtyTracking, role: Role) -> Result<Self, KvmVmError> {
        Self::with_program(config, mode, role, Program::Memstress)
    }

    /// Like [`KvmVm::new`], running `program` instead of memstress (a source's
    /// guest image only; benchmarks use it to calibrate).
    pub fn with_program(
        config: VmConfig,
        mode: DirtyTracking,
        role: Role,
        program: Program,
    ) -> Result<Self, KvmVmError> {
        Self::build(config, mode, role, program, None)
    }

    /// A destination VM on RAM made elsewhere: a same-host upgrade maps the
    /// source process's memory files (`ferry_engine::local`). The RAM's
    /// slots must be the ones `config` lays out.
    pub fn on_ram(
        config: VmConfig,
        mode: DirtyTracking,
        ram: GuestRam,
    ) -> Result<Self, KvmVmError> {
        let want = config.layout().slot_sizes();
        let have: Vec<u64> = ram.slots().iter().map(|s| s.size).collect();
        if have != want {
            return Err(KvmVmError::Config(format!(
                "memory of slots {have:?} bytes, where this VM lays out {want:?}"
            )));
        }
        Self::build(
            config,
            mode,
            Role::Destination,
            Program::Memstress,
            Some(ram),
        )
    }

    fn build(
        config: VmConfig,
        mode: DirtyTracking,
        role: Role,
        program: Program,
        ram: Option<GuestRam>,
    ) -> Result<Self, KvmVmError> {
        config
            .workload
            .validate()
            .map_err(|e| KvmVmError::Config(e.to_string()))?;
        let kvm = Kvm::new().map_err(KvmError::Open)?;
        ferry_kvm::check_api(&kvm).map_err(KvmError::Unusable)?;
        let vm = Arc::new(kvm.create_vm().map_err(ioctl("KVM_CREATE_VM"))?);
        vm.set_tss_address(TSS_ADDRESS)
            .map_err(ioctl("KVM_SET_TSS_ADDR"))?;
        ferry_kvm::dirty::enable_caps(&vm, mode)?;
        let devices = create_interrupt_devices(&vm);

        let layout = config.layout();
        let ram = Arc::new(match ram {
            Some(ram) => ram,
            None => GuestRam::new(&layout.slot_sizes(), config.backing)?,
        });
        for slot in ram.slots() {
            set_slot_logging(&vm, &ram, slot, false)?;
        }
        let pending = Arc::new(RingPages::new(ram.pages()));
        let mut dirty = DirtyLog::new(mode, Arc::clone(&vm), Arc::clone(&ram), pending.clone());

        let cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(ioctl("KVM_GET_SUPPORTED_CPUID"))?;
        let slot_bases = ram.slot_bases();
        let mut fds = Vec::new();
        for i in 0..config.workload.vcpus {
            let fd = vm
                .create_vcpu(u64::from(i))
                .map_err(ioctl("KVM_CREATE_VCPU"))?;
            fd.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;
            if role == Role::Source {
                let sregs = fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?;
                fd.set_sregs(&boot::initial_sregs(sregs))
                    .map_err(ioctl("KVM_SET_SREGS"))?;
                fd.set_regs(&boot::initial_regs(i))
                    .map_err(ioctl("KVM_SET_REGS"))?;
                // With an in-kernel LAPIC, every vCPU but 0 starts waiting
                // for a SIPI; the guest has no BSP to send one.
                fd.set_mp_state(kvm_mp_state {
                    mp_state: KVM_MP_STATE_RUNNABLE,
                })
                .map_err(ioctl("KVM_SET_MP_STATE"))?;
            }
            let ring = match mode {
                DirtyTracking::Ring { entries } => {
                    let ring = Arc::new(DirtyRing::map(
                        &fd,
                        entries,
                        Arc::clone(&vm),
                        slot_bases.clone(),
                        pending.clone(),
                    )?);
                    dirty.add_ring(Arc::clone(&ring));
                    Some(ring)
                }
                _ => None,
            };
            fds.push((fd, ring));
        }
        let tsc_khz = match fds.first().map(|(fd, _)| fd.get_tsc_khz()) {
            Some(Ok(khz)) => u64::from(khz),
            _ if config.workload.has_rate_limit() => {
                return Err(KvmVmError::Config(
                    "a rate limit needs the TSC frequency, which KVM_GET_TSC_KHZ did not give"
                        .into(),
                ))
            }
            _ => 1_000_000,
        };
        // Before any vCPU runs: the probe writes vCPU 0's MSRs back.
        let msrs = match fds.first() {
            Some((fd, _)) => cpu_state::msrs::probe(&kvm, fd).map_err(KvmError::MsrProbe)?,
            None => MsrProbe::default(),
        };
        // What the guest is given, read back from a vCPU (see cpu_check).
        let cpu = match fds.first() {
            Some((fd, _)) => CpuProfile::new(
                fd.get_cpuid2(KVM_MAX_CPUID_ENTRIES)
                    .map_err(ioctl("KVM_GET_CPUID2"))?
                    .as_slice(),
                &msrs.saveable,
            ),
            None => CpuProfile::default(),
        };
        tracing::debug!(
            listed = msrs.listed,
            saveable = msrs.saveable.len(),
            unreadable = ?msrs.unreadable,
            unwritable = ?msrs.unwritable,
            "MSR probe"
        );
        if role == Role::Source {
            boot::load_guest(&ram, &config.workload, tsc_khz, program)?;
        }
        let mut vcpus = Vec::new();
        for (i, (fd, ring)) in fds.into_iter().enumerate() {
            let sleeper = Sleeper {
                ram: Arc::clone(&ram),
                tsc_khz,
            };
            vcpus.push(
                VcpuThread::spawn(i as u32, fd, ring, sleeper)
                    .map_err(|e| KvmVmError::Thread(i as u32, e))?,
            );
        }
        Ok(KvmVm {
            config,
            throttler: None,
            vcpus,
            dirty,
            ram,
            vm,
            devices,
            cpu,
            msrs,
            cpu_without: Vec::new(),
            running: false,
            kvm,
        })
    }

    /// Offers a guest migrating here a CPU without `features` (names as
    /// /proc/cpuinfo spells them), as a fleet's baseline CPU model does:
    /// a guest that was given one of them is refused before any memory
    /// moves. An unknown name is refused at once.
    pub fn without_cpu_features(mut self, features: &[String]) -> Result<Self, KvmVmError> {
        HostCpu::from_parts(&[], Vec::new())
            .without(features)
            .map_err(|e| KvmVmError::Config(e.to_string()))?;
        self.cpu_without = features.to_vec();
        Ok(self)
    }

    /// Runs vCPU `index`'s thread on host CPU `cpu` only (benchmarks pair a
    /// vCPU with the thread that serves its faults).
    pub fn pin_vcpu(&self, index: u32, cpu: usize) -> Result<(), KvmVmError> {
        let vcpu = self
            .vcpus
            .get(index as usize)
            .ok_or_else(|| KvmVmError::Config(format!("no vCPU {index}")))?;
        vcpu.pin(cpu).map_err(|e| KvmVmError::Pin(index, e))
    }

    /// What the MSR probe found when the VM was built.
    pub fn msr_probe(&self) -> &MsrProbe {
        &self.msrs
    }

    /// The in-kernel devices (irqchip, PIT, kvmclock) the VM has.
    pub fn devices(&self) -> VmDevices {
        self.devices
    }

    /// How this VM's vCPUs save and load their state.
    fn vcpu_context(&self) -> Result<VcpuContext<'_>, StateError> {
        Ok(VcpuContext {
            msrs: &self.msrs.saveable,
            xsave: XsaveKind::of(&self.vm)?,
            lapic: self.devices.irqchip,
        })
    }

    /// Throttle sleeps each vCPU has taken (for tests and reports).
    pub fn throttle_sleeps(&self) -> Vec<u64> {
        self.vcpus.iter().map(|v| v.shared.slot.sleeps()).collect()
    }

    /// Refuses `what` unless each vCPU's dirty ring can meter it.
    fn ring_metered(&self, what: &str) -> Result<(), VmError> {
        if matches!(self.dirty.mode(), DirtyTracking::Ring { .. }) {
            return Ok(());
        }
        Err(VmError::Operation {
            backend: "kvm".into(),
            what: format!(
                "set {what}: it is metered by each vCPU's dirty ring; use --dirty-tracking ring"
            ),
            source: None,
        })
    }

    /// The VM's throttle thread, started on first use.
    fn throttler(&mut self) -> Result<&Throttler, VmError> {
        if self.throttler.is_none() {
            let shared = self
                .vcpus
                .iter()
                .map(|v| Arc::clone(&v.shared) as Arc<dyn Throttled>)
                .collect();
            self.throttler = Some(Throttler::start(shared).map_err(KvmVmError::ThrottleThread)?);
        }
        Ok(self.throttler.as_ref().expect("started above"))
    }

    fn failed_vcpu(&self) -> Option<VmError> {
        self.vcpus.iter().find_map(|v| match v.state() {
            VcpuState::Failed(reason) => Some(VmError::VcpuFailed {
                vcpu: v.shared.index,
                reason,
            }),
            _ => None,
        })
    }
}

/// Creates the in-kernel irqchip (PIC, IOAPIC, LAPICs) and PIT, so their
/// state travels with the vCPUs as a real VMM's would. The memstress guest
/// runs unchanged with them at CPL3 (checked on this project's PVM host with
/// every kvm test): it enables no interrupt source (its LAPIC stays
/// software-disabled, it programs neither PIC nor PIT), so no interrupt ever
/// reaches its missing IDT. A host that cannot create them runs without, and
/// the state records "no irqchip".
fn create_interrupt_devices(vm: &VmFd) -> VmDevices {
    let irqchip = match vm.create_irq_chip() {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("KVM_CREATE_IRQCHIP failed ({e}): no in-kernel irqchip, LAPIC or PIT");
            false
        }
    };
    let pit = irqchip
        && match vm.create_pit2(kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        }) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("KVM_CREATE_PIT2 failed ({e}): no in-kernel PIT");
                false
            }
        };
    VmDevices::new(vm, irqchip, pit)
}

impl Vm for KvmVm {
    fn vmm_id(&self) -> &str {
        VMM_ID
    }
    fn vcpus(&self) -> u32 {
        self.config.workload.vcpus
    }
    fn vcpu_threads(&self) -> Vec<u32> {
        self.vcpus
            .iter()
            .map(|v| v.shared.tid.load(std::sync::atomic::Ordering::Acquire))
            .collect()
    }
    fn vmm_config(&self) -> serde_json::Value {
        self.config.vmm_config()
    }

    fn ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }

    fn start(&mut self) -> Result<(), VmError> {
        if let Some(e) = self.failed_vcpu() {
            return Err(e);
        }
        for v in &self.vcpus {
            v.resume();
        }
        self.running = true;
        Ok(())
    }

    fn pause(&mut self) -> Result<(), VmError> {
        for v in &self.vcpus {
            v.request_pause();
        }
        for v in &self.vcpus {
            v.wait_paused();
        }
        self.running = false;
        match self.failed_vcpu() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn is_running(&self) -> bool {
        self.running
    }

    fn check_health(&self) -> Result<(), VmError> {
        match self.failed_vcpu() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn cpu_profile(&self) -> Option<serde_json::Value> {
        Some(self.cpu.to_json())
    }

    fn check_cpu(&self, profile: &serde_json::Value) -> Result<(), VmError> {
        let refuse = |e: ferry_kvm::cpu_check::CpuCheckError| VmError::Cpu(e.to_string());
        let guest = CpuProfile::from_json(profile).map_err(refuse)?;
        let Some(vcpu) = self.vcpus.first() else {
            return Ok(());
        };
        let fd = vcpu.shared.lock_fd();
        HostCpu::probe(&self.kvm, &fd)
            .and_then(|h| h.without(&self.cpu_without))
            .and_then(|h| h.check(&guest))
            .map_err(refuse)
    }

    fn dirty_log(&mut self) -> Option<&mut dyn capability::DirtyLog> {
        Some(self)
    }

    fn time_throttle(&mut self) -> Option<&mut dyn TimeThrottle> {
        Some(self)
    }

    /// Per-vCPU dirty counts come from each vCPU's dirty ring: the
    /// bitmap modes have none.
    fn dirty_meter(&mut self) -> Option<&mut dyn DirtyMeter> {
        self.vcpus
            .iter()
            .all(|v| v.shared.ring.is_some())
            .then_some(self as _)
    }

    fn vcpu_state(&mut self) -> Option<&mut dyn capability::VcpuState> {
        Some(self)
    }
}

impl capability::DirtyLog for KvmVm {
    fn method(&self) -> ferry_vm::DirtyLogMethod {
        self.dirty.mode().method()
    }

    fn start_dirty_log(&mut self) -> Result<(), VmError> {
        Ok(self.dirty.start()?)
    }

    fn harvest_dirty(&mut self, into: &mut DirtyPages) -> Result<HarvestStats, VmError> {
        Ok(self.dirty.harvest(into)?)
    }

    fn stop_dirty_log(&mut self) -> Result<(), VmError> {
        Ok(self.dirty.stop()?)
    }
}

impl KvmVm {
    /// The paused vCPUs' state, and the VM's with them.
    fn snapshot(&mut self) -> Result<Snapshot, VmError> {
        if self.running {
            return Err(VmError::NotPaused("save vCPU state"));
        }
        let cx = self.vcpu_context()?;
        let vm = cpu_state::vm_level::save(&self.vm, self.devices).map_err(StateError::from)?;
        let mut vcpus = Vec::with_capacity(self.vcpus.len());
        for (index, v) in self.vcpus.iter().enumerate() {
            let fd = v.shared.lock_fd();
            vcpus.push(cpu_state::save_vcpu(index, &fd, &cx)?);
        }
        Ok(Snapshot { vm, vcpus })
    }
}

impl capability::VcpuState for KvmVm {
    fn save_vcpus(&mut self) -> Result<Vec<u8>, VmError> {
        Ok(self.snapshot()?.encode()?)
    }

    fn saves_compact(&self) -> bool {
        true
    }

    fn save_vcpus_compact(&mut self) -> Result<Vec<u8>, VmError> {
        Ok(self.snapshot()?.encode_compact()?)
    }

    fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), VmError> {
        if self.running {
            return Err(VmError::NotPaused("restore vCPU state"));
        }
        let snap = Snapshot::decode(state)?;
        if snap.vcpus.len() != self.vcpus.len() {
            return Err(StateError::VcpuCount {
                saved: snap.vcpus.len(),
                here: self.vcpus.len(),
            }
            .into());
        }
        let cx = self.vcpu_context()?;
        snap.check_fits(self.devices, &cx)?;
        cpu_state::vm_level::restore(&self.vm, &snap.vm).map_err(StateError::from)?;
        for (index, (v, vcpu)) in self.vcpus.iter().zip(&snap.vcpus).enumerate() {
            let fd = v.shared.lock_fd();
            cpu_state::restore_vcpu(index, &fd, &cx, vcpu)?;
        }
        if let Some(first) = snap.vcpus.first() {
            self.cpu = CpuProfile::new(&first.cpuid, &self.msrs.saveable);
        }
        Ok(())
    }
}

impl TimeThrottle for KvmVm {
    fn set_time_throttle(&mut self, percent: u8) -> Result<(), VmError> {
        if self.throttler.is_none() && percent == 0 {
            return Ok(());
        }
        self.throttler()?.set_percent(percent);
        Ok(())
    }

    fn throttled(&self) -> Vec<std::time::Duration> {
        self.vcpus.iter().map(|v| v.shared.slot.slept()).collect()
    }
}

impl DirtyMeter for KvmVm {
    fn dirtied(&self) -> Vec<u64> {
        self.vcpus
            .iter()
            .map(|v| v.shared.ring.as_ref())
            .map(|ring| {
                ring.map(|r| {
                    r.collect();
                    r.collected()
                })
            })
            .collect::<Option<Vec<u64>>>()
            .unwrap_or_default()
    }

    fn set_dirty_quota(&mut self, quota: Option<&Quota>) -> Result<(), VmError> {
        self.ring_metered("a per-vCPU dirty quota")?;
        if self.throttler.is_none() && quota.is_none() {
            return Ok(());
        }
        self.throttler()?.set_quota(quota);
        Ok(())
    }

    fn set_dirty_limit(&mut self, bytes_per_sec: Option<u64>) -> Result<(), VmError> {
        self.ring_metered("a per-vCPU dirty limit")?;
        if self.throttler.is_none() && bytes_per_sec.is_none() {
            return Ok(());
        }
        self.throttler()?.set_limit(bytes_per_sec);
        Ok(())
    }
}
