//! A small but real test VM that is not memstress: one "vCPU" thread walks
//! the data slot writing stamps through `GuestRam` (so every write is
//! tracked through the VMM-dirty bitmap) and checks, before each write, that
//! the page still holds the stamp of the previous pass. Its "vCPU state" is
//! the walk position, so a migrated guest continues where the source stopped
//! and any lost page shows up as a mismatch. Its counters sit in its own
//! system page and reach the engine only through [`TestProbe`].
//!
//! ```text
//!   slot 0 (2 MiB, mostly zero): 0x00 passes completed   0x08 mismatches   0x10 built-by-VMM marker
//!   (a hole of `hole_bytes`, none by default)
//!   slot 1: data pages, one stamp at the start of each
//! ```

#![allow(dead_code)]

pub mod big_device;
pub mod record;
pub mod relay;

use ferry_engine::vmm::StreamHeader;
use ferry_engine::{
    await_migration, listen, receive, MigrationError, PrecopyOptions, ReceiveOptions,
    ReceiveSummary, TcpDialer,
};
use ferry_vm::{
    Backing, Blocker, DirtyLog, DirtyPages, DirtySource, DirtySourceError, Gfn, Gpa, GuestCheck,
    GuestProbe, GuestRam, HarvestStats, ProbeError, Section, SectionSpec, SharedDirtyBitmap,
    Subsection, TimeThrottle, VcpuState, Vm, VmError, PAGE_SIZE,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub type Received = Result<(Box<dyn Vm>, ReceiveSummary), MigrationError>;

/// The VMM id of the test VM.
pub const TEST_VMM: &str = "engine-test-vm";
const PASSES: Gpa = Gpa(0);
const MISMATCHES: Gpa = Gpa(8);
const MARKER: Gpa = Gpa(16);
/// Bytes of the system slot (slots are whole 2 MiB).
const SYSTEM_BYTES: u64 = 2 << 20;

/// The test VM's configuration: what its stream header carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestConfig {
    /// Bytes of the data slot.
    pub data_bytes: u64,
    /// Bytes of the hole between the system slot and the data slot.
    #[serde(default)]
    pub hole_bytes: u64,
    /// Host backing of its memory (each end picks its own; not sent).
    #[serde(skip)]
    pub backing: Backing,
}

impl TestConfig {
    /// Data pages.
    pub fn pages(&self) -> u64 {
        self.data_bytes / PAGE_SIZE as u64
    }

    /// Guest-physical address of data page `page`.
    pub fn data_gpa(&self, page: u64) -> Gpa {
        Gpa(SYSTEM_BYTES + self.hole_bytes + page * PAGE_SIZE as u64)
    }

    /// Guest pages in all.
    pub fn total_pages(&self) -> u64 {
        self.pages() + SYSTEM_BYTES / PAGE_SIZE as u64
    }

    /// The memory regions: the system slot, a hole, the data slot.
    pub fn regions(&self) -> [(Gpa, u64); 2] {
        [(Gpa(0), SYSTEM_BYTES), (self.data_gpa(0), self.data_bytes)]
    }
}

/// The stamp the test guest writes into `page` in `pass`.
pub fn test_stamp(page: u64, pass: u64) -> u64 {
    0x7e57_0000_0000_0000 | pass << 24 | page
}

/// The test guest's own checks, as the engine reads them.
#[derive(Debug)]
pub struct TestProbe;

impl GuestProbe for TestProbe {
    fn read(&self, vm: &dyn Vm) -> Result<GuestCheck, ProbeError> {
        let ram = vm.ram();
        Ok(GuestCheck {
            progress: ram.load_u64(PASSES)?,
            errors: ram.load_u64(MISMATCHES)?,
        })
    }
}

/// The test guest's checks now.
pub fn check(vm: &dyn Vm) -> GuestCheck {
    TestProbe.read(vm).unwrap()
}

/// A test VM whose guest thread is running and has written every page
/// once (so a full pass sends data, not zero pages, even on a loaded host).
pub fn running_source() -> TestVm {
    let mut vm = TestVm::new(&config()).unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    vm
}

/// A [`running_source`] with a device that rewrites the same 64 frames
/// between any two harvests, as a NIC's receive ring does: no precopy
/// round finds nothing dirty, however little CPU the guest thread gets on
/// a loaded machine, so a zero downtime target never converges.
pub fn churning_source() -> TestVm {
    let mut vm = running_source();
    vm.sources.push(Box::new(Churn {
        first: config().data_gpa(0).gfn(),
        pages: 64,
    }));
    vm
}

/// The device of [`churning_source`]: it reports its frames dirty at every
/// collection (resending them is harmless: their contents stand).
struct Churn {
    first: Gfn,
    pages: u64,
}

impl DirtySource for Churn {
    fn name(&self) -> &str {
        "test-churn"
    }
    fn start(&mut self) -> Result<(), DirtySourceError> {
        Ok(())
    }
    fn collect(&mut self, into: &mut DirtyPages) -> Result<(), DirtySourceError> {
        for i in 0..self.pages {
            into.set(Gfn(self.first.0 + i));
        }
        Ok(())
    }
    fn stop(&mut self) {}
}

/// Waits (at most 30 s) until the guest of `vm` has completed `passes`.
pub fn wait_for_passes(vm: &dyn Vm, passes: u64) {
    ferry_harness::guest::wait_for_passes(vm, passes, Duration::from_secs(30), |vm| {
        vec![check(vm).progress]
    });
}

/// A destination in a thread, listening on loopback; returns how to reach it.
pub fn spawn_receiver(opts: ReceiveOptions) -> (TcpDialer, JoinHandle<Received>) {
    spawn_receiver_on(opts, Backing::Anonymous)
}

/// [`spawn_receiver`] with the destination's guest RAM on `backing`. Once
/// `receive` returns a running guest, the thread runs it until it has
/// completed another pass here, and fills the summary's guest fields from
/// the probe, as a VMM that checks its guest does. A guest that counts a
/// mismatch after the switchover fails the test here (the thread panics).
pub fn spawn_receiver_on(
    opts: ReceiveOptions,
    backing: Backing,
) -> (TcpDialer, JoinHandle<Received>) {
    spawn_receiver_with(opts, backing, |_| {})
}

/// [`spawn_receiver_on`], with `build` changing the destination VM after
/// its factory made it (its devices, say).
pub fn spawn_receiver_with(
    opts: ReceiveOptions,
    backing: Backing,
    build: impl Fn(&mut TestVm) + Send + 'static,
) -> (TcpDialer, JoinHandle<Received>) {
    let listener = listen("127.0.0.1:0").unwrap();
    let to = TcpDialer(listener.local_addr().unwrap().to_string());
    let dest = std::thread::spawn(move || {
        let incoming = await_migration(&listener, None)?;
        let mut create = |h: &StreamHeader| -> Result<Box<dyn Vm>, VmError> {
            let mut vm = TestVm::new(&TestVm::config_from(h, backing)?)?;
            build(&mut vm);
            Ok(Box::new(vm) as Box<dyn Vm>)
        };
        let (vm, mut summary) = receive(incoming, &listener, &mut create, &opts)?;
        if let (Some(at_resume), true) = (summary.guest_at_resume, vm.is_running()) {
            wait_for_passes(&*vm, at_resume.progress + 1);
            let after = check(&*vm).since(&at_resume);
            summary.passes_after = Some(after.progress);
            summary.mismatches_after = Some(after.errors);
            assert_eq!(after.errors, 0, "the guest counted mismatches here");
        }
        Ok((vm, summary))
    });
    (to, dest)
}

/// Skips (with a line saying so) where userfaultfd is unavailable.
pub fn uffd_available(test: &str) -> bool {
    let ram = ferry_vm::GuestRam::new(&[2 << 20], ferry_vm::Backing::Anonymous).unwrap();
    match ferry_vm::uffd::Placer::register_for_faults(&ram) {
        Ok(_) => true,
        Err(e) => {
            ferry_vm::skip!("SKIP {test}: userfaultfd is unavailable here ({e})");
            false
        }
    }
}

/// Builds a destination test VM from a stream header.
pub fn create_test_vm(h: &StreamHeader) -> Result<Box<dyn Vm>, VmError> {
    TestVm::boxed(&TestVm::config_from(h, Backing::Anonymous)?)
}

/// Destination options with the test guest's probe.
pub fn quick_receive() -> ReceiveOptions {
    {
        let mut o = ReceiveOptions::default();
        o.probe = Some(Arc::new(TestProbe));
        o
    }
}

/// Source options with the test guest's probe.
pub fn probed() -> PrecopyOptions {
    {
        let mut o = PrecopyOptions::default();
        o.probe = Some(Arc::new(TestProbe));
        o
    }
}

pub fn config() -> TestConfig {
    TestConfig {
        data_bytes: 4 << 20,
        hole_bytes: 0,
        backing: Backing::Anonymous,
    }
}

pub struct TestVm {
    config: TestConfig,
    ram: Arc<GuestRam>,
    /// pass << 32 | next page
    position: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    /// Percent of its time the guest thread sleeps (time throttling).
    throttle: Arc<AtomicU64>,
    /// The guest stops writing once it reaches this pass.
    last_pass: Arc<AtomicU64>,
    pub logging: bool,
    /// The guest stores its pass counter as a vCPU would, behind
    /// GuestRam's back, so that only the VM's own dirty log reports that
    /// page (the default); off, through GuestRam like every other write.
    pub hardware_log: bool,
    /// Set by the guest each time it stores its pass counter behind
    /// GuestRam's back; the dirty log reports the page and clears it.
    passes_written: Arc<AtomicBool>,
    /// Write a page after the final harvest, so the digest must catch it.
    pub untracked_write_on_save: bool,
    /// The devices: what they save and load.
    pub devices: Devices,
    /// A device that writes guest memory behind the VMM's back, from the
    /// guest's own thread (so it stops when the VM pauses).
    pub dma: Option<Arc<Dma>>,
    /// The dirty sources the engine collects.
    pub sources: Vec<Box<dyn DirtySource>>,
    /// The lifecycle events the engine told it, in order.
    pub events: Arc<Mutex<Vec<String>>>,
    /// Refuse any vCPU state (a destination that fails to load).
    pub fail_restore: bool,
    /// What its devices say blocks a migration.
    pub blockers: Vec<Blocker>,
    /// A device with large state sent live.
    pub big: Option<big_device::BigDevice>,
    /// Pages the guest is asked to write besides its walk (the conformance
    /// kit's).
    requests: Arc<WriteRequests>,
    /// An output gate ([`ferry_vm::OutputGate`]), if set: `hold`, `start`
    /// and `release` go into `events` as they happen.
    pub output_gate: bool,
    /// Files the VMM hands a same-host destination by name
    /// (`Vm::handover_fds`), as a VMM hands its disks.
    pub handed: Vec<(String, std::fs::File)>,
    /// A device that maps guest memory (memfd) a second time with a
    /// userfaultfd of its own, as a vhost-user backend does in its
    /// process: made when the engine asks for `device_userfaultfds`, and
    /// then its mapping here.
    pub device_mapping: Option<Arc<Mutex<Option<Arc<GuestRam>>>>>,
}

/// Pages the guest is asked to write, served from its own thread, and how
/// many it has written.
#[derive(Default)]
struct WriteRequests {
    pending: Mutex<Vec<Gfn>>,
    asked: AtomicU64,
    done: AtomicU64,
}

/// Where in a page the guest writes what it is asked to: clear of the
/// stamps it checks and of the system slot's counters.
const ASKED_OFFSET: u64 = 2048;
/// How long [`TestVm::write_pages`] waits for the guest.
const ASKED_DEADLINE: Duration = Duration::from_secs(10);

/// A device that writes one page of the system slot by DMA: through the raw
/// host mapping, which no dirty bitmap sees, and then marks its own log.
pub struct Dma {
    /// The frame it writes.
    pub gfn: Gfn,
    log: SharedDirtyBitmap,
}

impl Dma {
    /// A device writing frame 5 of a VM with `pages` frames.
    pub fn new(pages: u64) -> Arc<Self> {
        Arc::new(Dma {
            gfn: Gfn(5),
            log: SharedDirtyBitmap::new(pages),
        })
    }

    /// Writes `value` at the start of its page, untracked, then logs it.
    fn write(&self, ram: &GuestRam, value: u64) {
        self.write_at(ram, self.gpa(), value);
    }

    /// The guest-physical address of its page.
    fn gpa(&self) -> Gpa {
        self.gfn.gpa()
    }

    /// Writes `value` at `gpa` (8-aligned, in RAM), untracked, then logs
    /// its frame.
    fn write_at(&self, ram: &GuestRam, gpa: Gpa, value: u64) {
        let slot = ram
            .slots()
            .iter()
            .find(|s| gpa.0 >= s.gpa.0 && gpa.0 + 8 <= s.gpa.0 + s.size)
            .expect("the device writes only RAM");
        assert!(gpa.0.is_multiple_of(8));
        let host = ram.host_address(slot) as usize + (gpa.0 - slot.gpa.0) as usize;
        // SAFETY: the aligned word lies in the slot's mapping (found above),
        // which `ram` keeps alive; the store races only with the engine's
        // byte reads, as a device's DMA would.
        unsafe { std::ptr::write_volatile(host as *mut u64, value) };
        self.log.mark(gpa.gfn());
    }
}

/// The [`Dma`] device's dirty log as the engine sees it; `broken` makes it
/// one that cannot report.
pub struct DmaSource {
    pub dma: Arc<Dma>,
    pub broken: bool,
}

impl DirtySource for DmaSource {
    fn name(&self) -> &str {
        "test-dma"
    }
    fn start(&mut self) -> Result<(), DirtySourceError> {
        if self.broken {
            return Err(DirtySourceError::CannotReport(
                "the device has no dirty log".into(),
            ));
        }
        self.dma.log.clear();
        Ok(())
    }
    fn collect(&mut self, into: &mut DirtyPages) -> Result<(), DirtySourceError> {
        self.dma.log.harvest_into(into);
        Ok(())
    }
    fn stop(&mut self) {}
}

/// The test VM's devices: state sections and nothing else.
#[derive(Clone, Default)]
pub struct Devices {
    /// The sections this VM saves and loads.
    pub specs: Vec<SectionSpec>,
    /// Send each spec's subsections (they are "needed").
    pub subsections_needed: bool,
    /// A subsection no spec names, sent with the first section.
    pub extra_subsection: Option<String>,
    /// Saving writes this value at this address (a device flushing what it
    /// holds into guest memory), through the VMM's tracked writes.
    pub save_writes: Option<(Gpa, u64)>,
    /// What the destination loaded.
    pub restored: Arc<Mutex<Vec<Section>>>,
    /// Pad each section's data to this many bytes, with bytes that do not
    /// repeat (a device with large state: a GPU's, a VFIO device's).
    pub payload_bytes: usize,
}

pub use ferry_vm::synthetic::noise;

impl Devices {
    /// What a VM with these devices saves: what they loaded, if they
    /// loaded anything, as a device keeps the state it was given;
    /// otherwise a source's state, made from the specs.
    pub fn save(&self) -> Vec<Section> {
        let restored = self.restored.lock().unwrap();
        if !restored.is_empty() {
            return restored.clone();
        }
        drop(restored);
        let mut all: Vec<Section> = self
            .specs
            .iter()
            .flat_map(|spec| {
                spec.ids().map(|id| Section {
                    data: {
                        let mut data =
                            format!("{} #{} v{}", id.name, id.instance, id.version).into_bytes();
                        if self.payload_bytes > data.len() {
                            let seed = u64::from(id.instance) << 32 | self.payload_bytes as u64;
                            data.extend(noise(seed, self.payload_bytes - data.len()));
                        }
                        data
                    },
                    subsections: if self.subsections_needed {
                        spec.subsections
                            .iter()
                            .map(|name| Subsection {
                                name: name.clone(),
                                data: name.as_bytes().to_vec(),
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                    id,
                })
            })
            .collect();
        if let (Some(extra), Some(first)) = (&self.extra_subsection, all.first_mut()) {
            first.subsections.push(Subsection {
                name: extra.clone(),
                data: vec![1],
            });
        }
        all
    }
}

impl TestVm {
    pub fn new(config: &TestConfig) -> Result<Self, VmError> {
        let ram = GuestRam::with_regions(&config.regions(), config.backing)?;
        // Something for the VMM to have written at build time, as VMMs do.
        ram.store_u64(MARKER, 0xc0de)?;
        Ok(Self::on_ram(config, ram))
    }

    /// A VM on RAM made elsewhere (mapped from another process's files).
    pub fn on_ram(config: &TestConfig, ram: GuestRam) -> Self {
        let ram = Arc::new(ram);
        TestVm {
            config: config.clone(),
            ram,
            position: Arc::new(AtomicU64::new(1 << 32)),
            stop: Arc::new(AtomicBool::new(false)),
            worker: None,
            throttle: Arc::new(AtomicU64::new(0)),
            last_pass: Arc::new(AtomicU64::new(u64::MAX)),
            logging: false,
            hardware_log: true,
            passes_written: Arc::new(AtomicBool::new(false)),
            untracked_write_on_save: false,
            devices: Devices::default(),
            dma: None,
            sources: Vec::new(),
            events: Arc::default(),
            fail_restore: false,
            blockers: Vec::new(),
            big: None,
            requests: Arc::default(),
            output_gate: false,
            handed: Vec::new(),
            device_mapping: None,
        }
    }

    /// Has the running guest write each of `pages` (a counter at byte
    /// [`ASKED_OFFSET`], clear of its stamps), through GuestRam as it
    /// writes everything, except the last page of each region, which its
    /// DMA device writes by its own path if it has one. Returns once all
    /// are written, or fails after 10 s.
    pub fn write_pages(&self, pages: &[Gfn]) -> Result<(), VmError> {
        if let Some(gfn) = pages.iter().find(|g| !self.ram.is_ram(**g)) {
            return Err(VmError::Guest(format!("frame {:#x} is not RAM", gfn.0)));
        }
        let asked = self
            .requests
            .asked
            .fetch_add(pages.len() as u64, Ordering::AcqRel)
            + pages.len() as u64;
        self.requests.pending.lock().unwrap().extend(pages);
        let deadline = Instant::now() + ASKED_DEADLINE;
        while self.requests.done.load(Ordering::Acquire) < asked {
            if Instant::now() >= deadline || self.worker.is_none() {
                return Err(VmError::Guest(format!(
                    "the guest wrote {} of the {} pages asked within {ASKED_DEADLINE:?}{}",
                    self.requests.done.load(Ordering::Acquire),
                    asked,
                    if self.worker.is_none() {
                        " (it is not running)"
                    } else {
                        ""
                    }
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    pub fn boxed(config: &TestConfig) -> Result<Box<dyn Vm>, VmError> {
        Ok(Box::new(Self::new(config)?))
    }

    /// The configuration a stream header describes, on `backing`.
    pub fn config_from(h: &StreamHeader, backing: Backing) -> Result<TestConfig, VmError> {
        if h.vmm != TEST_VMM {
            return Err(VmError::Guest(format!("not a test VM: {}", h.vmm)));
        }
        let config: TestConfig = serde_json::from_value(h.vmm_config.clone())
            .map_err(|e| VmError::Guest(e.to_string()))?;
        Ok(TestConfig { backing, ..config })
    }

    /// Has the guest write `passes` more passes from now, then idle: a page
    /// written in them and lost by the migration is never written again,
    /// so the digest catches it.
    pub fn stop_writing_after(&self, passes: u64) {
        let pass = self.position.load(Ordering::Acquire) >> 32;
        self.last_pass.store(pass + passes, Ordering::Release);
    }

    /// The time throttle, in percent, readable while the VM migrates.
    pub fn throttle_handle(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.throttle)
    }
}

/// Stores `value` at `gpa` (in the system slot) as a vCPU would: through
/// the host mapping, with no VMM-dirty mark.
fn store_behind_ram(ram: &GuestRam, gpa: Gpa, value: u64) {
    let slot = &ram.slots()[0];
    assert!(gpa.0 + 8 <= slot.gpa.0 + slot.size && gpa.0.is_multiple_of(8));
    let host = ram.host_address(slot) as usize + (gpa.0 - slot.gpa.0) as usize;
    // SAFETY: `host` is an 8-aligned address inside the first slot's
    // mapping (checked above), which `ram` keeps mapped while the guest
    // thread holds it; every other access to this word is atomic too.
    let word = unsafe { AtomicU64::from_ptr(host as *mut u64) };
    word.store(value, Ordering::Release);
}

/// Writes what the guest was asked to: through GuestRam, but the last page
/// of each region through `dma` where there is one.
fn serve(requests: &WriteRequests, ram: &GuestRam, dma: Option<&Dma>) {
    let asked = std::mem::take(&mut *requests.pending.lock().unwrap());
    for gfn in &asked {
        let gpa = gfn.gpa().add(ASKED_OFFSET);
        let value = ram.load_u64(gpa).unwrap().wrapping_add(1);
        let region_end = ram
            .slots()
            .iter()
            .any(|s| s.first_gfn().0 + s.pages() - 1 == gfn.0);
        match dma {
            Some(d) if region_end => d.write_at(ram, gpa, value),
            _ => ram.store_u64(gpa, value).unwrap(),
        }
    }
    requests
        .done
        .fetch_add(asked.len() as u64, Ordering::AcqRel);
}

#[allow(clippy::too_many_arguments)]
fn guest(
    ram: Arc<GuestRam>,
    config: TestConfig,
    requests: Arc<WriteRequests>,
    dma: Option<Arc<Dma>>,
    passes_written: Option<Arc<AtomicBool>>,
    position: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    throttle: Arc<AtomicU64>,
    last_pass: Arc<AtomicU64>,
) {
    let pages = config.pages();
    let pos = position.load(Ordering::Acquire);
    let (mut pass, mut page) = (pos >> 32, pos & 0xffff_ffff);
    while !stop.load(Ordering::Acquire) {
        serve(&requests, &ram, dma.as_deref());
        if pass >= last_pass.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let gpa = config.data_gpa(page);
        let expect = if pass <= 1 {
            0
        } else {
            test_stamp(page, pass - 1)
        };
        if ram.load_u64(gpa).unwrap() != expect {
            let m = ram.load_u64(MISMATCHES).unwrap();
            ram.store_u64(MISMATCHES, m + 1).unwrap();
        }
        ram.store_u64(gpa, test_stamp(page, pass)).unwrap();
        if let Some(d) = dma.as_ref().filter(|_| page % 64 == 0) {
            d.write(&ram, pass << 32 | page);
        }
        page += 1;
        if page == pages {
            match &passes_written {
                Some(written) => {
                    store_behind_ram(&ram, PASSES, pass);
                    written.store(true, Ordering::Release);
                }
                None => ram.store_u64(PASSES, pass).unwrap(),
            }
            page = 0;
            pass += 1;
        }
        position.store(pass << 32 | page, Ordering::Release);
        if page % 64 == 0 {
            // 100 µs of rest per 64 pages, stretched by the throttle.
            let pct = throttle.load(Ordering::Relaxed).min(99);
            std::thread::sleep(Duration::from_micros(100 * 100 / (100 - pct)));
        }
    }
}

impl Vm for TestVm {
    fn vmm_id(&self) -> &str {
        TEST_VMM
    }
    fn blockers(&self) -> Vec<Blocker> {
        self.blockers.clone()
    }
    fn handover_fds(&self) -> Vec<(String, std::os::fd::RawFd)> {
        use std::os::fd::AsRawFd;
        self.handed
            .iter()
            .map(|(name, f)| (name.clone(), f.as_raw_fd()))
            .collect()
    }
    fn vmm_config(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).unwrap()
    }
    fn ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }
    fn start(&mut self) -> Result<(), VmError> {
        if self.output_gate {
            self.events.lock().unwrap().push("start".into());
        }
        if self.worker.is_none() {
            self.stop.store(false, Ordering::Release);
            let (ram, pos, stop, throttle, last) = (
                Arc::clone(&self.ram),
                Arc::clone(&self.position),
                Arc::clone(&self.stop),
                Arc::clone(&self.throttle),
                Arc::clone(&self.last_pass),
            );
            let config = self.config.clone();
            let requests = Arc::clone(&self.requests);
            let dma = self.dma.clone();
            let behind = self.hardware_log.then(|| Arc::clone(&self.passes_written));
            self.worker = Some(std::thread::spawn(move || {
                guest(
                    ram, config, requests, dma, behind, pos, stop, throttle, last,
                )
            }));
        }
        if let Some(big) = &mut self.big {
            big.run();
        }
        Ok(())
    }
    fn pause(&mut self) -> Result<(), VmError> {
        if let Some(big) = &mut self.big {
            big.halt();
        }
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.worker.take() {
            w.join().map_err(|_| VmError::VcpuFailed {
                vcpu: 0,
                reason: "panicked".into(),
            })?;
        }
        Ok(())
    }
    fn is_running(&self) -> bool {
        self.worker.is_some()
    }
    fn check_health(&self) -> Result<(), VmError> {
        match &self.worker {
            Some(w) if w.is_finished() => Err(VmError::VcpuFailed {
                vcpu: 0,
                reason: "guest thread exited".into(),
            }),
            _ => Ok(()),
        }
    }
    fn device_userfaultfds(&mut self) -> Result<Vec<ferry_vm::DeviceUserfaultfd>, VmError> {
        let Some(slot) = &self.device_mapping else {
            return Ok(Vec::new());
        };
        let files = self.ram.region_files().ok_or_else(|| {
            VmError::Guest("a device's second mapping needs file-backed RAM".into())
        })?;
        let regions = files
            .iter()
            .map(|(slot, file, offset)| ferry_vm::SharedRegion {
                gpa: slot.gpa,
                size: slot.size,
                file: file.try_clone().expect("dup a memfd"),
                offset: *offset,
            })
            .collect();
        let mapping = Arc::new(GuestRam::from_files(regions, self.config.backing)?);
        let device = ferry_vm::uffd::Placer::register_for_faults(&mapping)
            .and_then(|p| p.into_device("test device"))
            .map_err(|e| VmError::Guest(format!("the device's userfaultfd: {e}")))?;
        *slot.lock().unwrap() = Some(mapping);
        Ok(vec![device])
    }
    fn dirty_sources(&mut self) -> &mut [Box<dyn DirtySource>] {
        &mut self.sources
    }
    fn migration_event(&mut self, event: ferry_vm::Lifecycle<'_>) {
        let name = match event {
            ferry_vm::Lifecycle::Started => "started".to_string(),
            ferry_vm::Lifecycle::Completed => "completed".to_string(),
            ferry_vm::Lifecycle::Aborted(why) => format!("aborted: {why}"),
            other => format!("{other:?}"),
        };
        self.events.lock().unwrap().push(name);
    }
    fn state_sections(&self) -> Vec<SectionSpec> {
        let mut specs = self.devices.specs.clone();
        specs.extend(self.big.as_ref().map(|b| b.spec()));
        specs
    }
    fn live_state(&mut self) -> Option<&mut dyn ferry_vm::LiveState> {
        self.big
            .as_mut()
            .filter(|b| b.live)
            .map(|b| b as &mut dyn ferry_vm::LiveState)
    }
    fn save_sections(&mut self) -> Result<Vec<Section>, VmError> {
        if let Some((gpa, value)) = self.devices.save_writes {
            self.ram.store_u64(gpa, value)?;
        }
        if let Some(dma) = &self.dma {
            // The device flushes as it is saved: after every round.
            dma.write(&self.ram, u64::MAX);
        }
        let mut all = self.devices.save();
        all.extend(self.big.as_ref().map(|b| b.save_rest()));
        Ok(all)
    }
    fn restore_sections(&mut self, sections: &[Section]) -> Result<(), VmError> {
        let mut rest = Vec::new();
        for s in sections {
            match &self.big {
                Some(big) if big.owns(s) => big.restore(s)?,
                _ => rest.push(s.clone()),
            }
        }
        *self.devices.restored.lock().unwrap() = rest;
        Ok(())
    }
    fn dirty_log(&mut self) -> Option<&mut dyn DirtyLog> {
        Some(self)
    }
    fn time_throttle(&mut self) -> Option<&mut dyn TimeThrottle> {
        Some(self)
    }
    fn vcpu_state(&mut self) -> Option<&mut dyn VcpuState> {
        Some(self)
    }
    fn output_gate(&mut self) -> Option<&mut dyn ferry_vm::OutputGate> {
        match self.output_gate {
            true => Some(self),
            false => None,
        }
    }
}

impl ferry_vm::OutputGate for TestVm {
    fn hold(&mut self) -> Result<(), VmError> {
        self.events.lock().unwrap().push("hold".into());
        Ok(())
    }
    fn release(&mut self) -> Result<(), VmError> {
        self.events.lock().unwrap().push("release".into());
        Ok(())
    }
}

/// The "hardware" log: the guest's pass counter, which it stores behind
/// GuestRam's back as a vCPU would (every other write goes through
/// GuestRam, whose bitmap the engine reads itself). It also records whether
/// it runs: the tests check that every migration stops it.
impl DirtyLog for TestVm {
    fn method(&self) -> ferry_vm::DirtyLogMethod {
        ferry_vm::DirtyLogMethod::Other("vmm-bitmap + counter log".into())
    }
    fn start_dirty_log(&mut self) -> Result<(), VmError> {
        self.passes_written.store(false, Ordering::Release);
        self.logging = true;
        Ok(())
    }
    fn harvest_dirty(&mut self, into: &mut DirtyPages) -> Result<HarvestStats, VmError> {
        let written = self.passes_written.swap(false, Ordering::AcqRel);
        if written {
            into.set(PASSES.gfn());
        }
        Ok(HarvestStats {
            pages: u64::from(written),
            ..HarvestStats::default()
        })
    }
    fn stop_dirty_log(&mut self) -> Result<(), VmError> {
        self.logging = false;
        Ok(())
    }
}

impl TimeThrottle for TestVm {
    fn set_time_throttle(&mut self, percent: u8) -> Result<(), VmError> {
        self.throttle.store(u64::from(percent), Ordering::Relaxed);
        Ok(())
    }
}

impl VcpuState for TestVm {
    fn save_vcpus(&mut self) -> Result<Vec<u8>, VmError> {
        if self.is_running() {
            return Err(VmError::NotPaused("save vCPUs"));
        }
        if self.untracked_write_on_save {
            let gpa = self.config.data_gpa(12).add(512);
            self.ram.store_u64(gpa, 0xbad)?;
        }
        Ok(self.position.load(Ordering::Acquire).to_le_bytes().to_vec())
    }
    fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), VmError> {
        if self.fail_restore {
            return Err(VmError::BadVcpuState("this test VM loads none".into()));
        }
        let bytes: [u8; 8] = state
            .try_into()
            .map_err(|_| VmError::BadVcpuState(format!("{} bytes", state.len())))?;
        self.position
            .store(u64::from_le_bytes(bytes), Ordering::Release);
        Ok(())
    }
}

impl Drop for TestVm {
    fn drop(&mut self) {
        let _ = self.pause();
    }
}
