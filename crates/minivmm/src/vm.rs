//! The VM, and what it tells ferry's engine ([`ferry_engine::vmm::Vm`]).

use crate::blk::{self, Blk};
use crate::guest::GuestParams;
use crate::layout::QUEUE_SIZE;
use crate::serial::{self, Console, ConsoleOut};
use crate::vcpu::Vcpu;
use crate::{boot, memory, Devices};
use ferry_engine::vmm::{
    Backing, DirtySource, GuestRam, Section, SectionSpec, TimeThrottle, VcpuState, Vm, VmError,
    PAGE_SIZE,
};
use ferry_kvm::cpu_check::{CpuCheckError, CpuProfile, HostCpu};
use ferry_kvm::cpu_state::{self, Snapshot, VcpuContext, VmDevices, XsaveKind};
use ferry_kvm::dirty::{DirtyTracking, KvmDirtySource};
use kvm_bindings::{kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VmFd};
use serde::{Deserialize, Serialize};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// What the stream header names this VMM.
pub const VMM_ID: &str = "minivmm";
/// Where KVM on Intel wants its (unused) real-mode TSS: outside memory.
const TSS_ADDRESS: usize = 0xfffb_d000;

/// The VM's configuration; the engine carries it to the destination.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MiniConfig {
    /// MiB of the data region (the hole and the system region are fixed).
    pub data_mib: u64,
    /// The disk image both ends open.
    pub disk: PathBuf,
    /// Data pages the guest writes per loop.
    pub sweep_per_loop: u32,
    /// A console line every this many loops (a power of two).
    pub line_every: u32,
    /// The `virtio-blk` section version this VMM saves (tests change it to
    /// see a destination refuse one it cannot load).
    #[serde(default = "blk_version")]
    pub blk_version: u32,
}

fn blk_version() -> u32 {
    blk::VERSION
}

impl MiniConfig {
    /// A VM with `data_mib` MiB of data and the disk at `disk`.
    pub fn new(data_mib: u64, disk: PathBuf) -> Self {
        MiniConfig {
            data_mib,
            disk,
            sweep_per_loop: 4,
            line_every: 8,
            blk_version: blk::VERSION,
        }
    }
}

/// Errors building a VM.
#[derive(Debug, thiserror::Error)]
pub enum MiniVmError {
    /// Memory.
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    /// A KVM call.
    #[error("{0} failed: {1}")]
    Kvm(&'static str, kvm_ioctls::Error),
    /// The boot image.
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    /// A device.
    #[error(transparent)]
    Device(#[from] crate::DeviceError),
    /// ferry's KVM pieces (dirty log, vCPU state).
    #[error(transparent)]
    Ferry(#[from] ferry_kvm::KvmError),
    /// The configuration.
    #[error("{0}")]
    Config(String),
}

impl From<MiniVmError> for VmError {
    fn from(e: MiniVmError) -> Self {
        VmError::Operation {
            backend: VMM_ID.into(),
            what: "build the VM".into(),
            source: Some(Box::new(e)),
        }
    }
}

fn kvm(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> MiniVmError {
    move |e| MiniVmError::Kvm(op, e)
}

/// A minivmm VM: one vCPU, a serial port, a virtio-blk disk.
pub struct MiniVm {
    config: MiniConfig,
    vm: Arc<VmFd>,
    ram: Arc<GuestRam>,
    vcpu: Vcpu,
    devices: Arc<Mutex<Devices>>,
    sources: Vec<Box<dyn DirtySource>>,
    /// The disk's fd (the device owns the file): handed to the new process
    /// on a same-host upgrade.
    disk_fd: std::os::fd::RawFd,
    cpu: CpuContext,
    running: bool,
    /// Exit the process when vCPU state arrives (tests: a destination that
    /// dies before it resumes).
    pub crash_on_restore: bool,
}

/// What saving the vCPU needs, probed once, and what the guest was given.
struct CpuContext {
    msrs: Vec<u32>,
    xsave: XsaveKind,
    /// The CPUID set on (or restored into) the vCPU, and those MSRs: what
    /// a destination's host must be able to give the guest.
    profile: CpuProfile,
}

impl MiniVm {
    /// A VM whose guest starts from the beginning, console into `console`.
    pub fn boot(
        config: MiniConfig,
        backing: Backing,
        console: ConsoleOut,
    ) -> Result<Self, MiniVmError> {
        let ram = Self::memory(&config, backing)?;
        let vm = Self::build(config, ram, console, true, None)?;
        let params = GuestParams {
            data_pages: vm.config.data_mib * (1 << 20) / PAGE_SIZE as u64,
            sweep_per_loop: vm.config.sweep_per_loop.max(1),
            line_every: vm.config.line_every,
        };
        boot::load(&vm.ram, params)?;
        Ok(vm)
    }

    /// A VM for an incoming migration: memory, vCPU and devices as the
    /// source's will be, all to be loaded. It loads the section versions
    /// this build of minivmm knows, whatever the source saves.
    pub fn incoming(
        config: MiniConfig,
        backing: Backing,
        console: ConsoleOut,
    ) -> Result<Self, MiniVmError> {
        let ram = Self::memory(&config, backing)?;
        Self::on_ram(config, ram, console, None)
    }

    /// [`MiniVm::incoming`] on memory another process made (a same-host
    /// upgrade maps the source's memfd), serving the disk through `disk`
    /// (the file the source handed over) where given, else opening the
    /// configured path.
    pub fn on_ram(
        config: MiniConfig,
        ram: GuestRam,
        console: ConsoleOut,
        disk: Option<std::fs::File>,
    ) -> Result<Self, MiniVmError> {
        let config = MiniConfig {
            blk_version: blk::VERSION,
            ..config
        };
        Self::build(config, ram, console, false, disk)
    }

    fn memory(config: &MiniConfig, backing: Backing) -> Result<GuestRam, MiniVmError> {
        GuestRam::from_memory(memory::build(config.data_mib, backing)?, backing)
            .map_err(|e| MiniVmError::Config(e.to_string()))
    }

    fn build(
        config: MiniConfig,
        ram: GuestRam,
        console: ConsoleOut,
        fresh: bool,
        disk: Option<std::fs::File>,
    ) -> Result<Self, MiniVmError> {
        if !config.line_every.is_power_of_two() {
            return Err(MiniVmError::Config(format!(
                "a console line every {} loops: use a power of two",
                config.line_every
            )));
        }
        let kvm_fd = Kvm::new().map_err(kvm("open /dev/kvm"))?;
        let vm = Arc::new(kvm_fd.create_vm().map_err(kvm("KVM_CREATE_VM"))?);
        vm.set_tss_address(TSS_ADDRESS)
            .map_err(kvm("KVM_SET_TSS_ADDR"))?;
        let ram = Arc::new(ram);
        for slot in ram.slots() {
            let region = kvm_userspace_memory_region {
                slot: slot.slot,
                flags: 0,
                guest_phys_addr: slot.gpa.0,
                memory_size: slot.size,
                userspace_addr: ram.host_address(slot) as u64,
            };
            // SAFETY: the mapping belongs to `ram`, which the VM holds for
            // as long as the VM fd lives.
            unsafe { vm.set_user_memory_region(region) }
                .map_err(kvm("KVM_SET_USER_MEMORY_REGION"))?;
        }
        let fd = vm.create_vcpu(0).map_err(kvm("KVM_CREATE_VCPU"))?;
        let cpuid = kvm_fd
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm("KVM_GET_SUPPORTED_CPUID"))?;
        fd.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
        // What the guest is given, read back (ferry_kvm::cpu_check says why).
        let given = fd
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm("KVM_GET_CPUID2"))?;
        let msrs = cpu_state::msrs::probe(&kvm_fd, &fd)
            .map_err(|e| MiniVmError::Config(format!("probing the MSRs: {e}")))?
            .saveable;
        let xsave = XsaveKind::of(&vm).map_err(|e| MiniVmError::Config(e.to_string()))?;
        if fresh {
            let sregs = fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
            fd.set_sregs(&boot::sregs(sregs))
                .map_err(kvm("KVM_SET_SREGS"))?;
            fd.set_regs(&boot::regs()).map_err(kvm("KVM_SET_REGS"))?;
        }
        let disk = match disk {
            Some(file) => file,
            None => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&config.disk)
                .map_err(crate::DeviceError::Disk)?,
        };
        let disk_fd = disk.as_raw_fd();
        let devices = Arc::new(Mutex::new(Devices {
            console: Console::new(console),
            blk: Blk::new(Arc::clone(&ram), disk, QUEUE_SIZE)?,
        }));
        let vcpu = Vcpu::spawn(fd, Arc::clone(&devices))
            .map_err(|e| MiniVmError::Config(format!("cannot start the vCPU thread: {e}")))?;
        let log = KvmDirtySource::new(DirtyTracking::Bitmap, Arc::clone(&vm), Arc::clone(&ram))?;
        Ok(MiniVm {
            config,
            vm,
            ram,
            vcpu,
            devices,
            sources: vec![Box::new(log)],
            disk_fd,
            cpu: CpuContext {
                profile: CpuProfile::new(given.as_slice(), &msrs),
                msrs,
                xsave,
            },
            running: false,
            crash_on_restore: false,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MiniConfig {
        &self.config
    }

    /// Sequence numbers of the disk writes this VM's device served.
    pub fn disk_journal(&self) -> Vec<u64> {
        self.lock_devices().blk.journal.clone()
    }

    fn lock_devices(&self) -> std::sync::MutexGuard<'_, Devices> {
        self.devices.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn context(&self) -> VcpuContext<'_> {
        VcpuContext {
            msrs: &self.cpu.msrs,
            xsave: self.cpu.xsave,
            lapic: false,
        }
    }

    fn state_error(e: cpu_state::StateError) -> VmError {
        e.into()
    }
}

/// The ferry-kvm VM devices this VM has: none (no irqchip, no PIT; the
/// guest takes no interrupt).
fn no_chips(vm: &VmFd) -> VmDevices {
    VmDevices::new(vm, false, false)
}

impl Vm for MiniVm {
    fn vmm_id(&self) -> &str {
        VMM_ID
    }
    fn vmm_config(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).expect("plain data serializes")
    }
    fn ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }
    fn start(&mut self) -> Result<(), VmError> {
        self.vcpu.resume();
        self.running = true;
        Ok(())
    }
    fn pause(&mut self) -> Result<(), VmError> {
        // The vCPU, then the devices: they serve requests only on the
        // vCPU's exits, so a parked vCPU leaves them idle.
        self.vcpu.pause();
        self.running = false;
        // A vCPU that failed is out of KVM_RUN too, but its state is not a
        // guest's to save or move.
        self.check_health()
    }
    fn is_running(&self) -> bool {
        self.running
    }
    fn check_health(&self) -> Result<(), VmError> {
        match self.vcpu.failure() {
            Some(reason) => Err(VmError::VcpuFailed { vcpu: 0, reason }),
            None => Ok(()),
        }
    }
    fn dirty_sources(&mut self) -> &mut [Box<dyn DirtySource>] {
        &mut self.sources
    }
    fn handover_fds(&self) -> Vec<(String, std::os::fd::RawFd)> {
        vec![("disk".into(), self.disk_fd)]
    }

    fn cpu_profile(&self) -> Option<serde_json::Value> {
        Some(self.cpu.profile.to_json())
    }

    /// ferry-kvm's check: this host's `KVM_GET_SUPPORTED_CPUID` and MSR
    /// lists against what the guest was given on its source.
    fn check_cpu(&self, profile: &serde_json::Value) -> Result<(), VmError> {
        let refuse = |e: CpuCheckError| VmError::Cpu(e.to_string());
        let guest = CpuProfile::from_json(profile).map_err(refuse)?;
        let kvm = Kvm::new().map_err(|e| VmError::Cpu(format!("cannot open /dev/kvm: {e}")))?;
        HostCpu::probe(&kvm, &self.vcpu.fd())
            .and_then(|host| host.check(&guest))
            .map_err(refuse)
    }
    fn time_throttle(&mut self) -> Option<&mut dyn TimeThrottle> {
        Some(self)
    }
    fn vcpu_state(&mut self) -> Option<&mut dyn VcpuState> {
        Some(self)
    }
    fn state_sections(&self) -> Vec<SectionSpec> {
        vec![
            SectionSpec::new(serial::SECTION, serial::VERSION, 1),
            SectionSpec::new(blk::SECTION, self.config.blk_version, 1),
        ]
    }
    fn save_sections(&mut self) -> Result<Vec<Section>, VmError> {
        let dev = self.lock_devices();
        Ok(vec![
            Section::new(serial::SECTION, dev.console.save()),
            Section::new(blk::SECTION, dev.blk.save()),
        ])
    }
    fn restore_sections(&mut self, sections: &[Section]) -> Result<(), VmError> {
        let mut dev = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        for s in sections {
            let loaded = match s.id.name.as_str() {
                serial::SECTION => dev.console.restore(&s.data),
                blk::SECTION => dev.blk.restore(&s.data),
                _ => Ok(()),
            };
            loaded.map_err(|e| VmError::BadSection {
                section: s.id.to_string(),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }
}

/// The vCPU's registers and the VM's clock, in ferry-kvm's snapshot format.
impl VcpuState for MiniVm {
    fn save_vcpus(&mut self) -> Result<Vec<u8>, VmError> {
        if self.running {
            return Err(VmError::NotPaused("save vCPU state"));
        }
        let chips = cpu_state::vm_level::save(&self.vm, no_chips(&self.vm))
            .map_err(|e| Self::state_error(e.into()))?;
        let vcpu =
            cpu_state::save_vcpu(0, &self.vcpu.fd(), &self.context()).map_err(Self::state_error)?;
        Snapshot {
            vm: chips,
            vcpus: vec![vcpu],
        }
        .encode()
        .map_err(Self::state_error)
    }
    fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), VmError> {
        if self.crash_on_restore {
            eprintln!("minivmm: crashing on purpose as the vCPU state arrives");
            std::process::exit(3);
        }
        if self.running {
            return Err(VmError::NotPaused("restore vCPU state"));
        }
        let snap = Snapshot::decode(state).map_err(Self::state_error)?;
        let [vcpu] = snap.vcpus.as_slice() else {
            return Err(VmError::BadVcpuState(format!(
                "state for {} vCPUs, minivmm has 1",
                snap.vcpus.len()
            )));
        };
        let cx = self.context();
        snap.check_fits(no_chips(&self.vm), &cx)
            .map_err(Self::state_error)?;
        cpu_state::vm_level::restore(&self.vm, &snap.vm)
            .map_err(|e| Self::state_error(e.into()))?;
        cpu_state::restore_vcpu(0, &self.vcpu.fd(), &cx, vcpu).map_err(Self::state_error)?;
        self.cpu.profile = CpuProfile::new(&vcpu.cpuid, &self.cpu.msrs);
        Ok(())
    }
}

impl TimeThrottle for MiniVm {
    fn set_time_throttle(&mut self, percent: u8) -> Result<(), VmError> {
        self.vcpu.set_throttle(percent);
        Ok(())
    }
}
