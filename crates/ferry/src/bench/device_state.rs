//! `ferry bench device-state`: a guest whose device has large state that
//! changes at a fixed rate (`ferry_vm::synthetic::BigDevice`: 256 MiB by
//! default, one 64 KiB block rewritten every millisecond) migrates over
//! loopback with that state sent live during the rounds, and, in the same
//! run, interleaved, with all of it sent at the pause. It reports the
//! downtime against `--downtime-ms` and the prediction beside it.
//!
//! ```text
//!   source:       ferry's VM (kvm or soft, memstress guest) + the device, warmed up
//!   destination:  the same, built from the stream header, in a thread of this process
//!   every run:    digest, memstress stamps, and the device's state compared byte for byte
//! ```

use crate::args::{BackendArgs, WorkloadArgs};
use crate::error::CmdError;
use crate::vms;
use clap::Args;
use ferry_engine::vmm::StreamHeader;
use ferry_engine::{
    await_migration, listen, migrate, receive_as, MigrationSettings, MigrationSummary, NoProgress,
    ReceiveOptions, TcpDialer, TunableChange, Tunables,
};
use ferry_harness::stats::median;
use ferry_memstress::MemstressProbe;
use ferry_report::{Plot, Report, Series, Table};
use ferry_vm::synthetic::BigDevice;
use ferry_vm::{
    AccessLog, Blocker, DirtyLog, DirtyMeter, DirtySource, GuestRam, Lifecycle, LiveState,
    MemoryFaults, Section, SectionSpec, TimeThrottle, VcpuState, Vm, VmError,
};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `ferry bench device-state`.
#[derive(Args, Debug)]
pub struct DeviceStateArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Bytes of device state (whole 64 KiB blocks).
    #[arg(long, default_value = "256M", value_parser = crate::args::parse_size)]
    pub state: u64,
    /// The device rewrites one 64 KiB block every this many microseconds
    /// while the guest runs (1000: 64 MiB/s of changed state).
    #[arg(long = "period-us", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pub period_us: u64,
    /// The downtime target each migration is given.
    #[arg(long = "downtime-ms", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub downtime_ms: u64,
    /// Migrations per way of sending the state, interleaved.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Seconds the guest and the device run before each migration.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Print the results as one JSON object, the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html, the page that
    /// holds them all.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// One migration.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// `live` or `at the pause`.
    pub way: String,
    /// Downtime, as the source measured it.
    pub downtime_ms: f64,
    /// What precopy predicted at its last switchover decision.
    pub predicted_downtime_ms: f64,
    /// The downtime target it was given.
    pub target_ms: f64,
    /// Device state sent while the guest ran.
    pub device_bytes_live: u64,
    /// Device state sent at the pause.
    pub device_bytes_at_pause: u64,
    /// Saving the sections at the pause.
    pub save_sections_ms: f64,
    /// The destination's resume (loading the sections and vCPUs).
    pub dest_resume_ms: f64,
    /// The whole migration.
    pub total_ms: f64,
    /// Digest, guest stamps and the device's state all agree.
    pub verified: bool,
}

/// What the bench measured.
#[derive(Debug, Serialize)]
pub struct DeviceStateResults {
    /// Device state in bytes.
    pub state_bytes: u64,
    /// Microseconds between two block rewrites.
    pub period_us: u64,
    /// Guest memory in bytes.
    pub memory_bytes: u64,
    /// Every migration, in the order run.
    pub runs: Vec<Run>,
}

/// ferry's own VM with the synthetic device beside its own (sections,
/// live state); every capability is the VM's.
struct WithDevice {
    vm: Box<dyn Vm>,
    dev: BigDevice,
}

impl Vm for WithDevice {
    fn vmm_id(&self) -> &str {
        self.vm.vmm_id()
    }
    fn ram(&self) -> &Arc<GuestRam> {
        self.vm.ram()
    }
    fn vcpus(&self) -> u32 {
        self.vm.vcpus()
    }
    fn vmm_config(&self) -> serde_json::Value {
        self.vm.vmm_config()
    }
    fn start(&mut self) -> Result<(), VmError> {
        self.vm.start()?;
        // A source's device rewrites its state; a destination's does not.
        self.dev.run();
        Ok(())
    }
    /// The vCPUs, then the device.
    fn pause(&mut self) -> Result<(), VmError> {
        let paused = self.vm.pause();
        self.dev.halt();
        paused
    }
    fn is_running(&self) -> bool {
        self.vm.is_running()
    }
    fn check_health(&self) -> Result<(), VmError> {
        self.vm.check_health()
    }
    fn migration_event(&mut self, event: Lifecycle<'_>) {
        self.vm.migration_event(event)
    }
    fn blockers(&self) -> Vec<Blocker> {
        self.vm.blockers()
    }
    fn cpu_profile(&self) -> Option<serde_json::Value> {
        self.vm.cpu_profile()
    }
    fn check_cpu(&self, profile: &serde_json::Value) -> Result<(), VmError> {
        self.vm.check_cpu(profile)
    }
    fn state_sections(&self) -> Vec<SectionSpec> {
        let mut specs = self.vm.state_sections();
        specs.push(self.dev.spec());
        specs
    }
    fn save_sections(&mut self) -> Result<Vec<Section>, VmError> {
        let mut sections = self.vm.save_sections()?;
        sections.push(self.dev.save_rest());
        Ok(sections)
    }
    fn restore_sections(&mut self, sections: &[Section]) -> Result<(), VmError> {
        // The VM's own sections are small; the device's is not copied.
        let theirs: Vec<Section> = sections
            .iter()
            .filter(|s| !self.dev.owns(s))
            .cloned()
            .collect();
        self.vm.restore_sections(&theirs)?;
        sections
            .iter()
            .filter(|s| self.dev.owns(s))
            .try_for_each(|s| self.dev.restore(s))
    }
    fn live_state(&mut self) -> Option<&mut dyn LiveState> {
        match self.dev.live {
            true => Some(&mut self.dev),
            false => None,
        }
    }
    fn dirty_log(&mut self) -> Option<&mut dyn DirtyLog> {
        self.vm.dirty_log()
    }
    fn dirty_sources(&mut self) -> &mut [Box<dyn DirtySource>] {
        self.vm.dirty_sources()
    }
    fn time_throttle(&mut self) -> Option<&mut dyn TimeThrottle> {
        self.vm.time_throttle()
    }
    fn dirty_meter(&mut self) -> Option<&mut dyn DirtyMeter> {
        self.vm.dirty_meter()
    }
    fn vcpu_state(&mut self) -> Option<&mut dyn VcpuState> {
        self.vm.vcpu_state()
    }
    fn memory_faults(&mut self) -> Option<&mut dyn MemoryFaults> {
        self.vm.memory_faults()
    }
    fn access_log(&mut self) -> Option<&mut dyn AccessLog> {
        self.vm.access_log()
    }
}

/// The two ways, in the order each repeat runs them.
const WAYS: [(&str, bool); 2] = [("live", true), ("at the pause", false)];

/// Runs the experiment.
pub fn run(a: &DeviceStateArgs) -> Result<Report<DeviceStateResults>, CmdError> {
    if a.state == 0 || !a.state.is_multiple_of(64 << 10) {
        return Err(CmdError::Usage(
            "--state must be whole 64 KiB blocks (e.g. 256M)".into(),
        ));
    }
    if !(0.0..=60.0).contains(&a.warmup) {
        return Err(CmdError::Usage("--warmup must be 0 to 60 seconds".into()));
    }
    let workload = a.workload.workload().map_err(CmdError::Usage)?;
    let config = a.backend.config(workload);
    config.admit().map_err(VmError::from)?;
    let mut runs = Vec::new();
    for r in 1..=a.repeat {
        for (way, live) in WAYS {
            eprintln!(
                "ferry bench device-state: {} MiB of device state {way}, run {r} of {} ...",
                a.state >> 20,
                a.repeat
            );
            runs.push(move_once(a, &config, way, live)?);
        }
    }
    Ok(report(a, config.layout().total_bytes(), runs))
}

/// One migration of a fresh VM and device over loopback.
fn move_once(
    a: &DeviceStateArgs,
    config: &ferry_memstress::VmConfig,
    way: &str,
    live: bool,
) -> Result<Run, CmdError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        CmdError::Failed(format!("device-state bench: {what}: {e}"))
    };
    let listener = listen("127.0.0.1:0").map_err(|e| failed("listen on loopback", &e))?;
    let to = TcpDialer(
        listener
            .local_addr()
            .map_err(|e| failed("read the listener's address", &e))?
            .to_string(),
    );
    let state = a.state as usize;
    let mut vm = WithDevice {
        vm: vms::create(a.backend.kind(), config, &a.backend, vms::Role::Source)?,
        dev: BigDevice::source(state, Duration::from_micros(a.period_us)),
    };
    vm.dev.live = live;
    std::thread::scope(|s| {
        let dest = s.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(60);
            let incoming = await_migration(&listener, Some(deadline))
                .map_err(|e| ferry_vm::error_chain(&e))?;
            let mut factory = |h: &StreamHeader| -> Result<WithDevice, VmError> {
                let (kind, cfg) = vms::from_stream(&h.vmm, &h.vmm_config, a.backend.backing())?;
                let vm = vms::create(kind, &cfg, &a.backend, vms::Role::Destination)?;
                Ok(WithDevice {
                    vm,
                    dev: BigDevice::destination(state),
                })
            };
            let mut opts = ReceiveOptions::default();
            opts.probe = Some(Arc::new(MemstressProbe));
            receive_as(incoming, &listener, &mut factory, &opts)
                .map_err(|e| ferry_vm::error_chain(&e))
        });
        vm.start().map_err(|e| failed("start the source", &e))?;
        std::thread::sleep(Duration::from_secs_f64(a.warmup));
        let settings = MigrationSettings {
            tunables: TunableChange {
                downtime_ms: Some(a.downtime_ms),
                ..TunableChange::default()
            },
            ..MigrationSettings::default()
        };
        let opts = settings
            .options(Tunables::shared(), Some(Arc::new(MemstressProbe)))
            .map_err(|e| CmdError::Usage(e.to_string()))?;
        let summary = migrate(&mut vm, &to, &opts, &NoProgress)
            .map_err(|e| failed("migrate", &ferry_vm::error_chain(&e)))?;
        let (moved, received) = dest
            .join()
            .map_err(|_| CmdError::Failed("the destination thread panicked".into()))?
            .map_err(|e| failed("receive", &e))?;
        let same_device = moved.dev.state() == vm.dev.state();
        Ok(cell(way, a, &summary, received.digest_match && same_device))
    })
}

fn cell(way: &str, a: &DeviceStateArgs, s: &MigrationSummary, received: bool) -> Run {
    Run {
        way: way.into(),
        downtime_ms: s.downtime_ms,
        predicted_downtime_ms: s.switchover.predicted_downtime_ms,
        target_ms: a.downtime_ms as f64,
        device_bytes_live: s.devices.device_bytes_live,
        device_bytes_at_pause: s.devices.device_bytes_at_pause,
        save_sections_ms: s.switchover.save_sections_ms,
        dest_resume_ms: s.switchover.dest_resume_ms,
        total_ms: s.total_ms,
        verified: s.digest_match && s.guest.guest_mismatches == Some(0) && received,
    }
}

fn report(a: &DeviceStateArgs, memory_bytes: u64, runs: Vec<Run>) -> Report<DeviceStateResults> {
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let mut table = Table::new(
        format!(
            "{} MiB of device state rewritten at {:.0} MiB/s, {} MiB {} guest, downtime target {} ms",
            a.state >> 20,
            mib(64.0 * 1024.0 * 1e6 / a.period_us as f64),
            memory_bytes >> 20,
            a.backend.kind(),
            a.downtime_ms
        ),
        &[
            "device state",
            "runs",
            "live MiB",
            "at pause MiB",
            "downtime ms (median)",
            "min-max",
            "predicted (median)",
            "within target",
            "verified",
        ],
    );
    for (way, _) in WAYS {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.way == way).collect();
        let pick = |f: fn(&Run) -> f64| median(&mine.iter().map(|r| f(r)).collect::<Vec<_>>());
        let (lo, hi) = mine.iter().fold((f64::MAX, 0.0f64), |(lo, hi), r| {
            (lo.min(r.downtime_ms), hi.max(r.downtime_ms))
        });
        table.row(vec![
            way.into(),
            mine.len().to_string(),
            format!("{:.1}", mib(pick(|r| r.device_bytes_live as f64))),
            format!("{:.1}", mib(pick(|r| r.device_bytes_at_pause as f64))),
            format!("{:.1}", pick(|r| r.downtime_ms)),
            format!("{lo:.1}-{hi:.1}"),
            format!("{:.1}", pick(|r| r.predicted_downtime_ms)),
            format!(
                "{} of {}",
                mine.iter().filter(|r| r.downtime_ms <= r.target_ms).count(),
                mine.len()
            ),
            match mine.iter().all(|r| r.verified) {
                true => "yes".into(),
                false => "NO".into(),
            },
        ]);
    }
    table.note("live: the device sends its state during the precopy rounds (LiveState), and the pause carries what changed since; at the pause: the same device, all of its state after the pause. Interleaved in one run.");
    table.note("verified: the memory digest, the guest's stamps and the device's state, compared byte for byte on both ends.");
    table.note(format!(
        "source and destination in one process on this host's {} core(s): the guest's vCPUs, the device's writer and the migration's threads share them.",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));
    let series = WAYS
        .iter()
        .map(|(way, _)| Series {
            label: format!("{way}: downtime"),
            points: runs
                .iter()
                .filter(|r| r.way == *way)
                .enumerate()
                .map(|(i, r)| ((i + 1) as f64, r.downtime_ms))
                .collect(),
        })
        .chain(std::iter::once(Series {
            label: "target".into(),
            points: (1..=a.repeat)
                .map(|i| (f64::from(i), a.downtime_ms as f64))
                .collect(),
        }))
        .collect();
    Report {
        name: "device-state".into(),
        tables: vec![table],
        results: DeviceStateResults {
            state_bytes: a.state,
            period_us: a.period_us,
            memory_bytes,
            runs,
        },
        charts: vec![Plot {
            title: "downtime with large device state, live vs at the pause".into(),
            x_label: "run".into(),
            y_label: "downtime (ms)".into(),
            log_y: true,
            references: Vec::new(),
            series,
        }
        .into()],
    }
}

/// `ferry bench device-state`: runs it, prints its tables and writes its
/// files ([`super::output`]), and with `--json` ends with its results.
pub fn run_and_print(a: &DeviceStateArgs) -> Result<ExitCode, CmdError> {
    let report = run(a)?;
    super::output::emit_json(&report, &a.out, a.json)
}
