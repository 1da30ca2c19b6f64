//! The VM, and what it tells ferry's engine ([`ferry_engine::vmm::Vm`]).

use crate::blk::{self, Blk, Notify};
use crate::fill::{self, device::FillDevice, dirty_source::FillDirtySource};
use crate::guest::GuestParams;
use crate::iothread::IoThread;
use crate::layout::{mmio_base, MAX_VCPUS, QUEUE_SIZE};
use crate::linux::{self, acpi, LinuxGuest};
use crate::serial::{self, Console, ConsoleOut};
use crate::vcpu::Vcpu;
use crate::{boot, layout, memory, Devices};
use ferry_engine::vmm::{
    Backing, DeviceUserfaultfd, DirtyMeter, DirtySource, GuestEntries, GuestRam, Lifecycle,
    OutputGate, Quota, Section, SectionSpec, TimeThrottle, VcpuState, Vm, VmError, PAGE_SIZE,
};
use ferry_kvm::cpu_check::{CpuCheckError, CpuProfile, HostCpu};
use ferry_kvm::cpu_state::{self, Snapshot, VcpuContext, VmDevices, XsaveKind};
use ferry_kvm::dirty::{DirtyTracking, KvmDirtySource};
use ferry_kvm::throttle::Throttler;
use kvm_bindings::{
    kvm_mp_state, kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES,
    KVM_MP_STATE_RUNNABLE, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{IoEventAddress, Kvm, NoDatamatch, VmFd};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use vmm_sys_util::eventfd::EventFd;

/// What the stream header names this VMM.
pub const VMM_ID: &str = "minivmm";
/// The GSI of disk 0's completions; disk i's is this plus i (IOAPIC pins
/// 16-19, the ones PCI devices use).
pub const DISK_GSI: u32 = 16;
/// Where KVM on Intel wants its (unused) real-mode TSS: outside memory.
pub(crate) const TSS_ADDRESS: usize = 0xfffb_d000;

/// The VM's configuration; the engine carries it to the destination.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MiniConfig {
    /// vCPUs, each with its own serial port, disk and data slice.
    #[serde(default = "one")]
    pub vcpus: u32,
    /// How disk notifications reach the code that serves them.
    #[serde(default)]
    pub notify: Notify,
    /// Disk writes complete only once on storage (`fdatasync`).
    #[serde(default)]
    pub writethrough: bool,
    /// An in-kernel irqchip (PIC, IOAPIC, a LAPIC per vCPU), whose state
    /// travels with the vCPUs'; each disk raises its completions through
    /// an irqfd on it.
    #[serde(default)]
    pub irqchip: bool,
    /// A vhost-user fill device, driven by vCPU 0, served by a backend
    /// process (needs memfd memory).
    #[serde(default)]
    pub fill: bool,
    /// Where the source's fill backend listens: a same-host upgrade's new
    /// process reconnects there. Set by the VM.
    #[serde(default)]
    pub fill_socket: Option<PathBuf>,
    /// Collect the fill backend's writes through the vhost-user dirty log.
    /// Tests turn it off to see the digest catch what is then missed.
    #[serde(default = "yes")]
    pub fill_dirty_log: bool,
    /// MiB of the data region (the hole and the system region are fixed).
    pub data_mib: u64,
    /// vCPU 0's disk image, which both ends open; vCPU i's is this path
    /// with `.i` appended ([`MiniConfig::disk_path`]).
    pub disk: PathBuf,
    /// Data pages the guest writes per loop.
    pub sweep_per_loop: u32,
    /// A console line every this many loops (a power of two).
    pub line_every: u32,
    /// The `virtio-blk` section version this VMM saves (tests change it to
    /// see a destination refuse one it cannot load).
    #[serde(default = "blk_version")]
    pub blk_version: u32,
    /// Boot a Linux kernel instead of minivmm's own guest program: the
    /// data region is then the kernel's RAM above 32 MiB, and the VM has an
    /// in-kernel PIT and ACPI tables ([`crate::linux`]).
    #[serde(default)]
    pub linux: Option<LinuxGuest>,
    /// Track dirty pages in each vCPU's dirty ring, which meters each
    /// vCPU's writes: the VM then serves the seed's per-vCPU quota and
    /// QEMU's dirty limit, not only auto-converge. Where KVM has no ring,
    /// the VM falls back to the bitmap and says so.
    #[serde(default = "yes")]
    pub dirty_ring: bool,
}

/// Entries in each vCPU's dirty ring: 256 MiB of pages between two
/// collections (the throttle collects every 5 ms while it meters, a
/// harvest at least once a round, and a full ring exits to be drained).
pub const DIRTY_RING_ENTRIES: u32 = 65536;

fn blk_version() -> u32 {
    blk::VERSION
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// Where a VM's fill backend comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FillBackend {
    /// A new process of its own.
    Spawn,
    /// The one the source used, still running (a same-host upgrade).
    Adopt,
}

impl MiniConfig {
    /// A VM with `vcpus` vCPUs, `data_mib` MiB of data and vCPU 0's disk
    /// at `disk`, notified through ioeventfds.
    pub fn new(vcpus: u32, data_mib: u64, disk: PathBuf) -> Self {
        MiniConfig {
            vcpus,
            notify: Notify::default(),
            writethrough: true,
            irqchip: true,
            fill: false,
            fill_socket: None,
            fill_dirty_log: true,
            data_mib,
            disk,
            sweep_per_loop: 4,
            line_every: 8,
            blk_version: blk::VERSION,
            linux: None,
            dirty_ring: true,
        }
    }

    /// vCPU `i`'s disk image.
    pub fn disk_path(&self, i: u32) -> PathBuf {
        match i {
            0 => self.disk.clone(),
            _ => PathBuf::from(format!("{}.{i}", self.disk.display())),
        }
    }
}

/// The name under which disk `i`'s fd is handed over on a same-host
/// upgrade.
pub fn disk_fd_name(i: u32) -> String {
    match i {
        0 => "disk".into(),
        _ => format!("disk{i}"),
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
    /// Booting a Linux guest.
    #[error(transparent)]
    Linux(#[from] crate::linux::LinuxError),
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

/// A minivmm VM: N vCPUs, and for each a serial port and a virtio-blk
/// disk; one I/O thread serves the disks.
pub struct MiniVm {
    /// First, so it is dropped first: it kicks the vCPU threads, which
    /// must outlive its last kick. Started on first use.
    throttler: Option<Throttler>,
    /// Whether each vCPU's dirty ring meters its writes ([`DirtyMeter`]).
    metered: bool,
    config: MiniConfig,
    vm: Arc<VmFd>,
    ram: Arc<GuestRam>,
    vcpus: Vec<Vcpu>,
    devices: Arc<Devices>,
    /// One per disk, unless the disks are served inline.
    io: Vec<IoThread>,
    sources: Vec<Box<dyn DirtySource>>,
    /// The disks' fds (the devices own the files): handed to the new
    /// process on a same-host upgrade.
    disk_fds: Vec<std::os::fd::RawFd>,
    cpu: CpuContext,
    running: bool,
    /// Requests made available and not completed as the last pause began.
    in_flight_at_pause: u64,
    /// When the last pause of a running guest began (the host's
    /// CLOCK_REALTIME, ms since the epoch).
    paused_unix_ms: Option<f64>,
    /// Exit the process when vCPU state arrives (tests: a destination that
    /// dies before it resumes).
    pub crash_on_restore: bool,
    /// The guest's outputs (disk requests, console bytes) wait until
    /// released ([`OutputGate`]).
    held: bool,
    /// Offer no output gate (a strict switchover then keeps the guest
    /// paused until the digest's verdict): the baseline the gate is
    /// measured against.
    pub no_output_gate: bool,
    /// CPU features this host withholds from a migrating guest
    /// (`minivmm receive --cpu-without`): its CPU check refuses a guest
    /// that was given one.
    pub cpu_without: Vec<String>,
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
    /// A VM whose guest starts from the beginning, vCPU i's console into
    /// `consoles[i]`.
    pub fn boot(
        config: MiniConfig,
        backing: Backing,
        consoles: Vec<ConsoleOut>,
    ) -> Result<Self, MiniVmError> {
        let ram = Self::memory(&config, backing)?;
        let vm = Self::build(config, ram, consoles, true, Vec::new(), FillBackend::Spawn)?;
        if let Some(guest) = vm.config.linux.clone() {
            return vm.boot_linux(&guest);
        }
        let params = GuestParams {
            sweep_per_loop: vm.config.sweep_per_loop.max(1),
            line_every: vm.config.line_every,
        };
        let data_pages = vm.config.data_mib * (1 << 20) / PAGE_SIZE as u64;
        boot::load(&vm.ram, params, vm.config.vcpus, data_pages, vm.config.fill)?;
        Ok(vm)
    }

    /// Loads a Linux kernel and starts vCPU 0 at its 64-bit entry; the
    /// others wait, as on hardware, for its startup IPIs.
    fn boot_linux(self, guest: &LinuxGuest) -> Result<Self, MiniVmError> {
        let ranges = [
            (0, layout::SYSTEM_BYTES),
            (layout::DATA_GPA, self.config.data_mib << 20),
        ];
        let disks: Vec<_> = (0..self.config.vcpus)
            .map(|i| acpi::MmioDevice {
                base: mmio_base(i),
                gsi: DISK_GSI + i,
            })
            .collect();
        let entry = linux::boot::load(&self.ram, guest, &ranges, self.config.vcpus, &disks)?;
        {
            let fd = self.vcpus[0].fd();
            let sregs = fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
            fd.set_sregs(&linux::boot::sregs(sregs))
                .map_err(kvm("KVM_SET_SREGS"))?;
            fd.set_regs(&linux::boot::regs(entry))
                .map_err(kvm("KVM_SET_REGS"))?;
        }
        Ok(self)
    }

    /// A VM for an incoming migration: memory, vCPU and devices as the
    /// source's will be, all to be loaded. It loads the section versions
    /// this build of minivmm knows, whatever the source saves.
    pub fn incoming(
        config: MiniConfig,
        backing: Backing,
        consoles: Vec<ConsoleOut>,
    ) -> Result<Self, MiniVmError> {
        let ram = Self::memory(&config, backing)?;
        let config = MiniConfig {
            blk_version: blk::VERSION,
            ..config
        };
        Self::build(config, ram, consoles, false, Vec::new(), FillBackend::Spawn)
    }

    /// [`MiniVm::incoming`] on memory another process made (a same-host
    /// upgrade maps the source's memfd), serving disk i through `disks[i]`
    /// (the file the source handed over) where given, else opening its
    /// configured path. A fill device reconnects to the source's backend,
    /// which kept running.
    pub fn on_ram(
        config: MiniConfig,
        ram: GuestRam,
        consoles: Vec<ConsoleOut>,
        disks: Vec<Option<File>>,
    ) -> Result<Self, MiniVmError> {
        let config = MiniConfig {
            blk_version: blk::VERSION,
            ..config
        };
        Self::build(config, ram, consoles, false, disks, FillBackend::Adopt)
    }

    fn memory(config: &MiniConfig, backing: Backing) -> Result<GuestRam, MiniVmError> {
        GuestRam::from_memory(memory::build(config.data_mib, backing)?, backing)
            .map_err(|e| MiniVmError::Config(e.to_string()))
    }

    fn build(
        mut config: MiniConfig,
        ram: GuestRam,
        consoles: Vec<ConsoleOut>,
        fresh: bool,
        mut disks: Vec<Option<File>>,
        fill_backend: FillBackend,
    ) -> Result<Self, MiniVmError> {
        if !config.line_every.is_power_of_two() {
            return Err(MiniVmError::Config(format!(
                "a console line every {} loops: use a power of two",
                config.line_every
            )));
        }
        let n = config.vcpus;
        if !(1..=MAX_VCPUS).contains(&n) {
            return Err(MiniVmError::Config(format!(
                "{n} vCPUs: minivmm runs 1 to {MAX_VCPUS}, one per COM port"
            )));
        }
        if consoles.len() != n as usize {
            return Err(MiniVmError::Config(format!(
                "{} consoles for {n} vCPUs",
                consoles.len()
            )));
        }
        let kvm_fd = Kvm::new().map_err(kvm("open /dev/kvm"))?;
        let vm = Arc::new(kvm_fd.create_vm().map_err(kvm("KVM_CREATE_VM"))?);
        vm.set_tss_address(TSS_ADDRESS)
            .map_err(kvm("KVM_SET_TSS_ADDR"))?;
        let linux = config.linux.is_some();
        if linux && !config.irqchip {
            return Err(MiniVmError::Config(
                "a Linux guest needs the in-kernel irqchip".into(),
            ));
        }
        if config.irqchip {
            vm.create_irq_chip().map_err(kvm("KVM_CREATE_IRQCHIP"))?;
        }
        if linux {
            let pit = kvm_pit_config {
                flags: KVM_PIT_SPEAKER_DUMMY,
                ..Default::default()
            };
            vm.create_pit2(pit).map_err(kvm("KVM_CREATE_PIT2"))?;
        }
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
        // The ring must be enabled before the first vCPU exists.
        let dirty_ring = match config.dirty_ring {
            true => match ferry_kvm::dirty::enable_ring(&vm, DIRTY_RING_ENTRIES) {
                Ok(enabled) => Some(enabled),
                Err(e) => {
                    eprintln!(
                        "minivmm: no dirty ring ({e}): dirty pages by bitmap, and no per-vCPU \
                         dirty quota or limit"
                    );
                    None
                }
            },
            false => None,
        };
        let supported = kvm_fd
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm("KVM_GET_SUPPORTED_CPUID"))?;
        let mut fds = Vec::new();
        for i in 0..n {
            let fd = vm
                .create_vcpu(u64::from(i))
                .map_err(kvm("KVM_CREATE_VCPU"))?;
            let cpuid = match linux {
                true => linux::cpuid::for_vcpu(&supported, i, n),
                false => with_apic_id(&supported, i),
            };
            fd.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
            if fresh && linux {
                // As firmware leaves them: LINT0 takes the PIC's
                // interrupts (ExtINT), LINT1 NMIs. boot_linux sets vCPU
                // 0's registers once the kernel is loaded.
                linux::boot::set_lints(&fd).map_err(kvm("KVM_SET_LAPIC"))?;
            } else if fresh {
                let sregs = fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
                fd.set_sregs(&boot::sregs(sregs))
                    .map_err(kvm("KVM_SET_SREGS"))?;
                fd.set_regs(&boot::regs(i)).map_err(kvm("KVM_SET_REGS"))?;
                // With a LAPIC, KVM holds every vCPU but 0 until a
                // startup IPI; minivmm's guest starts them all at once.
                if config.irqchip && i > 0 {
                    let runnable = kvm_mp_state {
                        mp_state: KVM_MP_STATE_RUNNABLE,
                    };
                    fd.set_mp_state(runnable).map_err(kvm("KVM_SET_MP_STATE"))?;
                }
            }
            fds.push(fd);
        }
        // What the guest is given, read back (ferry_kvm::cpu_check says why).
        let given = fds[0]
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm("KVM_GET_CPUID2"))?;
        let msrs = cpu_state::msrs::probe(&kvm_fd, &fds[0])
            .map_err(|e| MiniVmError::Config(format!("probing the MSRs: {e}")))?
            .saveable;
        let xsave = XsaveKind::of(&vm).map_err(|e| MiniVmError::Config(e.to_string()))?;

        disks.resize_with(n as usize, || None);
        let mut blks = Vec::new();
        let mut rings = Vec::new();
        let mut kicks = Vec::new();
        let mut disk_fds = Vec::new();
        for (i, handed) in (0..n).zip(disks) {
            let disk = match handed {
                Some(file) => file,
                None => std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(config.disk_path(i))
                    .map_err(crate::DeviceError::Disk)?,
            };
            disk_fds.push(disk.as_raw_fd());
            let kick = match config.notify {
                Notify::Inline => None,
                Notify::Exit | Notify::Ioeventfd => {
                    let kick = EventFd::new(libc::EFD_NONBLOCK)
                        .map_err(|e| MiniVmError::Config(format!("an eventfd: {e}")))?;
                    if config.notify == Notify::Ioeventfd {
                        let at = IoEventAddress::Mmio(mmio_base(i) + blk::QUEUE_NOTIFY);
                        vm.register_ioevent(&kick, &at, NoDatamatch)
                            .map_err(kvm("KVM_IOEVENTFD"))?;
                    }
                    let theirs = kick
                        .try_clone()
                        .map_err(|e| MiniVmError::Config(format!("an eventfd: {e}")))?;
                    kicks.push((i as usize, kick));
                    Some(theirs)
                }
            };
            let mut blk = Blk::new(Arc::clone(&ram), disk, QUEUE_SIZE, kick)?;
            blk.set_writethrough(config.writethrough);
            if config.irqchip {
                let irq = EventFd::new(libc::EFD_NONBLOCK)
                    .map_err(|e| MiniVmError::Config(format!("an eventfd: {e}")))?;
                vm.register_irqfd(&irq, DISK_GSI + i)
                    .map_err(kvm("KVM_IRQFD"))?;
                blk.set_interrupt(irq);
            }
            rings.push(blk.rings());
            blks.push(Mutex::new(blk));
        }
        let fill = match config.fill {
            true => Some(Mutex::new(Self::fill_device(
                &mut config,
                &vm,
                &ram,
                fill_backend,
            )?)),
            false => None,
        };
        let consoles = (0..)
            .zip(consoles)
            .map(|(i, out)| {
                // A Linux guest's COM1 takes interrupts (IRQ 4).
                let irq = match linux && i == 0 {
                    true => {
                        let irq = EventFd::new(libc::EFD_NONBLOCK)
                            .map_err(|e| MiniVmError::Config(format!("an eventfd: {e}")))?;
                        vm.register_irqfd(&irq, linux::COM1_GSI)
                            .map_err(kvm("KVM_IRQFD"))?;
                        Some(irq)
                    }
                    false => None,
                };
                Console::with_interrupt(out, irq)
                    .map(Mutex::new)
                    .map_err(|e| MiniVmError::Config(format!("an eventfd: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let devices = Arc::new(Devices {
            consoles,
            blks,
            rings,
            fill,
            power: Mutex::new(None),
        });
        let io = kicks
            .into_iter()
            .map(|(i, kick)| {
                IoThread::spawn(
                    format!("minivmm-io{i}"),
                    Arc::clone(&devices),
                    vec![(i, kick)],
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| MiniVmError::Config(e.to_string()))?;
        let metered = dirty_ring.is_some();
        let (log, full) = match dirty_ring {
            Some(enabled) => {
                let refs: Vec<&kvm_ioctls::VcpuFd> = fds.iter().collect();
                let (log, full) =
                    KvmDirtySource::ring(Arc::clone(&vm), Arc::clone(&ram), &refs, enabled)?;
                (log, full.into_iter().map(Some).collect())
            }
            None => {
                let bitmap = DirtyTracking::Bitmap;
                let log = KvmDirtySource::new(bitmap, Arc::clone(&vm), Arc::clone(&ram))?;
                (log, vec![None; n as usize])
            }
        };
        let vcpus = (0..n)
            .zip(fds)
            .zip(full)
            .map(|((i, fd), ring)| Vcpu::spawn(i, fd, ring, Arc::clone(&devices)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| MiniVmError::Config(format!("cannot start a vCPU thread: {e}")))?;
        let mut sources: Vec<Box<dyn DirtySource>> = vec![Box::new(log)];
        if config.fill && config.fill_dirty_log {
            sources.push(Box::new(FillDirtySource::new(Arc::clone(&devices))));
        }
        Ok(MiniVm {
            throttler: None,
            metered,
            config,
            vm,
            ram,
            vcpus,
            devices,
            io,
            sources,
            disk_fds,
            cpu: CpuContext {
                profile: CpuProfile::new(given.as_slice(), &msrs),
                msrs,
                xsave,
            },
            running: false,
            in_flight_at_pause: 0,
            paused_unix_ms: None,
            crash_on_restore: false,
            held: false,
            no_output_gate: false,
            cpu_without: Vec::new(),
        })
    }

    /// The fill device: its backend started (or, on a same-host upgrade,
    /// the source's found), its notify register an ioeventfd on the
    /// backend's kick, its completions an irqfd where there is an irqchip.
    fn fill_device(
        config: &mut MiniConfig,
        vm: &VmFd,
        ram: &Arc<GuestRam>,
        backend: FillBackend,
    ) -> Result<FillDevice, MiniVmError> {
        let fail = |e: crate::fill::FillError| MiniVmError::Config(e.to_string());
        let (socket, child) = match (backend, &config.fill_socket) {
            (FillBackend::Adopt, Some(socket)) => (socket.clone(), None),
            (FillBackend::Adopt, None) => {
                return Err(MiniVmError::Config(
                    "the source names no fill backend to reconnect to".into(),
                ))
            }
            (FillBackend::Spawn, _) => {
                let (socket, child) = crate::fill::spawn_backend().map_err(fail)?;
                (socket, Some(child))
            }
        };
        config.fill_socket = Some(socket.clone());
        let eventfd = || {
            EventFd::new(libc::EFD_NONBLOCK)
                .map_err(|e| MiniVmError::Config(format!("an eventfd: {e}")))
        };
        let (kick, call) = (eventfd()?, eventfd()?);
        if config.notify == Notify::Ioeventfd {
            let at = IoEventAddress::Mmio(mmio_base(crate::fill::MMIO_INDEX) + blk::QUEUE_NOTIFY);
            vm.register_ioevent(&kick, &at, NoDatamatch)
                .map_err(kvm("KVM_IOEVENTFD"))?;
        }
        if config.irqchip {
            vm.register_irqfd(&call, DISK_GSI + crate::fill::MMIO_INDEX)
                .map_err(kvm("KVM_IRQFD"))?;
        }
        Ok(FillDevice::new(Arc::clone(ram), socket, child, kick, call))
    }

    /// Why the fill device failed, if it did; the VM runs on without it.
    pub fn fill_failure(&self) -> Option<String> {
        let fill = self.devices.fill.as_ref()?;
        lock(fill).failure().map(String::from)
    }

    /// Leaves the fill backend running when this VM goes: a same-host
    /// upgrade moved the VM, and the new process is its client now.
    pub fn release_fill_backend(&self) {
        if let Some(fill) = &self.devices.fill {
            lock(fill).release_backend();
        }
    }

    /// The configuration.
    pub fn config(&self) -> &MiniConfig {
        &self.config
    }

    /// Sequence numbers of the disk writes each disk served.
    pub fn disk_journals(&self) -> Vec<Vec<u64>> {
        self.devices
            .blks
            .iter()
            .map(|b| lock(b).journal.clone())
            .collect()
    }

    /// Requests the guest had made available and the disks had not
    /// completed, counted as the last pause began (before the I/O thread
    /// was quiesced).
    pub fn requests_in_flight_at_pause(&self) -> u64 {
        self.in_flight_at_pause
    }

    /// When the last pause of the running guest began, in ms since the
    /// epoch (CLOCK_REALTIME, the clock QEMU stamps its events with): a
    /// migration's switchover, against which the guest's own clock gaps
    /// can be placed.
    pub fn paused_unix_ms(&self) -> Option<f64> {
        self.paused_unix_ms
    }

    /// Disk notifications that exited to a vCPU thread.
    pub fn notify_exits(&self) -> u64 {
        self.devices.blks.iter().map(|b| lock(b).notify_exits).sum()
    }

    fn context(&self) -> VcpuContext<'_> {
        VcpuContext {
            msrs: &self.cpu.msrs,
            xsave: self.cpu.xsave,
            lapic: self.config.irqchip,
        }
    }

    fn chips(&self) -> VmDevices {
        VmDevices::new(&self.vm, self.config.irqchip, self.config.linux.is_some())
    }

    /// Bytes for vCPU `i`'s serial port to receive (a Linux guest's checker
    /// reads `moved` on its console after a migration).
    pub fn console_input(&self, i: u32, bytes: &[u8]) -> Result<(), crate::DeviceError> {
        match self.devices.consoles.get(i as usize) {
            Some(c) => lock(c).input(bytes),
            None => Err(crate::DeviceError::State {
                section: serial::SECTION,
                why: format!("no console {i}"),
            }),
        }
    }

    /// What the guest asked of its sleep control register, once it has:
    /// a Linux guest powering off, say.
    pub fn guest_exit(&self) -> Option<linux::PowerRequest> {
        *lock(&self.devices.power)
    }

    /// Completion interrupts the disks raised through their irqfds.
    pub fn interrupts_raised(&self) -> u64 {
        self.devices.blks.iter().map(|b| lock(b).interrupts).sum()
    }

    /// The paused vCPUs' state, and the VM's with them.
    fn snapshot(&mut self) -> Result<Snapshot, VmError> {
        if self.running {
            return Err(VmError::NotPaused("save vCPU state"));
        }
        let chips = cpu_state::vm_level::save(&self.vm, self.chips())
            .map_err(|e| Self::state_error(e.into()))?;
        let cx = self.context();
        let vcpus = (0..)
            .zip(&self.vcpus)
            .map(|(i, v)| cpu_state::save_vcpu(i, &v.fd(), &cx))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Self::state_error)?;
        Ok(Snapshot { vm: chips, vcpus })
    }

    fn state_error(e: cpu_state::StateError) -> VmError {
        e.into()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `supported` as vCPU `i` sees it: its own APIC id in leaf 1 and in the
/// x2APIC topology leaves.
fn with_apic_id(supported: &CpuId, i: u32) -> CpuId {
    let mut cpuid = supported.clone();
    for e in cpuid.as_mut_slice() {
        match e.function {
            1 => e.ebx = (e.ebx & 0x00ff_ffff) | (i << 24),
            0xb | 0x1f => e.edx = i,
            _ => {}
        }
    }
    cpuid
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
    fn vcpus(&self) -> u32 {
        self.config.vcpus
    }
    fn vcpu_threads(&self) -> Vec<u32> {
        self.vcpus.iter().map(Vcpu::thread_id).collect()
    }
    fn start(&mut self) -> Result<(), VmError> {
        // Devices first: a notification that came with the source's state
        // is served (or handed to the I/O thread) before the guest runs.
        for blk in &self.devices.blks {
            lock(blk).start();
        }
        // A fill device whose backend is gone stays failed (reported by
        // `fill_failure`); the VM runs on without it.
        if let Some(fill) = &self.devices.fill {
            if let Err(e) = lock(fill).start() {
                eprintln!("minivmm: the fill device stays stopped: {e}");
            }
        }
        // Held, the disks' notifications wait in their eventfds: the
        // I/O threads stay quiesced until the release.
        if !self.held {
            for io in &self.io {
                io.resume();
            }
        }
        // The guest's kvmclock ran on while it was held (paused for a move,
        // restored from a file later): a Linux guest told so does not take
        // the hold for CPUs stuck that long (a soft lockup). Only while
        // parked: a running vCPU's thread holds its fd.
        if !self.running {
            for (i, v) in self.vcpus.iter().enumerate() {
                if let Err(e) = cpu_state::tell_guest_it_was_paused(&v.fd()) {
                    eprintln!(
                        "minivmm: vCPU {i}: {}: a guest held for long may report a soft lockup",
                        ferry_engine::vmm::error_chain(&e)
                    );
                }
            }
        }
        for v in &self.vcpus {
            v.resume();
        }
        self.running = true;
        Ok(())
    }
    fn pause(&mut self) -> Result<(), VmError> {
        if self.running {
            self.paused_unix_ms = Some(unix_ms());
        }
        self.in_flight_at_pause = self
            .devices
            .rings
            .iter()
            .map(|r| u64::from(r.in_flight(&self.ram)))
            .sum();
        // The vCPUs (together), then the I/O thread: once no vCPU runs, no
        // new notification comes, and the batch it is serving finishes.
        for v in &self.vcpus {
            v.ask_pause();
        }
        for v in &self.vcpus {
            v.wait_parked();
        }
        for io in &self.io {
            io.quiesce();
        }
        self.running = false;
        // The backend finishes the buffers it took and stops its ring.
        if let Some(fill) = &self.devices.fill {
            lock(fill)
                .pause()
                .map_err(|e| VmError::Guest(format!("pausing the fill device: {e}")))?;
        }
        // A vCPU that failed is out of KVM_RUN too, but its state is not a
        // guest's to save or move.
        self.check_health()
    }
    fn is_running(&self) -> bool {
        self.running
    }
    fn check_health(&self) -> Result<(), VmError> {
        for (i, v) in self.vcpus.iter().enumerate() {
            if let Some(reason) = v.failure() {
                return Err(VmError::VcpuFailed {
                    vcpu: i as u32,
                    reason,
                });
            }
        }
        match self.io.iter().find_map(IoThread::failure) {
            Some(why) => Err(VmError::Guest(why)),
            None => Ok(()),
        }
    }
    fn dirty_sources(&mut self) -> &mut [Box<dyn DirtySource>] {
        &mut self.sources
    }
    fn handover_fds(&self) -> Vec<(String, std::os::fd::RawFd)> {
        (0..)
            .zip(&self.disk_fds)
            .map(|(i, &fd)| (disk_fd_name(i), fd))
            .collect()
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
        HostCpu::probe(&kvm, &self.vcpus[0].fd())
            .and_then(|host| host.without(&self.cpu_without))
            .and_then(|host| host.check(&guest))
            .map_err(refuse)
    }
    fn output_gate(&mut self) -> Option<&mut dyn OutputGate> {
        // A disk served on the vCPU's own exit (`--notify inline`) has no
        // I/O thread to hold.
        if self.no_output_gate || self.io.len() < self.devices.blks.len() {
            return None;
        }
        Some(self)
    }
    fn time_throttle(&mut self) -> Option<&mut dyn TimeThrottle> {
        Some(self)
    }
    fn dirty_meter(&mut self) -> Option<&mut dyn DirtyMeter> {
        match self.metered {
            true => Some(self),
            false => None,
        }
    }
    fn vcpu_state(&mut self) -> Option<&mut dyn VcpuState> {
        Some(self)
    }
    /// One instance of each device per vCPU; the disk's `notify`
    /// subsection goes only when a notification waits unserved.
    fn state_sections(&self) -> Vec<SectionSpec> {
        let instances: Vec<u32> = (0..self.config.vcpus).collect();
        let mut specs = vec![
            SectionSpec::new(serial::SECTION, serial::VERSION, 1).with_instances(instances.clone()),
            SectionSpec::new(blk::SECTION, self.config.blk_version, 1)
                .with_subsection(blk::NOTIFY_SUBSECTION)
                .with_instances(instances),
        ];
        if self.config.fill {
            specs.push(SectionSpec::new(fill::SECTION, fill::VERSION, 1));
        }
        specs
    }
    fn save_sections(&mut self) -> Result<Vec<Section>, VmError> {
        let consoles = (0..).zip(&self.devices.consoles);
        let blks = (0..).zip(&self.devices.blks);
        let mut sections: Vec<Section> = consoles
            .map(|(i, c)| Section::new(serial::SECTION, lock(c).save()).instance(i))
            .chain(blks.map(|(i, b)| lock(b).save(i)))
            .collect();
        if let Some(fill) = &self.devices.fill {
            let saved = lock(fill).save().map_err(|e| VmError::BadSection {
                section: fill::SECTION.into(),
                reason: e.to_string(),
            })?;
            sections.push(saved);
        }
        Ok(sections)
    }
    /// The fill backend takes part in a postcopy: it maps guest memory
    /// with a userfaultfd of its own, which the engine serves.
    fn device_userfaultfds(&mut self) -> Result<Vec<DeviceUserfaultfd>, VmError> {
        let Some(fill) = &self.devices.fill else {
            return Ok(Vec::new());
        };
        let uffd = lock(fill)
            .postcopy_userfaultfd()
            .map_err(|e| VmError::Guest(format!("the fill device's postcopy: {e}")))?;
        Ok(vec![uffd])
    }
    fn migration_event(&mut self, event: Lifecycle<'_>) {
        // Every page is in (or the migration is over): the backend drops
        // its userfaultfd.
        if let (Some(fill), Lifecycle::Completed | Lifecycle::Aborted(_)) =
            (&self.devices.fill, event)
        {
            lock(fill).end_postcopy();
        }
    }
    fn restore_sections(&mut self, sections: &[Section]) -> Result<(), VmError> {
        for s in sections {
            let i = s.id.instance as usize;
            let missing = || crate::DeviceError::State {
                section: "instances",
                why: format!("{} has no instance {i} here", s.id.name),
            };
            let loaded = match s.id.name.as_str() {
                serial::SECTION => self
                    .devices
                    .consoles
                    .get(i)
                    .ok_or_else(missing)
                    .and_then(|c| lock(c).restore(&s.data)),
                blk::SECTION => self
                    .devices
                    .blks
                    .get(i)
                    .ok_or_else(missing)
                    .and_then(|b| lock(b).restore(s)),
                fill::SECTION => match &self.devices.fill {
                    Some(f) => lock(f).restore(s),
                    None => Err(missing()),
                },
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
        self.snapshot()?.encode().map_err(Self::state_error)
    }
    fn saves_compact(&self) -> bool {
        true
    }
    fn save_vcpus_compact(&mut self) -> Result<Vec<u8>, VmError> {
        self.snapshot()?.encode_compact().map_err(Self::state_error)
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
        if snap.vcpus.len() != self.vcpus.len() {
            return Err(VmError::BadVcpuState(format!(
                "state for {} vCPUs, this VM has {}",
                snap.vcpus.len(),
                self.vcpus.len()
            )));
        }
        let cx = self.context();
        snap.check_fits(self.chips(), &cx)
            .map_err(Self::state_error)?;
        cpu_state::vm_level::restore(&self.vm, &snap.vm)
            .map_err(|e| Self::state_error(e.into()))?;
        for ((i, v), saved) in (0..).zip(&self.vcpus).zip(&snap.vcpus) {
            cpu_state::restore_vcpu(i, &v.fd(), &cx, saved).map_err(Self::state_error)?;
        }
        self.cpu.profile = CpuProfile::new(&snap.vcpus[0].cpuid, &self.cpu.msrs);
        Ok(())
    }
}

impl MiniVm {
    /// The VM's throttle thread, started on first use.
    fn throttler(&mut self) -> Result<&Throttler, VmError> {
        if self.throttler.is_none() {
            let vcpus = self.vcpus.iter().map(Vcpu::throttled).collect();
            let started = Throttler::start(vcpus).map_err(|e| VmError::Operation {
                backend: VMM_ID.into(),
                what: "start the throttle thread".into(),
                source: Some(Box::new(e)),
            })?;
            self.throttler = Some(started);
        }
        Ok(self.throttler.as_ref().expect("started above"))
    }
}

/// Each vCPU runs `100 − percent`% of the time: the throttle thread kicks
/// it out after each slice with its sleep (a Linux guest, its interrupts
/// in the in-kernel irqchip, may not exit on its own for seconds).
impl MiniVm {
    /// What the throttle and KVM_RUN did to each vCPU so far.
    pub fn run_stats(&self) -> Vec<crate::vcpu::RunStats> {
        self.vcpus.iter().map(|v| v.run_stats()).collect()
    }

    /// Handles that sample each vCPU's run statistics from another thread.
    pub fn run_probes(&self) -> Vec<crate::vcpu::RunProbe> {
        self.vcpus.iter().map(|v| v.run_probe()).collect()
    }
}

impl TimeThrottle for MiniVm {
    fn set_time_throttle(&mut self, percent: u8) -> Result<(), VmError> {
        if self.throttler.is_none() && percent == 0 {
            return Ok(());
        }
        self.throttler()?.set_percent(percent);
        Ok(())
    }

    fn throttled(&self) -> Vec<Duration> {
        self.run_stats().iter().map(|r| r.slept).collect()
    }
}

/// Each vCPU's dirty ring meters its writes (only where the VM has rings:
/// [`Vm::dirty_meter`] is `None` otherwise).
impl DirtyMeter for MiniVm {
    fn dirtied(&self) -> Vec<u64> {
        self.vcpus
            .iter()
            .map(|v| {
                v.throttled().ring().map_or(0, |r| {
                    r.collect();
                    r.collected()
                })
            })
            .collect()
    }

    fn set_dirty_quota(&mut self, quota: Option<&Quota>) -> Result<(), VmError> {
        if self.throttler.is_none() && quota.is_none() {
            return Ok(());
        }
        self.throttler()?.set_quota(quota);
        Ok(())
    }

    fn set_dirty_limit(&mut self, bytes_per_sec: Option<u64>) -> Result<(), VmError> {
        if self.throttler.is_none() && bytes_per_sec.is_none() {
            return Ok(());
        }
        self.throttler()?.set_limit(bytes_per_sec);
        Ok(())
    }

    fn guest_entries(&self) -> Option<Vec<GuestEntries>> {
        Some(self.vcpus.iter().map(Vcpu::guest_entries).collect())
    }
}

/// The disks' requests wait in their queues (each I/O thread stays
/// quiesced, its notifications in its eventfd) and the consoles' bytes in
/// their sinks. Only a VM whose disks all have an I/O thread has a gate.
impl OutputGate for MiniVm {
    fn hold(&mut self) -> Result<(), VmError> {
        for c in &self.devices.consoles {
            lock(c).out().hold();
        }
        self.held = true;
        Ok(())
    }

    fn release(&mut self) -> Result<(), VmError> {
        self.held = false;
        if self.running {
            for io in &self.io {
                io.resume();
            }
        }
        for c in &self.devices.consoles {
            lock(c)
                .out()
                .release()
                .map_err(|e| VmError::Guest(format!("the console's held bytes: {e}")))?;
        }
        Ok(())
    }
}

/// The host's CLOCK_REALTIME, in ms since the epoch.
pub fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}
