//! The kit on a small VM of its own, whole and then broken one way at a
//! time: each check must pass on the whole VM and report its breakage,
//! naming the page or section at fault.

use super::*;
use ferry_vm::{
    DirtyLog, DirtyPages, DirtySource, DirtySourceError, Gpa, GuestRam, HarvestStats, SectionSpec,
    SharedDirtyBitmap, VcpuState, PAGE_SIZE,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TOY_VMM: &str = "conformance-toy";
/// Two 2 MiB regions with a 2 MiB hole between them.
const REGIONS: [(Gpa, u64); 2] = [(Gpa(0), 2 << 20), (Gpa(4 << 20), 2 << 20)];
/// The page the toy guest's vCPU bumps its counter in while it runs.
const HEARTBEAT: Gpa = Gpa(PAGE_SIZE as u64);
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// One way to break the toy VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Breakage {
    None,
    /// The device's dirty source drops the last frame of RAM.
    SourceDropsPage,
    /// `pause` reports the VM paused and leaves its vCPU writing.
    PauseLeavesWriter,
    /// `restore_sections` loses the uart's scratch register.
    RestoreLosesField,
    /// The destination's spec loads every version of the uart.
    LoadsEveryVersion,
    /// `restore_vcpus` loses the vCPU's position.
    VcpuRestoreLoses,
    /// Saving the sections writes a page behind every log's back.
    UntrackedWriteOnSave,
}

/// The toy VMM: it builds toy VMs broken as it says.
struct Toy(Breakage);

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
struct Uart {
    lcr: u8,
    scratch: u8,
}

/// What the vCPU thread shares with its VM.
struct Cpu {
    stop: AtomicBool,
    /// The vCPU's "register": its counter, its whole state.
    position: AtomicU64,
    /// Frames it is asked to write, and how many of its requests are done.
    queue: Mutex<Vec<Gfn>>,
    done: AtomicU64,
    /// Its "hardware" dirty log, as a CPU's dirty bits or PML would be.
    log: SharedDirtyBitmap,
    /// Whether the log is on.
    logging: AtomicBool,
}

struct ToyVm {
    breakage: Breakage,
    ram: Arc<GuestRam>,
    cpu: Arc<Cpu>,
    worker: Option<JoinHandle<()>>,
    running: bool,
    uart: Uart,
    device: Arc<Device>,
    sources: Vec<Box<dyn DirtySource>>,
    queued: u64,
    /// Built by [`VmmUnderTest::destination`].
    destination: bool,
}

/// A device that writes guest memory through its own mapping and keeps
/// its own log.
struct Device {
    log: SharedDirtyBitmap,
}

struct DeviceLog {
    device: Arc<Device>,
    drops: Option<Gfn>,
}

impl DirtySource for DeviceLog {
    fn name(&self) -> &str {
        "toy-device"
    }
    fn start(&mut self) -> Result<(), DirtySourceError> {
        self.device.log.clear();
        Ok(())
    }
    fn collect(&mut self, into: &mut DirtyPages) -> Result<(), DirtySourceError> {
        let mut mine = DirtyPages::new(into.pages());
        self.device.log.harvest_into(&mut mine);
        for gfn in mine.iter().filter(|g| Some(*g) != self.drops) {
            into.set(gfn);
        }
        Ok(())
    }
    fn stop(&mut self) {}
}

/// Adds 1 to the u64 at the start of `gfn` through the host mapping, as
/// a vCPU or a device's DMA would: no dirty bitmap sees it.
fn bump_behind_ram(ram: &GuestRam, gfn: Gfn) {
    let slot = ram
        .slots()
        .iter()
        .find(|s| (s.first_gfn().0..s.first_gfn().0 + s.pages()).contains(&gfn.0))
        .expect("the kit writes only frames of RAM");
    let host = ram.host_address(slot) as usize + (gfn.0 - slot.first_gfn().0) as usize * PAGE_SIZE;
    // SAFETY: `host` is the page-aligned start of a frame inside `slot`'s
    // mapping, which `ram` keeps mapped while the caller holds it; every
    // access to this word is atomic.
    let word = unsafe { AtomicU64::from_ptr(host as *mut u64) };
    word.fetch_add(1, Ordering::AcqRel);
}

fn vcpu(ram: Arc<GuestRam>, cpu: Arc<Cpu>) {
    while !cpu.stop.load(Ordering::Acquire) {
        let asked: Vec<Gfn> = std::mem::take(&mut *cpu.queue.lock().unwrap());
        for &gfn in asked.iter().chain(std::iter::once(&HEARTBEAT.gfn())) {
            bump_behind_ram(&ram, gfn);
            if cpu.logging.load(Ordering::Acquire) {
                cpu.log.mark(gfn);
            }
        }
        cpu.done.fetch_add(asked.len() as u64, Ordering::AcqRel);
        cpu.position.fetch_add(1, Ordering::AcqRel);
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl ToyVm {
    fn new(breakage: Breakage) -> Result<Self, VmError> {
        let ram = Arc::new(GuestRam::with_regions(
            &REGIONS,
            ferry_vm::Backing::Anonymous,
        )?);
        let pages = ram.pages();
        let device = Arc::new(Device {
            log: SharedDirtyBitmap::new(pages),
        });
        let drops = (breakage == Breakage::SourceDropsPage).then(|| Gfn(pages - 1));
        Ok(ToyVm {
            breakage,
            cpu: Arc::new(Cpu {
                stop: AtomicBool::new(false),
                position: AtomicU64::new(0),
                queue: Mutex::default(),
                done: AtomicU64::new(0),
                log: SharedDirtyBitmap::new(pages),
                logging: AtomicBool::new(false),
            }),
            ram,
            worker: None,
            running: false,
            uart: Uart { lcr: 0, scratch: 0 },
            sources: vec![Box::new(DeviceLog {
                device: Arc::clone(&device),
                drops,
            })],
            device,
            queued: 0,
            destination: false,
        })
    }

    fn is_region_end(&self, gfn: Gfn) -> bool {
        self.ram
            .slots()
            .iter()
            .any(|s| s.first_gfn().0 + s.pages() - 1 == gfn.0)
    }
}

impl Vm for ToyVm {
    fn vmm_id(&self) -> &str {
        TOY_VMM
    }
    fn ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }
    fn start(&mut self) -> Result<(), VmError> {
        if self.worker.is_none() {
            self.cpu.stop.store(false, Ordering::Release);
            let (ram, cpu) = (Arc::clone(&self.ram), Arc::clone(&self.cpu));
            self.worker = Some(std::thread::spawn(move || vcpu(ram, cpu)));
        }
        self.running = true;
        Ok(())
    }
    fn pause(&mut self) -> Result<(), VmError> {
        self.running = false;
        if self.breakage == Breakage::PauseLeavesWriter {
            return Ok(());
        }
        self.cpu.stop.store(true, Ordering::Release);
        match self.worker.take().map(JoinHandle::join) {
            Some(Err(_)) => Err(VmError::VcpuFailed {
                vcpu: 0,
                reason: "panicked".into(),
            }),
            _ => Ok(()),
        }
    }
    fn is_running(&self) -> bool {
        self.running
    }
    fn state_sections(&self) -> Vec<SectionSpec> {
        if self.destination && self.breakage == Breakage::LoadsEveryVersion {
            return vec![SectionSpec::new("uart", u32::MAX, 0)];
        }
        vec![SectionSpec::new("uart", 2, 1)]
    }
    fn save_sections(&mut self) -> Result<Vec<Section>, VmError> {
        if self.breakage == Breakage::UntrackedWriteOnSave {
            bump_behind_ram(&self.ram, Gfn(3));
        }
        Ok(vec![Section::encode("uart", &self.uart)?])
    }
    fn restore_sections(&mut self, sections: &[Section]) -> Result<(), VmError> {
        for s in sections {
            let uart: Uart = s.decode()?;
            self.uart = match self.breakage {
                Breakage::RestoreLosesField => Uart { scratch: 0, ..uart },
                _ => uart,
            };
        }
        Ok(())
    }
    fn dirty_log(&mut self) -> Option<&mut dyn DirtyLog> {
        Some(self)
    }
    fn dirty_sources(&mut self) -> &mut [Box<dyn DirtySource>] {
        &mut self.sources
    }
    fn vcpu_state(&mut self) -> Option<&mut dyn VcpuState> {
        Some(self)
    }
}

impl DirtyLog for ToyVm {
    fn method(&self) -> ferry_vm::DirtyLogMethod {
        ferry_vm::DirtyLogMethod::Other("toy".into())
    }
    fn start_dirty_log(&mut self) -> Result<(), VmError> {
        self.cpu.log.clear();
        self.cpu.logging.store(true, Ordering::Release);
        Ok(())
    }
    fn harvest_dirty(&mut self, into: &mut DirtyPages) -> Result<HarvestStats, VmError> {
        let pages = self.cpu.log.harvest_into(into);
        Ok(HarvestStats {
            pages,
            ..HarvestStats::default()
        })
    }
    fn stop_dirty_log(&mut self) -> Result<(), VmError> {
        self.cpu.logging.store(false, Ordering::Release);
        Ok(())
    }
}

impl VcpuState for ToyVm {
    fn save_vcpus(&mut self) -> Result<Vec<u8>, VmError> {
        Ok(self
            .cpu
            .position
            .load(Ordering::Acquire)
            .to_le_bytes()
            .to_vec())
    }
    fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), VmError> {
        let bytes: [u8; 8] = state
            .try_into()
            .map_err(|_| VmError::BadVcpuState(format!("{} bytes, not 8", state.len())))?;
        if self.breakage != Breakage::VcpuRestoreLoses {
            self.cpu
                .position
                .store(u64::from_le_bytes(bytes), Ordering::Release);
        }
        Ok(())
    }
}

impl Drop for ToyVm {
    fn drop(&mut self) {
        self.cpu.stop.store(true, Ordering::Release);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl VmmUnderTest for Toy {
    type Vm = ToyVm;
    fn label(&self) -> String {
        format!("{TOY_VMM} ({:?})", self.0)
    }
    fn source(&mut self) -> Result<ToyVm, VmError> {
        let mut vm = ToyVm::new(self.0)?;
        vm.uart = Uart {
            lcr: 3,
            scratch: 0x5a,
        };
        Ok(vm)
    }
    fn destination(&mut self, _source_config: &serde_json::Value) -> Result<ToyVm, VmError> {
        let mut vm = ToyVm::new(self.0)?;
        vm.destination = true;
        Ok(vm)
    }
    /// The last page of each region goes by the device, the rest by the
    /// vCPU.
    fn write_pages(&mut self, vm: &mut ToyVm, pages: &[Gfn]) -> Result<(), VmError> {
        let (by_device, by_cpu): (Vec<Gfn>, Vec<Gfn>) =
            pages.iter().partition(|&&g| vm.is_region_end(g));
        for &gfn in &by_device {
            bump_behind_ram(&vm.ram, gfn);
            vm.device.log.mark(gfn);
        }
        vm.queued += by_cpu.len() as u64;
        vm.cpu.queue.lock().unwrap().extend(by_cpu);
        let until = Instant::now() + WRITE_DEADLINE;
        while vm.cpu.done.load(Ordering::Acquire) < vm.queued {
            if Instant::now() >= until {
                return Err(VmError::Guest("the vCPU did not write in 10 s".into()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
    fn same_state(&self, saved: Saved<'_>, resaved: Saved<'_>) -> bool {
        saved == resaved
    }
}

fn failed(check: Check, breakage: Breakage) -> String {
    match check.run(&mut Toy(breakage)) {
        Err(f) => {
            assert_eq!(f.check, check);
            let text = f.to_string();
            assert!(
                text.contains(&format!("{TOY_VMM} ({breakage:?})")),
                "{text}"
            );
            text
        }
        Ok(v) => panic!("{check} on a VM broken by {breakage:?}: {v:?}"),
    }
}

#[test]
fn a_whole_vm_passes_every_check() {
    let report = run_all(&mut Toy(Breakage::None));
    assert!(report.result().is_ok(), "{report}");
    assert_eq!(report.skipped().count(), 0, "{report}");
    assert_eq!(report.outcomes.len(), Check::ALL.len());
}

#[test]
fn a_dirty_source_that_drops_a_page_is_named() {
    let text = failed(Check::DirtyPages, Breakage::SourceDropsPage);
    // The last frame of RAM: region 1's last page.
    assert!(
        text.contains("1 of the 32 pages")
            && text.contains("frame 0x5ff (region 1 at 0x400000, page 511 of 512, its last page)"),
        "{text}"
    );
}

#[test]
fn a_pause_that_leaves_a_writer_running_is_caught_in_memory() {
    let text = failed(Check::PauseStopsMemory, Breakage::PauseLeavesWriter);
    assert!(
        text.contains("after pause() returned (is_running() says false)")
            && text.contains("frame 0x1 (region 0 at 0x0, page 1 of 512)"),
        "{text}"
    );
}

#[test]
fn a_restore_that_loses_a_field_is_named() {
    let text = failed(Check::SectionsRoundTrip, Breakage::RestoreLosesField);
    assert!(
        text.contains("section 'uart' instance 0 v2") && text.contains("first different at byte"),
        "{text}"
    );
}

#[test]
fn a_destination_that_loads_every_version_cannot_refuse_one() {
    let text = failed(Check::SectionVersions, Breakage::LoadsEveryVersion);
    assert!(text.contains("section 'uart'"), "{text}");
}

#[test]
fn a_vcpu_restore_that_loses_state_is_caught() {
    let text = failed(Check::VcpuStateRoundTrip, Breakage::VcpuRestoreLoses);
    assert!(
        text.contains("vCPU state differs: first different at byte 0"),
        "{text}"
    );
}

#[test]
fn a_write_no_log_sees_fails_the_loopback_migration() {
    let text = failed(Check::LoopbackMigration, Breakage::UntrackedWriteOnSave);
    assert!(text.contains("digest"), "{text}");
}

#[test]
fn a_write_no_log_sees_fails_the_snapshot_at_its_pause() {
    let text = failed(Check::SnapshotRoundTrip, Breakage::UntrackedWriteOnSave);
    assert!(
        text.contains("the live snapshot failed") && text.contains("escaped the dirty logs"),
        "{text}"
    );
}

#[test]
fn a_vm_without_sections_or_vcpu_state_is_skipped_not_passed() {
    /// The toy VMM, its VMs without sections or vCPU state.
    struct Bare(Toy);
    struct BareVm(ToyVm);
    impl Vm for BareVm {
        fn vmm_id(&self) -> &str {
            self.0.vmm_id()
        }
        fn ram(&self) -> &Arc<GuestRam> {
            self.0.ram()
        }
        fn start(&mut self) -> Result<(), VmError> {
            self.0.start()
        }
        fn pause(&mut self) -> Result<(), VmError> {
            self.0.pause()
        }
        fn is_running(&self) -> bool {
            self.0.is_running()
        }
        fn dirty_log(&mut self) -> Option<&mut dyn DirtyLog> {
            self.0.dirty_log()
        }
        fn dirty_sources(&mut self) -> &mut [Box<dyn DirtySource>] {
            self.0.dirty_sources()
        }
    }
    impl VmmUnderTest for Bare {
        type Vm = BareVm;
        fn label(&self) -> String {
            "bare toy".into()
        }
        fn source(&mut self) -> Result<BareVm, VmError> {
            self.0.source().map(BareVm)
        }
        fn destination(&mut self, c: &serde_json::Value) -> Result<BareVm, VmError> {
            self.0.destination(c).map(BareVm)
        }
        fn write_pages(&mut self, vm: &mut BareVm, pages: &[Gfn]) -> Result<(), VmError> {
            self.0.write_pages(&mut vm.0, pages)
        }
    }
    let report = run_all(&mut Bare(Toy(Breakage::None)));
    let skipped: Vec<Check> = report.skipped().map(|(c, _)| c).collect();
    assert_eq!(
        skipped,
        [
            Check::SectionsRoundTrip,
            Check::SectionVersions,
            Check::VcpuStateRoundTrip
        ],
        "{report}"
    );
    assert!(
        report
            .to_string()
            .contains("SKIP vCPU state round trip (bare toy): the VM declares no VcpuState"),
        "{report}"
    );
    assert!(report.result().is_ok(), "{report}");
}
