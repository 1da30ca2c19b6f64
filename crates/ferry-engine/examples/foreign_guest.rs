//! A VM that is not ferry's own, migrated in one process over loopback: what
//! a VMM writes to embed the engine (see `docs/embedding.md`).
//!
//! ```text
//!   guest memory (the VMM's own GuestMemoryMmap<AtomicBitmap>)
//!   0x0000_0000  region 0, 2 MiB: page 0 = the guest's counters, the rest data
//!   0x0020_0000  hole, 6 MiB (an x86 PCI hole, say): never RAM, never sent
//!   0x0080_0000  region 1, 6 MiB: data
//!   devices: "uart" v2 (loads v1..v2; subsection "fifo" when it holds bytes),
//!            "timer" v1 (saving it writes its tick count into guest memory)
//! ```
//!
//! The guest is a thread that walks every data page, checks the word it left
//! there on its last pass and writes a new one: its own pattern, and its own
//! check, read by the engine through a probe. `--json` prints one JSON object
//! as the last line of stdout.
//!
//! `cargo run --release -p ferry-engine --example foreign_guest -- --json`
//!
//! `--snapshot` then saves the migrated VM to a file while it runs, ends
//! it, and restores it lazily, its working set first, into a new VM: the
//! same factory, the same contract, nothing new for the VMM.
//!
//! `--predict` first samples the guest's dirtying through the VM's own dirty
//! logs and predicts the migration (`ferry_engine::converge::predict_vm`),
//! then reports the prediction beside what happened. `--data-mib N` sizes
//! the second region (default 6), `--write-mib-s N` caps the guest's
//! dirtying and `--bandwidth-mib-s N` the link (0: no cap).

use ferry_engine::vmm::{
    Backing, Gpa, GuestCheck, GuestProbe, GuestRam, ProbeError, Section, SectionSpec, StreamHeader,
    VcpuState, Vm, VmError, PAGE_SIZE,
};
use ferry_engine::{
    await_migration, listen, migrate, receive_as, NoProgress, PrecopyOptions, ReceiveOptions,
    TcpDialer,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{GuestAddress, GuestMemoryMmap};

const MIB: u64 = 1 << 20;
/// Where the second region starts: after region 0 (2 MiB) and a 6 MiB hole.
const DATA_GPA: u64 = 8 * MIB;

/// The regions: (start, bytes).
fn regions(data_mib: u64) -> [(u64, u64); 2] {
    [(0, 2 * MIB), (DATA_GPA, data_mib * MIB)]
}

/// What the command line asks.
#[derive(Clone, Copy)]
pub struct Args {
    json: bool,
    predict: bool,
    snapshot: bool,
    data_mib: u64,
    write_mib_s: u64,
    bandwidth_mib_s: u64,
}

/// `--help`'s text.
const USAGE: &str = "\
Migrates a VM that is not ferry's own (a memory hole, two devices) over loopback.

Usage: foreign_guest [--json] [--predict] [--snapshot] [--data-mib N] [--write-mib-s N] [--bandwidth-mib-s N]

Options:
  --json               print one JSON object as the last line of stdout
  --predict            sample the guest's dirtying first and print the prediction beside the run
  --snapshot           then save the migrated VM to a file while it runs, and restore it lazily
                       (its working set first) into a new VM that runs on
  --data-mib N         size of the second region in MiB, rounded down to 2 MiB (default 6)
  --write-mib-s N      cap the guest's dirtying at N MiB/s (default 0: no cap)
  --bandwidth-mib-s N  cap the link at N MiB/s (default 0: no cap)
  -h, --help           print this help";

impl Args {
    /// Parses the command line; `--help` prints the usage and exits 0, and
    /// a flag this example does not know, or a bad number, exits 2 with
    /// the reason.
    fn parse() -> Self {
        match Self::parse_from(std::env::args().skip(1)) {
            Ok(Some(args)) => args,
            Ok(None) => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("foreign_guest: {e}\n\n{USAGE}");
                std::process::exit(2);
            }
        }
    }

    /// The arguments, or `None` for `--help`.
    pub fn parse_from(mut argv: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        let mut args = Args {
            json: false,
            predict: false,
            snapshot: false,
            data_mib: 6,
            write_mib_s: 0,
            bandwidth_mib_s: 0,
        };
        while let Some(flag) = argv.next() {
            let mut number = || -> Result<u64, String> {
                let v = argv.next().ok_or(format!("{flag} needs a number"))?;
                // Sizes and rates in MiB up to a TiB, so none overflows in bytes.
                match v.parse::<u64>() {
                    Ok(n) if n <= 1 << 20 => Ok(n),
                    _ => Err(format!(
                        "{flag} takes a whole number up to 1048576, not {v:?}"
                    )),
                }
            };
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--json" => args.json = true,
                "--predict" => args.predict = true,
                "--snapshot" => args.snapshot = true,
                // Whole 2 MiB, as every region is.
                "--data-mib" => args.data_mib = number()?.max(2) & !1,
                "--write-mib-s" => args.write_mib_s = number()?,
                "--bandwidth-mib-s" => args.bandwidth_mib_s = number()?,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(Some(args))
    }
}
/// The guest's counters, in page 0.
const PROGRESS: Gpa = Gpa(0);
const ERRORS: Gpa = Gpa(8);
/// Where saving the timer writes its ticks.
const TIMER_TICKS: Gpa = Gpa(16);
const VMM_ID: &str = "foreign-guest-example";

/// The word the guest writes into `page` on `pass` (splitmix64).
fn pattern(page: u64, pass: u64) -> u64 {
    let mut z = (page << 32 | pass).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The data pages: every RAM page but page 0, as guest-physical addresses.
fn data_pages(data_mib: u64) -> Vec<Gpa> {
    regions(data_mib)
        .iter()
        .flat_map(|&(start, bytes)| (0..bytes / PAGE_SIZE as u64).map(move |p| start + p * 4096))
        .filter(|&a| a != 0)
        .map(|a| Gpa(a + 8 * ((a / 4096) % 500)))
        .collect()
}

/// The devices' VMM-side state.
#[derive(Clone, Debug, Default, PartialEq)]
struct Devices {
    uart_tx: u64,
    uart_fifo: Vec<u8>,
    timer_ticks: u64,
}

struct ForeignVm {
    args: Args,
    ram: Arc<GuestRam>,
    /// pass << 32 | index into the data pages: the "vCPU state".
    position: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    devices: Devices,
    started: Instant,
    /// When the guest last started running (the destination's resume).
    resumed_at: Arc<Mutex<Option<Instant>>>,
    /// What `restore_sections` loaded, for the example to compare.
    restored: Arc<Mutex<Option<Devices>>>,
}

impl ForeignVm {
    fn new(args: Args) -> Self {
        let ranges: Vec<(GuestAddress, usize)> = regions(args.data_mib)
            .iter()
            .map(|&(start, bytes)| (GuestAddress(start), bytes as usize))
            .collect();
        let mem = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&ranges).expect("map guest memory");
        let ram = GuestRam::from_memory(mem, Backing::Anonymous).expect("adopt guest memory");
        ForeignVm {
            args,
            ram: Arc::new(ram),
            position: Arc::new(AtomicU64::new(1 << 32)),
            stop: Arc::new(AtomicBool::new(false)),
            worker: None,
            devices: Devices::default(),
            started: Instant::now(),
            resumed_at: Arc::new(Mutex::new(None)),
            restored: Arc::new(Mutex::new(None)),
        }
    }

    fn specs() -> Vec<SectionSpec> {
        vec![
            SectionSpec::new("uart", 2, 1).with_subsection("fifo"),
            SectionSpec::new("timer", 1, 1),
        ]
    }
}

fn guest(ram: Arc<GuestRam>, args: Args, position: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let pages = data_pages(args.data_mib);
    let pos = position.load(Ordering::Acquire);
    let (mut pass, mut i) = (pos >> 32, (pos & 0xffff_ffff) as usize);
    // Paced to --write-mib-s: one page dirtied per 4 KiB of the rate.
    let per_page = (args.write_mib_s > 0)
        .then(|| Duration::from_secs_f64(PAGE_SIZE as f64 / (args.write_mib_s * MIB) as f64));
    let (started, mut written) = (Instant::now(), 0u32);
    while !stop.load(Ordering::Acquire) {
        if let Some(per) = per_page {
            written += 1;
            if let Some(wait) = (per * written).checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let at = pages[i];
        let expect = if pass <= 1 {
            0
        } else {
            pattern(at.0, pass - 1)
        };
        if ram.load_u64(at).unwrap_or(0) != expect {
            let e = ram.load_u64(ERRORS).unwrap_or(0);
            let _ = ram.store_u64(ERRORS, e + 1);
        }
        let _ = ram.store_u64(at, pattern(at.0, pass));
        i += 1;
        if i == pages.len() {
            let _ = ram.store_u64(PROGRESS, pass);
            i = 0;
            pass += 1;
            if per_page.is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        position.store(pass << 32 | i as u64, Ordering::Release);
    }
}

impl Vm for ForeignVm {
    fn vmm_id(&self) -> &str {
        VMM_ID
    }
    fn ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }
    fn start(&mut self) -> Result<(), VmError> {
        if self.worker.is_none() {
            self.stop.store(false, Ordering::Release);
            let (ram, pos, stop, args) = (
                Arc::clone(&self.ram),
                Arc::clone(&self.position),
                Arc::clone(&self.stop),
                self.args,
            );
            self.worker = Some(std::thread::spawn(move || guest(ram, args, pos, stop)));
            *self.resumed_at.lock().unwrap() = Some(Instant::now());
        }
        Ok(())
    }
    fn pause(&mut self) -> Result<(), VmError> {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.worker.take() {
            w.join().map_err(|_| VmError::VcpuFailed {
                vcpu: 0,
                reason: "the guest thread panicked".into(),
            })?;
        }
        Ok(())
    }
    fn is_running(&self) -> bool {
        self.worker.is_some()
    }
    fn vcpu_state(&mut self) -> Option<&mut dyn VcpuState> {
        Some(self)
    }
    fn state_sections(&self) -> Vec<SectionSpec> {
        Self::specs()
    }
    fn save_sections(&mut self) -> Result<Vec<Section>, VmError> {
        // The timer flushes its ticks into guest memory as it is saved:
        // the engine's harvest after this sends that page too.
        self.devices.timer_ticks = self.started.elapsed().as_millis() as u64;
        self.ram.store_u64(TIMER_TICKS, self.devices.timer_ticks)?;
        // Versions are the specs' (Section::new leaves them to the engine).
        let mut uart = Section::new("uart", self.devices.uart_tx.to_le_bytes().to_vec());
        if !self.devices.uart_fifo.is_empty() {
            uart = uart.with_subsection("fifo", self.devices.uart_fifo.clone());
        }
        let timer = Section::new("timer", self.devices.timer_ticks.to_le_bytes().to_vec());
        Ok(vec![uart, timer])
    }
    fn restore_sections(&mut self, sections: &[Section]) -> Result<(), VmError> {
        let word = |s: &Section| -> Result<u64, VmError> {
            let bytes = s
                .data
                .as_slice()
                .try_into()
                .map_err(|_| VmError::BadSection {
                    section: s.id.to_string(),
                    reason: format!("{} bytes, not 8", s.data.len()),
                })?;
            Ok(u64::from_le_bytes(bytes))
        };
        for s in sections {
            match s.id.name.as_str() {
                "uart" => {
                    self.devices.uart_tx = word(s)?;
                    self.devices.uart_fifo = s.subsection("fifo").unwrap_or_default().to_vec();
                }
                "timer" => self.devices.timer_ticks = word(s)?,
                _ => {}
            }
        }
        *self.restored.lock().unwrap() = Some(self.devices.clone());
        Ok(())
    }
}

/// The guest's position is its "vCPU state".
impl VcpuState for ForeignVm {
    fn save_vcpus(&mut self) -> Result<Vec<u8>, VmError> {
        Ok(self.position.load(Ordering::Acquire).to_le_bytes().to_vec())
    }
    fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), VmError> {
        let bytes = state
            .try_into()
            .map_err(|_| VmError::BadVcpuState(format!("{} bytes, not 8", state.len())))?;
        self.position
            .store(u64::from_le_bytes(bytes), Ordering::Release);
        Ok(())
    }
}

impl Drop for ForeignVm {
    fn drop(&mut self) {
        let _ = self.pause();
    }
}

/// The guest's own checks, read from page 0.
#[derive(Debug)]
struct Probe;

impl GuestProbe for Probe {
    fn read(&self, vm: &dyn Vm) -> Result<GuestCheck, ProbeError> {
        let read = |gpa| vm.ram().load_u64(gpa);
        Ok(GuestCheck {
            progress: read(PROGRESS)?,
            errors: read(ERRORS)?,
        })
    }
}

fn main() {
    let report = run(Args::parse());
    println!("{report}");
}

/// Migrates the VM as `args` say (then snapshots and restores it, with
/// `--snapshot`) and returns the report; without `--json`, also a line in
/// words first.
pub fn run(args: Args) -> serde_json::Value {
    let json = args.json;
    let listener = listen("127.0.0.1:0").expect("listen on loopback");
    let to = TcpDialer(listener.local_addr().expect("address").to_string());
    let resumed_at = Arc::new(Mutex::new(None));
    let restored = Arc::new(Mutex::new(None));
    let (dest_resumed, dest_restored) = (Arc::clone(&resumed_at), Arc::clone(&restored));
    let destination = std::thread::spawn(move || {
        let incoming = await_migration(&listener, None).expect("a migration arrives");
        let mut factory = |h: &StreamHeader| -> Result<ForeignVm, VmError> {
            if h.vmm != VMM_ID {
                return Err(VmError::Guest(format!("cannot build a {} VM", h.vmm)));
            }
            let mut vm = ForeignVm::new(args);
            vm.resumed_at = Arc::clone(&dest_resumed);
            vm.restored = Arc::clone(&dest_restored);
            Ok(vm)
        };
        let opts = {
            let mut o = ReceiveOptions::default();
            o.probe = Some(Arc::new(Probe));
            o
        };
        let received = receive_as(incoming, &listener, &mut factory, &opts);
        let returned = Instant::now();
        received.map(|(vm, summary)| (vm, summary, returned))
    });

    let mut vm = ForeignVm::new(args);
    vm.devices.uart_tx = 42;
    vm.devices.uart_fifo = b"login: ".to_vec();
    vm.start().expect("start the guest");
    while Probe.read(&vm).map(|c| c.progress).unwrap_or(0) < 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let opts = {
        let mut o = PrecopyOptions::default();
        o.probe = Some(Arc::new(Probe));
        o
    };
    opts.tunables
        .set_bandwidth_bytes_per_sec(args.bandwidth_mib_s * MIB);
    let predicted = args.predict.then(|| {
        let sample = ferry_engine::converge::sample_dirtying(&mut vm, Duration::from_secs(1))
            .expect("sample the guest's dirtying");
        let settings = ferry_engine::converge::PredictSettings {
            link_bytes_per_sec: (args.bandwidth_mib_s > 0)
                .then(|| (args.bandwidth_mib_s * MIB) as f64),
            downtime_target: opts.tunables.downtime_target(),
            max_rounds: opts.tunables.max_rounds(),
            harvest_within_rounds: opts.harvest_within_rounds,
        };
        ferry_engine::converge::predict_vm(&mut vm, &sample, &settings).expect("predict")
    });
    let summary = migrate(&mut vm, &to, &opts, &NoProgress).expect("the migration completes");
    let (mut dvm, dsum, returned) = destination
        .join()
        .expect("the destination thread")
        .expect("the destination receives");
    let resumed = resumed_at.lock().unwrap().expect("the destination resumed");
    let receive_returned_ms = returned.duration_since(resumed).as_secs_f64() * 1e3;

    // The guest runs on at the destination: another pass, no new error.
    let at_resume = dsum.guest_at_resume.unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let now = Probe.read(&dvm).expect("read the guest");
        if now.progress > at_resume.progress || Instant::now() > deadline {
            break now.since(&at_resume);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let ticks = dvm.ram().load_u64(TIMER_TICKS).unwrap_or(0);
    let devices_restored = restored.lock().unwrap().as_ref() == Some(&vm.devices);
    // The prediction for the policy the migration ran.
    let forecast = predicted.as_ref().and_then(|p| {
        p.policies
            .iter()
            .find(|f| summary.convergence.converge == Some(f.policy))
            .map(|f| {
                serde_json::json!({
                    "policy": f.policy,
                    "total_ms": f.total_ms,
                    "rounds": f.rounds,
                    "over_measured": f.total_ms / summary.total_ms.max(1e-3),
                    "recommended": p.recommended,
                })
            })
    });
    let report = serde_json::json!({
        "digest_match": summary.digest_match && dsum.digest_match,
        "regions": dvm.ram().slots().len(),
        "hole_bytes": dvm.ram().holes().iter().map(|(_, n)| n * PAGE_SIZE as u64).sum::<u64>(),
        "sections": ForeignVm::specs().iter().map(|s| serde_json::json!({
            "name": s.name, "version": s.version,
        })).collect::<Vec<_>>(),
        "devices_restored": devices_restored,
        "timer_ticks_in_guest_memory": ticks,
        "receive_returned_ms": receive_returned_ms,
        "downtime_ms": summary.downtime_ms,
        "total_ms": summary.total_ms,
        "guest_errors_before": summary.guest.guest_at_pause.map(|c| c.errors),
        "guest_passes_after": after.progress,
        "guest_errors_after": after.errors,
        "rounds": summary.memory.rounds.len(),
        "predicted": forecast,
        "snapshot": args.snapshot.then(|| snapshot_and_restore(&mut dvm, args)),
    });
    if !json {
        println!(
            "migrated a {VMM_ID} VM: digest {}, downtime {:.1} ms, receive() returned {:.1} ms after the resume, \
             {} passes and {} errors after",
            if report["digest_match"] == true { "match" } else { "MISMATCH" },
            summary.downtime_ms,
            receive_returned_ms,
            after.progress,
            after.errors
        );
    }
    report
}

/// Saves `vm` (running) to a file, ends it, and restores the file lazily
/// with its working set first into a new VM built as a destination's:
/// what a VMM writes for snapshots is what it wrote for migrations.
fn snapshot_and_restore(vm: &mut ForeignVm, args: Args) -> serde_json::Value {
    use ferry_engine::snapshot::{self, RestoreMode, RestoreOptions, SnapshotOptions};
    let path = std::env::temp_dir().join(format!("foreign-guest-{}.snap", std::process::id()));
    let saved = snapshot::save(vm, &path, &SnapshotOptions::default()).expect("the snapshot");
    // The source ends here, at a pass boundary or not: the file is the VM.
    vm.pause().expect("pause the source");
    let saved_devices = vm.devices.clone();
    let saved_check = Probe.read(vm).expect("read the guest");
    let restored = Arc::new(Mutex::new(None));
    let mut factory = |h: &StreamHeader| -> Result<ForeignVm, VmError> {
        if h.vmm != VMM_ID {
            return Err(VmError::Guest(format!("cannot build a {} VM", h.vmm)));
        }
        let mut vm = ForeignVm::new(args);
        vm.restored = Arc::clone(&restored);
        Ok(vm)
    };
    let mut opts = RestoreOptions::default();
    opts.mode = RestoreMode::LazyWorkingSet;
    let (mut back, restoring) =
        snapshot::restore_as(&path, &mut factory, &opts).expect("the restore");
    let r = restoring.finish(&mut back).expect("every page in, checked");
    let _ = std::fs::remove_file(&path);
    // The restored guest walks on from where it was saved.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let now = Probe.read(&back).expect("read the guest");
        if now.progress > saved_check.progress + 1 || Instant::now() > deadline {
            break now.since(&saved_check);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    serde_json::json!({
        "total_ms": saved.total_ms,
        "pause_ms": saved.pause_ms,
        "digest_match": r.digest_match,
        "first_instruction_ms": r.first_instruction_ms,
        "working_set_pages": r.working_set_pages,
        "blocking_faults": r.blocking_faults,
        "devices_restored": restored.lock().unwrap().as_ref() == Some(&saved_devices),
        "timer_ticks_in_guest_memory": back.ram().load_u64(TIMER_TICKS).unwrap_or(0),
        "timer_ticks_saved": saved_devices.timer_ticks,
        "guest_passes_after": after.progress,
        "guest_errors_after": after.errors,
    })
}
