//! `minivmm bench qemu`: the same Linux guest (Debian's kernel, the
//! project's initramfs and checker) migrated by ferry (minivmm) and by
//! Debian's QEMU, inside the SVM host, cell by cell and side by side in
//! one run: each cell runs under ferry first, then under QEMU with a time
//! limit of at least five times ferry's total (never under 300 s).
//!
//! Both sides get the same link cap (QEMU's `max-bandwidth`) and downtime
//! limit. QEMU lifts its cap once the guest is paused for the last pass
//! (`migration_completion`); ferry is told to do the same
//! (`--uncapped-pause`). QEMU gets its best convergence setting (auto-converge; 7.2 has
//! no dirty-limit), ferry the policy minivmm's VM declares best
//! with harvests within rounds (`--ferry-harvest-within-rounds false`
//! harvests at round ends only). The
//! cells are fixed in advance:
//!
//! ```text
//!   idle      the checker rewrites 1 MiB per vCPU at 1 MiB/s in all
//!   writing   the checker dirties a hot set (128 MiB) at twice the link cap,
//!             so neither side converges without slowing the guest
//! ```
//!
//! Each side reports its total time, the downtime its host measured, and
//! the pause the guest saw (the checker's largest clock gap in its first
//! lines after the move), with the guest's own checks.

mod qemu;
mod qmp;
mod report;
mod snapshot;

use super::stamps;

use minivmm::checks;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the checker dirties in the idle cell, in MiB/s: a trickle (its
/// threads still read the clock without pause, to see the guest's).
const IDLE_RATE_MIB_S: u64 = 1;
/// QEMU's limit is at least this many times ferry's total time...
const QEMU_LIMIT_FACTOR: f64 = 5.0;
/// ...and never under this.
const QEMU_LIMIT_FLOOR: Duration = Duration::from_secs(300);

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand, Debug)]
enum Which {
    /// The same Linux guest moved by ferry and by QEMU (-accel kvm), idle
    /// and writing, interleaved (run it inside scripts/svm-host.sh).
    Qemu(QemuArgs),
    /// The same Linux guest saved live to a file and restored, by ferry
    /// and by QEMU (exec:cat), idle and writing, interleaved (run it
    /// inside scripts/svm-host.sh).
    QemuSnapshot(snapshot::SnapshotBenchArgs),
}

#[derive(clap::Args, Debug)]
pub struct QemuArgs {
    /// MiB of guest RAM.
    #[arg(long, default_value_t = 512)]
    mem_mib: u64,
    /// vCPUs.
    #[arg(long, default_value_t = 2)]
    vcpus: u32,
    /// The link cap both sides get, in MiB/s. Low, because the guest runs
    /// at TCG speed inside the SVM host: with dirty tracking on, its
    /// checker writes a few MiB/s, and the writing cell must dirty twice
    /// the cap.
    #[arg(long, default_value_t = 8)]
    bandwidth_mib_s: u64,
    /// The downtime limit both sides get, in ms (QEMU's default).
    #[arg(long, default_value_t = 300)]
    downtime_ms: u64,
    /// The writing cell's hot set, in MiB (split between the vCPUs); it is
    /// dirtied at twice the link cap.
    #[arg(long, default_value_t = 128)]
    hot_mib: u64,
    /// Whether ferry's source also harvests the dirty log within rounds
    /// (`minivmm demo --harvest-within-rounds`): its full pass leaves what
    /// the guest dirties ahead of it for the next round. Inside the SVM
    /// host that took the writing cell from 46-48 s to 35-39 s
    /// (docs/svm-host-runs.md). `false` harvests at round ends only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    ferry_harvest_within_rounds: bool,
    /// Runs of each cell (each a ferry run then a QEMU run).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// The cells to run, in order: idle, writing.
    #[arg(long, value_delimiter = ',', default_value = "idle,writing")]
    cells: Vec<String>,
    /// The QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu: String,
    /// The bzImage [default: $SVM_HOST_KERNEL].
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// The initramfs [default: $SVM_HOST_GUEST_INITRD].
    #[arg(long)]
    initrd: Option<PathBuf>,
    /// How long a guest may take to boot to its checker, in seconds.
    #[arg(long, default_value_t = 600)]
    boot_limit_s: u64,
    /// ferry's limit per run (boot, move and 10 s after), in seconds.
    #[arg(long, default_value_t = 900)]
    ferry_limit_s: u64,
    /// Where the report (qemu.json, qemu.svg, qemu.html) and each run's
    /// consoles go.
    #[arg(long, default_value = "target/bench/qemu")]
    out: PathBuf,
    /// End with the results as one JSON line on stdout.
    #[arg(long)]
    json: bool,
}

/// The guest both sides boot.
pub struct Guest {
    kernel: PathBuf,
    initrd: PathBuf,
    cmdline: String,
    vcpus: u32,
    mem_mib: u64,
    disk: PathBuf,
    /// A local directory (not the 9p share) for sockets and the disk.
    scratch: PathBuf,
    boot_limit: Duration,
    after_move_s: u64,
}

/// One cell: what the guest does, and what both sides are given.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub name: &'static str,
    pub writing: bool,
    /// MiB each vCPU's checker thread rewrites.
    pub mib_per_vcpu: u64,
    /// MiB/s the checker dirties in all (0: as fast as it can).
    pub rate_mib_s: u64,
    pub bandwidth_mib_s: u64,
    pub downtime_ms: u64,
    /// Whether ferry's source harvested within rounds.
    pub ferry_harvest_within_rounds: bool,
}

/// What one side did on one cell. `None` where it did not get there.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Side {
    pub converged: bool,
    pub total_ms: Option<f64>,
    pub downtime_ms: Option<f64>,
    /// The pause the guest saw at the switchover: the longest of the
    /// gaps its checker lists that spans the moment the VMM paused it
    /// ([`stamps::switchover_gap_ms`]).
    pub guest_pause_ms: Option<f64>,
    /// Where the pause's gap is not among those listed (a throttle's
    /// stalls just before it crowded it out of its line): the most it can
    /// have been ([`stamps::switchover_gap_at_most_ms`]).
    pub guest_pause_at_most_ms: Option<f64>,
    /// The largest gap in the first three checker lines on the
    /// destination's console, which span the switchover: the pause, or a
    /// throttle's stall before it where that was longer (what this bench
    /// reported as the pause before the lines listed their gaps).
    pub gap_near_move_ms: Option<f64>,
    /// How far the guest's clock fell behind the host's across the move
    /// (ms), from the host's times of the checker's lines
    /// ([`stamps`]): a pause the guest's clock did not count.
    pub guest_clock_lost_ms: Option<f64>,
    /// The pause the guest saw, plus what its clock lost: the pause in the
    /// host's time, whichever way the VMM set the guest's clock.
    pub guest_pause_host_ms: Option<f64>,
    pub checker_mismatches: Option<u64>,
    pub console_lines_lost: Option<u64>,
    pub kernel_warnings: Vec<String>,
    /// What the checker wrote on the source while it was being moved, in
    /// MiB/s (from its lines after the third, when the move starts): the
    /// dirty rate the guest reached, against the one it was asked for.
    pub source_write_mib_s: Option<f64>,
    /// The longest the checker's clock stopped on the source while it was
    /// being moved (its lines after the third), in ms: what the throttle
    /// cost the guest, beside the pause at the move itself.
    pub source_stall_ms: Option<f64>,
    /// The guest's usual stall after the move, in ms: the median, over
    /// the destination's checker lines after the third (one a second,
    /// past the switchover), of the largest gap each reports. A pause
    /// below it is one the guest meets every second on this host under
    /// this VMM anyway (inside the SVM host, on one emulated CPU, 130-190
    /// ms under minivmm).
    pub usual_stall_ms: Option<f64>,
    /// QEMU's highest throttle while it ran, in percent (its
    /// `cpu-throttle-percentage`, polled).
    pub throttle_pct: Option<u64>,
    /// What QEMU sent over its run, in MiB/s (`ram.transferred` over
    /// `total-time`): whether the cap held on its side.
    pub link_mib_s: Option<f64>,
    /// QEMU's dirty-bitmap syncs (`ram.dirty-sync-count`): its rounds.
    pub syncs: Option<u64>,
    /// ferry's convergence policy (the best minivmm's VM declares).
    pub policy: Option<String>,
    /// ferry's rounds.
    pub rounds: Option<u64>,
    /// The limit this side ran under, in seconds (QEMU's).
    pub limit_s: Option<f64>,
    pub error: Option<String>,
}

/// The checker's lines after the third (one a second): those written
/// while the guest was being moved.
fn lines_while_moving(console: &str) -> Vec<ferry_guest_checker::line::Line> {
    use ferry_guest_checker::line::Line;
    console
        .lines()
        .filter_map(|l| Line::parse(l)?.ok())
        .skip(3)
        .collect()
}

/// The checker's write rate over `lines`, in MiB/s.
fn write_rate(lines: &[ferry_guest_checker::line::Line]) -> Option<f64> {
    let (first, last) = (lines.first()?, lines.last()?);
    let secs = last.seq.checked_sub(first.seq).filter(|&s| s > 0)? as f64;
    Some((last.pages - first.pages) as f64 * 4096.0 / secs / f64::from(1 << 20))
}

/// The largest gap the checker reported in `lines`, in ms.
fn longest_stall(lines: &[ferry_guest_checker::line::Line]) -> Option<f64> {
    lines.iter().map(|l| l.gap_ms).reduce(f64::max)
}

/// The median of the largest gap each of `lines` reports, in ms.
fn usual_stall(lines: &[ferry_guest_checker::line::Line]) -> Option<f64> {
    median(lines.iter().map(|l| l.gap_ms).collect())
}

/// The median of `values` (of an even count, the upper of the middle
/// two); `None` where there are none.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

impl Side {
    /// What the checker did on the source while it was being moved.
    fn read_source(&mut self, console: &str) {
        let lines = lines_while_moving(console);
        self.source_write_mib_s = write_rate(&lines);
        self.source_stall_ms = longest_stall(&lines);
    }

    /// How the guest ran after the move, from the destination's console.
    fn read_destination(&mut self, console: &str) {
        self.usual_stall_ms = usual_stall(&lines_while_moving(console));
    }

    /// The guest's own checks, from the destination's console.
    fn check_guest(&mut self, console: &str) {
        let c = checks::linux_console(console);
        self.checker_mismatches = c.last.as_ref().map(|l| l.mismatches);
        self.console_lines_lost = Some(c.lines.lost);
        self.kernel_warnings = c.warnings.clone();
        self.gap_near_move_ms = super::demo_linux::first_gaps(console, 3);
        self.read_destination(console);
        if !c.done {
            self.error
                .get_or_insert("the guest's checker did not print its last line".into());
        }
    }

    /// From the stamps of its lines: what the guest's clock lost across
    /// the move, the gap that spans the VMM's pause at `paused_unix_ms`,
    /// and that pause in the host's time.
    fn place_pause(&mut self, stamps: &[stamps::Stamp], paused_unix_ms: Option<f64>) {
        self.guest_clock_lost_ms = stamps::clock_lost_ms(stamps);
        self.guest_pause_ms = paused_unix_ms.and_then(|at| stamps::switchover_gap_ms(stamps, at));
        self.guest_pause_at_most_ms =
            paused_unix_ms.and_then(|at| stamps::switchover_gap_at_most_ms(stamps, at));
        self.add_lost_time();
    }

    /// The pause the guest saw, plus what its clock lost: the pause in the
    /// host's time.
    fn add_lost_time(&mut self) {
        self.guest_pause_host_ms = self
            .guest_pause_ms
            .map(|gap| gap + self.guest_clock_lost_ms.unwrap_or(0.0).max(0.0));
    }

    /// The total time, only where the side converged.
    fn total(&self) -> Option<f64> {
        self.total_ms.filter(|_| self.converged)
    }

    /// The pause the guest saw, where this side converged.
    fn pause(&self) -> Option<f64> {
        self.guest_pause_ms.filter(|_| self.converged)
    }
}

/// One cell's result.
#[derive(Clone, Debug, Serialize)]
pub struct CellResult {
    pub cell: String,
    pub run: u32,
    pub guest_mib: u64,
    pub vcpus: u32,
    pub writing: bool,
    pub hot_mib: u64,
    pub rate_mib_s: u64,
    pub bandwidth_mib_s: u64,
    pub downtime_limit_ms: u64,
    /// Whether ferry's source harvested within rounds.
    pub ferry_harvest_within_rounds: bool,
    pub ferry: Side,
    pub qemu: Side,
}

pub fn bench(a: BenchArgs) -> Result<(), String> {
    match a.which {
        Which::Qemu(q) => bench_qemu(q),
        Which::QemuSnapshot(s) => snapshot::bench(s),
    }
}

fn bench_qemu(a: QemuArgs) -> Result<(), String> {
    minivmm::linux::check_host().map_err(|e| e.to_string())?;
    let kernel = super::guest::given_or_env(&a.kernel, "SVM_HOST_KERNEL", "kernel")?;
    let initrd = super::guest::given_or_env(&a.initrd, "SVM_HOST_GUEST_INITRD", "initrd")?;
    if a.vcpus == 0 || a.hot_mib < u64::from(a.vcpus) || a.bandwidth_mib_s == 0 {
        return Err(
            "--vcpus, --bandwidth-mib-s and --hot-mib (at least a MiB per vCPU) must be positive"
                .into(),
        );
    }
    Command::new(&a.qemu)
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("{}: {e} (Debian's qemu-system-x86)", a.qemu))?;
    let cells = [
        Cell {
            name: "idle",
            writing: false,
            mib_per_vcpu: 1,
            rate_mib_s: IDLE_RATE_MIB_S,
            bandwidth_mib_s: a.bandwidth_mib_s,
            downtime_ms: a.downtime_ms,
            ferry_harvest_within_rounds: a.ferry_harvest_within_rounds,
        },
        Cell {
            name: "writing",
            writing: true,
            mib_per_vcpu: a.hot_mib / u64::from(a.vcpus),
            rate_mib_s: 2 * a.bandwidth_mib_s,
            bandwidth_mib_s: a.bandwidth_mib_s,
            downtime_ms: a.downtime_ms,
            ferry_harvest_within_rounds: a.ferry_harvest_within_rounds,
        },
    ];
    if let Some(bad) = a
        .cells
        .iter()
        .find(|c| !cells.iter().any(|k| k.name == c.as_str()))
    {
        return Err(format!("--cells: no cell {bad:?} (idle, writing)"));
    }
    let cells: Vec<&Cell> = a
        .cells
        .iter()
        .filter_map(|c| cells.iter().find(|k| k.name == c.as_str()))
        .collect();
    let scratch = std::env::temp_dir().join(format!("minivmm-bench-qemu-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let mut results = Vec::new();
    for run in 1..=a.repeat {
        for &cell in &cells {
            let dir = a.out.join(format!("{}-{run}", cell.name));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let guest = Guest {
                kernel: kernel.clone(),
                initrd: initrd.clone(),
                cmdline: format!(
                    "console=ttyS0 reboot=acpi panic=-1 pci=off 8250.nr_uarts=1 quiet checker.mib={} checker.rate_mib={}",
                    cell.mib_per_vcpu, cell.rate_mib_s
                ),
                vcpus: a.vcpus,
                mem_mib: a.mem_mib,
                disk: scratch.join("disk.img"),
                scratch: scratch.clone(),
                boot_limit: Duration::from_secs(a.boot_limit_s),
                after_move_s: 10,
            };
            eprintln!("minivmm bench qemu: {} (run {run}): ferry ...", cell.name);
            let ferry = ferry_side(&guest, cell, Duration::from_secs(a.ferry_limit_s), &dir);
            let limit = ferry
                .total()
                .map(|ms| Duration::from_secs_f64(ms / 1e3 * QEMU_LIMIT_FACTOR))
                .unwrap_or_default()
                .max(QEMU_LIMIT_FLOOR);
            eprintln!(
                "minivmm bench qemu: {} (run {run}): {}; QEMU (limit {} s) ...",
                cell.name,
                report::brief(&ferry),
                limit.as_secs()
            );
            let result = |qemu: Side| CellResult {
                cell: cell.name.into(),
                run,
                guest_mib: a.mem_mib,
                vcpus: a.vcpus,
                writing: cell.writing,
                hot_mib: if cell.writing {
                    a.hot_mib
                } else {
                    cell.mib_per_vcpu * u64::from(a.vcpus)
                },
                rate_mib_s: cell.rate_mib_s,
                bandwidth_mib_s: cell.bandwidth_mib_s,
                downtime_limit_ms: cell.downtime_ms,
                ferry_harvest_within_rounds: cell.ferry_harvest_within_rounds,
                ferry: ferry.clone(),
                qemu,
            };
            // ferry's side on record before QEMU's run: the emulated host
            // has frozen under QEMU's run too (docs/svm-host-runs.md).
            let pending = Side {
                error: Some(QEMU_PENDING.into()),
                ..Side::default()
            };
            results.push(result(pending));
            report::write(&results, &a.out, false)?;
            results.pop();
            fresh_disk(&guest.disk)?;
            let qemu = qemu::run(&a.qemu, &guest, cell, limit, &dir);
            eprintln!(
                "minivmm bench qemu: {} (run {run}): QEMU {}",
                cell.name,
                report::brief(&qemu)
            );
            results.push(result(qemu));
            // After each cell, so that a host that dies later leaves what
            // was measured.
            report::write(&results, &a.out, false)?;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    report::write(&results, &a.out, a.json)
}

/// What the report says of a QEMU run that has not ended: it stays so
/// only if the host failed during it.
const QEMU_PENDING: &str =
    "not measured yet: QEMU's run had not ended when this was written (if it stays so, the SVM host failed during it)";

/// A fresh 8 MiB disk image for the checker's records.
fn fresh_disk(path: &Path) -> Result<(), String> {
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.set_len(8 << 20)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `cell` under ferry: `minivmm demo --guest linux`, its summary read
/// back. The demo keeps its files (disk, consoles, vCPU traces, summaries)
/// in the local scratch directory, as QEMU's side keeps its disk there,
/// and they are copied to `dir/ferry` afterwards. Kept on the share, each
/// console line the guest printed was a 9p round trip on the vCPU thread
/// that printed it (minivmm writes a line as it ends), and each disk
/// record one on the I/O thread: a cost QEMU's side, writing its consoles
/// to pipes and its disk to tmpfs, did not pay.
fn ferry_side(guest: &Guest, cell: &Cell, limit: Duration, dir: &Path) -> Side {
    let mut side = Side::default();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            side.error = Some(e.to_string());
            return side;
        }
    };
    let kept = dir.join("ferry");
    let run_dir = guest.scratch.join("ferry");
    let _ = std::fs::remove_dir_all(&run_dir);
    let mut cmd = Command::new(exe);
    cmd.args(["demo", "--guest", "linux", "--json", "--mode", "precopy"])
        .args(["--vcpus", &guest.vcpus.to_string()])
        .args(["--mem-mib", &guest.mem_mib.to_string()])
        .args(["--bandwidth-mib-s", &cell.bandwidth_mib_s.to_string()])
        .args(["--downtime-ms", &cell.downtime_ms.to_string()])
        // QEMU lifts its max-bandwidth at completion; so does ferry here.
        .arg("--uncapped-pause")
        .args(
            cell.ferry_harvest_within_rounds
                .then_some("--harvest-within-rounds"),
        )
        .args(["--cmdline", &guest.cmdline])
        .arg("--kernel")
        .arg(&guest.kernel)
        .arg("--initrd")
        .arg(&guest.initrd)
        .arg("--dir")
        .arg(&run_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let _ = std::fs::create_dir_all(&run_dir);
    let ran = run_within(cmd, limit);
    if let Err(e) = copy_files(&run_dir, &kept) {
        eprintln!("minivmm bench qemu: keeping ferry's files: {e}");
    }
    let out = match ran {
        Ok(out) => out,
        Err(e) => {
            side.error = Some(e);
            return side;
        }
    };
    let Some(j) = ferry_harness::output::last_json(&out) else {
        side.error = Some("minivmm demo printed no summary".into());
        return side;
    };
    let console = |name| std::fs::read_to_string(run_dir.join(name)).unwrap_or_default();
    side.read_source(&console("source.console"));
    side.read_destination(&console("destination.console"));
    side.converged = j["status"] == "completed";
    side.total_ms = j["total_ms"].as_f64();
    side.downtime_ms = j["downtime_ms"].as_f64();
    side.guest_pause_ms = j["guest_pause_ms"].as_f64();
    side.guest_pause_at_most_ms = j["guest_pause_at_most_ms"].as_f64();
    side.gap_near_move_ms = j["gap_near_move_ms"].as_f64();
    side.guest_clock_lost_ms = j["guest_clock_lost_ms"].as_f64();
    side.add_lost_time();
    side.policy = j["converge"].as_str().map(String::from);
    side.rounds = j["rounds"].as_u64();
    side.checker_mismatches = j["checker_mismatches"].as_u64();
    side.console_lines_lost = j["console_lines_lost"].as_u64();
    side.kernel_warnings = serde_json::from_value(j["kernel_warnings"].clone()).unwrap_or_default();
    side.error = j["error"].as_str().map(String::from);
    side
}

/// Copies the files of directory `from` into `to` (made if missing).
fn copy_files(from: &Path, to: &Path) -> Result<(), String> {
    let what = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(to).map_err(|e| what(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| what(from, e))? {
        let path = entry.map_err(|e| what(from, e))?.path();
        if path.is_file() {
            let target = to.join(path.file_name().expect("a file has a name"));
            std::fs::copy(&path, &target).map_err(|e| what(&path, e))?;
        }
    }
    Ok(())
}

/// Runs `cmd` to its end, or kills it (and the processes it started)
/// after `limit`; its stdout. A run stopped so names what each of its
/// threads was waiting in, so that a hang leaves evidence.
fn run_within(mut cmd: Command, limit: Duration) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let mut child = cmd.process_group(0).spawn().map_err(|e| e.to_string())?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            return reader.join().map_err(|_| "its reader panicked".to_string());
        }
        if Instant::now() > deadline {
            let group = child.id() as i32;
            let states = group_threads(group);
            // SAFETY: kill takes any pid; a negative one names the process
            // group this child leads (made so by process_group(0) above).
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = child.wait();
            return Err(format!(
                "not done within {} s; stopped. Its threads were: {states}",
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every thread of process group `group`: its process, name, state and
/// the kernel function it waits in.
fn group_threads(group: i32) -> String {
    let mut out = Vec::new();
    for proc_dir in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let stat = read(&proc_dir.path().join("stat"));
        // pid (comm) state ppid pgrp ...: the fields after the last ')'.
        let pgrp = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<i32>().ok());
        if pgrp == Some(group) {
            out.push(process_threads(&proc_dir.file_name().to_string_lossy()));
        }
    }
    out.join("; ")
}

/// Every thread of process `pid`: name, state and what it waits in.
pub(super) fn process_threads(pid: &str) -> String {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
    let mut out = Vec::new();
    for task in tasks.into_iter().flatten().flatten() {
        let comm = read(&task.path().join("comm"));
        let state = read(&task.path().join("stat"))
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next().map(String::from))
            .unwrap_or_default();
        let wchan = read(&task.path().join("wchan"));
        out.push(format!("{pid}/{} {state} {wchan}", comm.trim()));
    }
    out.join("; ")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checker line as the guest prints it.
    fn line(seq: u64, pages: u64, gap_ms: f64) -> String {
        ferry_guest_checker::line::Line {
            seq,
            pages,
            gap_ms,
            max_gap_ms: gap_ms,
            ..Default::default()
        }
        .format()
    }

    #[test]
    fn the_source_figures_leave_out_the_first_three_lines() {
        let console = [
            "[    1.0] a kernel line".to_string(),
            line(1, 0, 9_000.0),
            line(2, 256, 10.0),
            line(3, 512, 10.0),
            line(4, 768, 40.0),
            line(5, 1024, 700.0),
            line(6, 1280, 20.0),
        ]
        .join("\n");
        let lines = lines_while_moving(&console);
        assert_eq!(longest_stall(&lines), Some(700.0));
        // 512 pages (2 MiB) over the 2 s from line 4 to line 6.
        assert_eq!(write_rate(&lines), Some(1.0));
        assert_eq!(longest_stall(&lines_while_moving(&line(1, 0, 5.0))), None);
        // The median of lines 4-6's 40, 700 and 20: one long stall is not
        // the usual one.
        assert_eq!(usual_stall(&lines), Some(40.0));
        assert_eq!(usual_stall(&lines[..2]), Some(700.0), "the upper median");
        assert_eq!(usual_stall(&[]), None);
    }
}
