//! `minivmm bench qemu-snapshot`: the same Linux guest saved live to a
//! file and restored from it, by ferry (minivmm) and by Debian's QEMU,
//! inside the SVM host, cell by cell and side by side in one run.
//!
//! ```text
//!   ferry   minivmm demo --guest linux --snapshot: saved live (the policy
//!           the VM declares best), the source ends, a new process restores
//!           it lazily with its working set first
//!   QEMU    migrate "exec:cat > FILE" (7.2's way to a file; auto-converge,
//!           the same downtime limit, no bandwidth cap), the source quits,
//!           a new QEMU takes -incoming "exec:cat FILE" (eager: the whole
//!           stream before the guest runs)
//!   QEMU    with --qemu-mapped-ram (9.0 or later): the same, with the
//!   mapped- mapped-ram capability on both sides and "file:FILE", a fixed
//!   ram     place per page as in ferry's file (scripts/qemu-trixie.sh
//!           fetches Debian trixie's 10.0); also read whole before the
//!           guest runs
//! ```
//!
//! Each restored guest is told it moved, runs on 10 s with its checker
//! verifying memory, disk records and console lines, and powers off.
//!
//! The pause the guest saw is not compared here: ferry's restore sets the
//! guest's clock to the host's time (the gap shows the whole time the
//! guest spent in the file), QEMU's to the saved value (no gap at all).

use super::qemu::{checker_lines, run_on, Qemu};
use super::qmp::Qmp;
use super::report::ms;
use super::{fresh_disk, run_within, Cell, Guest, Side};
use ferry_report::{Bar, Bars, Report, Table};
use serde::Serialize;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How often QEMU's state is polled.
const POLL: Duration = Duration::from_millis(10);

/// QMP's capability for a fixed place per page in a file (QEMU 9.0 on).
fn mapped_ram() -> serde_json::Value {
    json!({ "capability": "mapped-ram", "state": true })
}

#[derive(clap::Args, Debug)]
pub struct SnapshotBenchArgs {
    /// MiB of guest RAM.
    #[arg(long, default_value_t = 512)]
    mem_mib: u64,
    /// vCPUs.
    #[arg(long, default_value_t = 2)]
    vcpus: u32,
    /// The downtime limit both sides get, in ms (QEMU's default).
    #[arg(long, default_value_t = 300)]
    downtime_ms: u64,
    /// The writing cell's hot set, in MiB (split between the vCPUs).
    #[arg(long, default_value_t = 128)]
    hot_mib: u64,
    /// The rate at which the writing cell's checker dirties its hot set,
    /// in MiB/s in all.
    #[arg(long, default_value_t = 16)]
    rate_mib_s: u64,
    /// Runs of each cell (each a ferry run then a QEMU run).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// The cells to run, in order: idle, writing.
    #[arg(long, value_delimiter = ',', default_value = "idle,writing")]
    cells: Vec<String>,
    /// The QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu: String,
    /// A QEMU of 9.0 or later for a third side, which saves with
    /// `mapped-ram` (a `file:` URI, a fixed place per page) and restores
    /// from it; `scripts/qemu-trixie.sh` fetches Debian trixie's 10.0.
    /// Without it, that side is not run.
    #[arg(long)]
    qemu_mapped_ram: Option<String>,
    /// The bzImage [default: $SVM_HOST_KERNEL].
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// The initramfs [default: $SVM_HOST_GUEST_INITRD].
    #[arg(long)]
    initrd: Option<PathBuf>,
    /// How long a guest may take to boot to its checker, in seconds.
    #[arg(long, default_value_t = 600)]
    boot_limit_s: u64,
    /// Each side's limit per run (boot, snapshot, restore and 10 s
    /// after), in seconds.
    #[arg(long, default_value_t = 900)]
    limit_s: u64,
    /// Where the report (qemu-snapshot.json, .svg, .html) and each run's
    /// consoles go.
    #[arg(long, default_value = "target/bench/qemu-snapshot")]
    out: PathBuf,
    /// End with the results as one JSON line on stdout.
    #[arg(long)]
    json: bool,
}

/// What one side did on one cell. `None` where it did not get there.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SnapSide {
    /// From asking for the snapshot to the file complete.
    pub snapshot_ms: Option<f64>,
    /// The guest's pause for the snapshot, as its VMM measured it.
    pub pause_ms: Option<f64>,
    /// ferry: of the pause, hashing the paused memory on its own, the
    /// proof that the file holds it (QEMU has no such step).
    pub proof_ms: Option<f64>,
    /// Bytes the file takes on disk.
    pub file_bytes: Option<u64>,
    /// How the restore brought the pages in.
    pub restore_mode: Option<String>,
    /// From starting the restore to the guest's first instruction (ferry:
    /// the restore's call; QEMU: its process's start, to `running`).
    pub restore_ms: Option<f64>,
    /// QEMU: from its monitor answering to `running` (its process's own
    /// start left out, as ferry's figure leaves it out).
    pub restore_from_monitor_ms: Option<f64>,
    /// From starting the restore to every page in (QEMU: as restore_ms).
    pub resident_ms: Option<f64>,
    pub checker_mismatches: Option<u64>,
    pub console_lines_lost: Option<u64>,
    pub kernel_warnings: Vec<String>,
    pub error: Option<String>,
}

impl SnapSide {
    fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// The guest's checks, as the migration benchmark reads them.
    fn checks_from(&mut self, s: Side) {
        self.checker_mismatches = s.checker_mismatches;
        self.console_lines_lost = s.console_lines_lost;
        self.kernel_warnings = s.kernel_warnings;
        if let Some(e) = s.error {
            self.error.get_or_insert(e);
        }
    }
}

/// One cell's result.
#[derive(Clone, Debug, Serialize)]
pub struct SnapResult {
    pub cell: String,
    pub run: u32,
    pub guest_mib: u64,
    pub vcpus: u32,
    pub writing: bool,
    pub hot_mib: u64,
    pub rate_mib_s: u64,
    pub downtime_limit_ms: u64,
    pub ferry: SnapSide,
    pub qemu: SnapSide,
    /// QEMU with `mapped-ram`, where `--qemu-mapped-ram` named one.
    pub qemu_mapped_ram: Option<SnapSide>,
}

/// How a QEMU side writes its file and reads it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QemuFile {
    /// 7.2's way: `migrate "exec:cat > FILE"` and `-incoming "exec:cat
    /// FILE"`, one stream in which a page dirtied again is written again.
    Stream,
    /// 9.0 on: the `mapped-ram` capability on both sides and `file:FILE`,
    /// a fixed place per page that a later round overwrites (QEMU's
    /// `docs/devel/migration/mapped-ram.rst`); the destination takes it
    /// with `-incoming defer`, the capability, then `migrate-incoming`.
    MappedRam,
}

impl QemuFile {
    fn name(self) -> &'static str {
        match self {
            QemuFile::Stream => "qemu",
            QemuFile::MappedRam => "qemu-mapped-ram",
        }
    }

    /// As the table names the side.
    fn label(self) -> &'static str {
        match self {
            QemuFile::Stream => "QEMU",
            QemuFile::MappedRam => "QEMU mapped-ram",
        }
    }
}

pub fn bench(a: SnapshotBenchArgs) -> Result<(), String> {
    minivmm::linux::check_host().map_err(|e| e.to_string())?;
    let kernel = super::super::guest::given_or_env(&a.kernel, "SVM_HOST_KERNEL", "kernel")?;
    let initrd = super::super::guest::given_or_env(&a.initrd, "SVM_HOST_GUEST_INITRD", "initrd")?;
    if a.vcpus == 0 || a.hot_mib < u64::from(a.vcpus) || a.rate_mib_s == 0 {
        return Err(
            "--vcpus, --rate-mib-s and --hot-mib (at least a MiB per vCPU) must be positive".into(),
        );
    }
    Command::new(&a.qemu)
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("{}: {e} (Debian's qemu-system-x86)", a.qemu))?;
    if let Some(q) = &a.qemu_mapped_ram {
        let out = Command::new(q)
            .arg("--version")
            .output()
            .map_err(|e| format!("--qemu-mapped-ram {q}: {e} (scripts/qemu-trixie.sh)"))?;
        let version = String::from_utf8_lossy(&out.stdout);
        eprintln!(
            "minivmm bench qemu-snapshot: mapped-ram side: {}",
            version.lines().next().unwrap_or("?")
        );
    }
    let cells = [
        Cell {
            name: "idle",
            writing: false,
            mib_per_vcpu: 1,
            rate_mib_s: super::IDLE_RATE_MIB_S,
            bandwidth_mib_s: 0,
            downtime_ms: a.downtime_ms,
            ferry_harvest_within_rounds: false,
        },
        Cell {
            name: "writing",
            writing: true,
            mib_per_vcpu: a.hot_mib / u64::from(a.vcpus),
            rate_mib_s: a.rate_mib_s,
            bandwidth_mib_s: 0,
            downtime_ms: a.downtime_ms,
            ferry_harvest_within_rounds: false,
        },
    ];
    let cells: Vec<&Cell> = a
        .cells
        .iter()
        .map(|c| {
            cells
                .iter()
                .find(|k| k.name == c.as_str())
                .ok_or(format!("--cells: no cell {c:?} (idle, writing)"))
        })
        .collect::<Result<_, _>>()?;
    let scratch = std::env::temp_dir().join(format!("minivmm-bench-snap-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let limit = Duration::from_secs(a.limit_s);
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
            let result = |ferry: SnapSide, qemu: SnapSide, mapped: Option<SnapSide>| SnapResult {
                cell: cell.name.into(),
                run,
                guest_mib: a.mem_mib,
                vcpus: a.vcpus,
                writing: cell.writing,
                hot_mib: cell.mib_per_vcpu * u64::from(a.vcpus),
                rate_mib_s: cell.rate_mib_s,
                downtime_limit_ms: cell.downtime_ms,
                ferry,
                qemu,
                qemu_mapped_ram: mapped,
            };
            eprintln!(
                "minivmm bench qemu-snapshot: {} (run {run}): ferry ...",
                cell.name
            );
            fresh_disk(&guest.disk)?;
            let ferry = ferry_side(&guest, cell, limit, &dir);
            eprintln!(
                "minivmm bench qemu-snapshot: {} (run {run}): ferry {}; QEMU ...",
                cell.name,
                brief(&ferry)
            );
            // ferry's side on record before QEMU's run: the emulated host
            // has frozen under QEMU before (docs/svm-host.md).
            let pending = SnapSide {
                error: Some(super::QEMU_PENDING.into()),
                ..SnapSide::default()
            };
            let mapped_pending = a.qemu_mapped_ram.as_ref().map(|_| pending.clone());
            // Each QEMU side runs with the sides before it on record.
            let mut qemu_after = |so_far: SnapResult, binary: &str, how: QemuFile| {
                results.push(so_far);
                write(&results, &a.out, false)?;
                results.pop();
                fresh_disk(&guest.disk)?;
                let side = qemu_side(binary, how, &guest, cell, limit, &dir);
                eprintln!(
                    "minivmm bench qemu-snapshot: {} (run {run}): {} {}",
                    cell.name,
                    how.label(),
                    brief(&side)
                );
                Ok::<_, String>(side)
            };
            let so_far = result(ferry.clone(), pending, mapped_pending.clone());
            let qemu = qemu_after(so_far, &a.qemu, QemuFile::Stream)?;
            let mapped = match &a.qemu_mapped_ram {
                None => None,
                Some(q) => {
                    let so_far = result(ferry.clone(), qemu.clone(), mapped_pending);
                    Some(qemu_after(so_far, q, QemuFile::MappedRam)?)
                }
            };
            results.push(result(ferry, qemu, mapped));
            write(&results, &a.out, false)?;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    write(&results, &a.out, a.json)
}

/// ferry's side: `minivmm demo --guest linux --snapshot`, its summary read
/// back.
fn ferry_side(guest: &Guest, cell: &Cell, limit: Duration, dir: &Path) -> SnapSide {
    let mut side = SnapSide::default();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            side.error = Some(e.to_string());
            return side;
        }
    };
    let run_dir = dir.join("ferry");
    let _ = std::fs::create_dir_all(&run_dir);
    let mut cmd = Command::new(exe);
    cmd.args(["demo", "--guest", "linux", "--json", "--snapshot"])
        .args(["--vcpus", &guest.vcpus.to_string()])
        .args(["--mem-mib", &guest.mem_mib.to_string()])
        .args(["--downtime-ms", &cell.downtime_ms.to_string()])
        .args(["--cmdline", &guest.cmdline])
        .arg("--kernel")
        .arg(&guest.kernel)
        .arg("--initrd")
        .arg(&guest.initrd)
        .arg("--dir")
        .arg(&run_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let out = match run_within(cmd, limit) {
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
    let (s, r) = (&j["snapshot"], &j["restore"]);
    side.snapshot_ms = s["total_ms"].as_f64();
    side.pause_ms = s["pause_ms"].as_f64();
    side.proof_ms = s["digest_ms"].as_f64();
    side.file_bytes = s["bytes"].as_u64();
    side.restore_mode = r["mode"].as_str().map(String::from);
    side.restore_ms = r["first_instruction_ms"].as_f64();
    side.resident_ms = r["resident_ms"].as_f64();
    side.checker_mismatches = j["checker_mismatches"].as_u64();
    side.console_lines_lost = j["console_lines_lost"].as_u64();
    side.kernel_warnings = serde_json::from_value(j["kernel_warnings"].clone()).unwrap_or_default();
    side.error = j["error"].as_str().map(String::from);
    side
}

/// A QEMU side: saved to a file the way `how` says, restored by a new
/// QEMU from it.
fn qemu_side(
    qemu: &str,
    how: QemuFile,
    guest: &Guest,
    cell: &Cell,
    limit: Duration,
    dir: &Path,
) -> SnapSide {
    let mut side = SnapSide {
        restore_mode: Some(match how {
            QemuFile::Stream => "eager".into(),
            QemuFile::MappedRam => "eager, mapped-ram".into(),
        }),
        ..SnapSide::default()
    };
    // On the scratch disk, not the 9p share, as ferry's file is.
    let file = guest.scratch.join(format!("{}.snap", how.name()));
    if let Err(e) = save_and_restore(qemu, how, guest, cell, limit, dir, &file, &mut side) {
        side.error = Some(e);
    }
    let _ = std::fs::remove_file(&file);
    side
}

#[allow(clippy::too_many_arguments)]
fn save_and_restore(
    qemu: &str,
    how: QemuFile,
    guest: &Guest,
    cell: &Cell,
    limit: Duration,
    dir: &Path,
    file: &Path,
    side: &mut SnapSide,
) -> Result<(), String> {
    let _ = std::fs::remove_file(file);
    let name = how.name();
    let mut source = Qemu::start(qemu, guest, dir, &format!("{name}-source"), None)?;
    source
        .wait_console(guest.boot_limit, |t| checker_lines(t, 3))
        .map_err(|e| format!("the guest did not boot to its checker: {e}"))?;
    let mut qmp = Qmp::connect(&source.qmp, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    let mut capabilities = vec![json!({ "capability": "auto-converge", "state": true })];
    if how == QemuFile::MappedRam {
        capabilities.push(mapped_ram());
    }
    qmp.cmd(
        "migrate-set-capabilities",
        json!({ "capabilities": capabilities }),
    )
    .map_err(|e| e.to_string())?;
    // No cap, as ferry's snapshot has none (QEMU's default is 128 MiB/s).
    qmp.cmd(
        "migrate-set-parameters",
        json!({ "max-bandwidth": 100u64 << 30, "downtime-limit": cell.downtime_ms }),
    )
    .map_err(|e| e.to_string())?;
    let uri = match how {
        QemuFile::Stream => format!("exec:cat > {}", file.display()),
        QemuFile::MappedRam => format!("file:{}", file.display()),
    };
    qmp.cmd("migrate", json!({ "uri": uri }))
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let info = loop {
        let info = qmp
            .cmd("query-migrate", json!({}))
            .map_err(|e| e.to_string())?;
        match info["status"].as_str() {
            Some("completed") => break info,
            Some("failed") | Some("cancelled") => {
                return Err(format!(
                    "QEMU's snapshot ended {}: {}",
                    info["status"], info["error-desc"]
                ));
            }
            _ => {}
        }
        if started.elapsed() > limit {
            let _ = qmp.cmd("migrate_cancel", json!({}));
            return Err(format!(
                "the snapshot did not complete within {} s",
                limit.as_secs()
            ));
        }
        std::thread::sleep(POLL);
    };
    side.snapshot_ms = info["total-time"].as_f64();
    side.pause_ms = info["downtime"].as_f64();
    side.file_bytes = std::fs::metadata(file).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.blocks() * 512
    });
    let _ = qmp.cmd("quit", json!({}));
    drop(qmp);
    let _ = source.child.wait();

    let t = Instant::now();
    let incoming = match how {
        QemuFile::Stream => format!("exec:cat {}", file.display()),
        QemuFile::MappedRam => "defer".into(),
    };
    let dest_name = format!("{name}-destination");
    let mut dest = Qemu::start(qemu, guest, dir, &dest_name, Some(&incoming))?;
    let mut qmp = Qmp::connect(&dest.qmp, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let monitor = Instant::now();
    if how == QemuFile::MappedRam {
        qmp.cmd(
            "migrate-set-capabilities",
            json!({ "capabilities": [mapped_ram()] }),
        )
        .map_err(|e| e.to_string())?;
        let uri = format!("file:{}", file.display());
        qmp.cmd("migrate-incoming", json!({ "uri": uri }))
            .map_err(|e| e.to_string())?;
    }
    loop {
        let status = qmp
            .cmd("query-status", json!({}))
            .map_err(|e| e.to_string())?;
        if status["status"] == "running" {
            break;
        }
        if t.elapsed() > limit {
            return Err(format!(
                "the restored guest was not running within {} s (status {})",
                limit.as_secs(),
                status["status"]
            ));
        }
        std::thread::sleep(POLL);
    }
    side.restore_ms = Some(t.elapsed().as_secs_f64() * 1e3);
    side.restore_from_monitor_ms = Some(monitor.elapsed().as_secs_f64() * 1e3);
    side.resident_ms = side.restore_ms;
    drop(qmp);
    let mut checks = Side::default();
    let ran = run_on(&mut dest, guest, &mut checks);
    side.checks_from(checks);
    ran
}

/// One line on how a side did.
fn brief(s: &SnapSide) -> String {
    match &s.error {
        None => format!(
            "snapshot {:.1} s (pause {:.0} ms), restored to running in {:.0} ms",
            s.snapshot_ms.unwrap_or(f64::NAN) / 1e3,
            s.pause_ms.unwrap_or(f64::NAN),
            s.restore_ms.unwrap_or(f64::NAN)
        ),
        Some(e) => format!("failed: {e}"),
    }
}

/// Each side a result has, named as the table names it.
fn sides(r: &SnapResult) -> Vec<(&'static str, &SnapSide)> {
    let mut all = vec![("ferry", &r.ferry), (QemuFile::Stream.label(), &r.qemu)];
    if let Some(s) = &r.qemu_mapped_ram {
        all.push((QemuFile::MappedRam.label(), s));
    }
    all
}

/// `qemu / ferry` where both have a value.
fn ratio(ferry: Option<f64>, qemu: Option<f64>) -> String {
    match (ferry, qemu) {
        (Some(f), Some(q)) if f > 0.0 => format!("{:.2}x", q / f),
        _ => "-".into(),
    }
}

/// Prints the table, writes `<out>/qemu-snapshot.{json,svg,html}`, and
/// with `json` prints `{"cells": [...]}` last.
fn write(results: &[SnapResult], out: &Path, json: bool) -> Result<(), String> {
    let mut t = Table::new(
        "ferry (minivmm) and QEMU saving the same Linux guest to a file and restoring it, inside the SVM host",
        &[
            "cell",
            "run",
            "side",
            "snapshot (ms)",
            "pause (ms)",
            "of it, proof (ms)",
            "file (MiB)",
            "restore",
            "to running (ms)",
            "all in (ms)",
            "mismatches",
            "lines lost",
            "QEMU / ferry snapshot",
            "QEMU / ferry to running",
        ],
    );
    for r in results {
        for (name, s) in sides(r) {
            let first = name == "ferry";
            let both = r.ferry.ok() && s.ok();
            t.row(vec![
                if first { r.cell.clone() } else { String::new() },
                if first {
                    r.run.to_string()
                } else {
                    String::new()
                },
                name.into(),
                ms(s.snapshot_ms),
                ms(s.pause_ms),
                ms(s.proof_ms),
                s.file_bytes.map_or("-".into(), |b| (b >> 20).to_string()),
                s.restore_mode.clone().unwrap_or_default(),
                ms(s.restore_ms),
                ms(s.resident_ms),
                s.checker_mismatches.map_or("-".into(), |m| m.to_string()),
                s.console_lines_lost.map_or("-".into(), |m| m.to_string()),
                match (first, both) {
                    (false, true) => ratio(r.ferry.snapshot_ms, s.snapshot_ms),
                    _ => String::new(),
                },
                match (first, both) {
                    (false, true) => ratio(r.ferry.restore_ms, s.restore_ms),
                    _ => String::new(),
                },
            ]);
        }
    }
    if let Some(r) = results.first() {
        let writing = match results.iter().find(|r| r.writing) {
            Some(w) => format!(
                "; the writing cell's checker dirties {} MiB at {} MiB/s",
                w.hot_mib, w.rate_mib_s
            ),
            None => String::new(),
        };
        t.note(format!(
            "{} MiB guest, {} vCPUs; downtime limit {} ms on every side, no bandwidth cap{writing}",
            r.guest_mib, r.vcpus, r.downtime_limit_ms,
        ));
    }
    t.note("ferry: minivmm demo --guest linux --snapshot (the policy its VM declares best; restored lazily, working set first, in a new process). QEMU 7.2: auto-converge, migrate \"exec:cat > FILE\", then a new QEMU with -incoming \"exec:cat FILE\" (eager)");
    if results.iter().any(|r| r.qemu_mapped_ram.is_some()) {
        t.note("QEMU mapped-ram (--qemu-mapped-ram): auto-converge and mapped-ram, migrate \"file:FILE\", then a new QEMU with -incoming defer, mapped-ram, migrate-incoming \"file:FILE\" (eager)");
    }
    t.note("of it, proof: ferry hashes the paused memory on its own and compares it with what the file holds before the pause ends (SnapshotOptions::verify); QEMU has no such check");
    t.note("to running: ferry, from the restore's call to the first guest instruction; QEMU, from its process's start to query-status running (restore_from_monitor_ms in the JSON leaves its process's start out). The pause the guest saw is not compared: ferry's restore sets the guest's clock to the host's time, QEMU's to the saved one");
    for r in results {
        for (name, s) in sides(r) {
            if let Some(e) = &s.error {
                t.note(format!("{} run {}, {name}: {e}", r.cell, r.run));
            }
        }
    }
    let categories: Vec<String> = results
        .iter()
        .map(|r| format!("{} #{}", r.cell, r.run))
        .collect();
    let bar = |s: &SnapSide, v: Option<f64>| match (&s.error, v) {
        (None, Some(v)) => Bar::Value(v),
        _ => Bar::NoValue("failed".into()),
    };
    let mapped = results.iter().any(|r| r.qemu_mapped_ram.is_some());
    let mut groups = vec!["ferry".to_string(), "QEMU".into()];
    if mapped {
        groups.push("QEMU mapped-ram".into());
    }
    let chart = |title: &str, y: &str, f: fn(&SnapSide) -> Option<f64>| Bars {
        title: title.into(),
        y_label: y.into(),
        categories: categories.clone(),
        groups: groups.clone(),
        values: results
            .iter()
            .map(|r| {
                let mut bars = vec![bar(&r.ferry, f(&r.ferry)), bar(&r.qemu, f(&r.qemu))];
                if mapped {
                    bars.push(match &r.qemu_mapped_ram {
                        Some(s) => bar(s, f(s)),
                        None => Bar::NotRun,
                    });
                }
                bars
            })
            .collect(),
        references: Vec::new(),
        reference_label: String::new(),
    };
    let report = Report {
        name: "qemu-snapshot".into(),
        tables: vec![t],
        results: results.to_vec(),
        charts: vec![
            chart("Live snapshot to a file", "seconds", |s| {
                s.snapshot_ms.map(|v| v / 1e3)
            })
            .into(),
            chart("Restore: to the guest running", "milliseconds", |s| {
                s.restore_ms
            })
            .into(),
        ],
    };
    eprintln!("{}", report.render());
    let written = report.write(out).map_err(|e| e.to_string())?;
    eprintln!(
        "minivmm bench qemu-snapshot: wrote {} and {}",
        written.json.display(),
        written.svg.display()
    );
    if json {
        println!("{}", json!({ "cells": results }));
    }
    Ok(())
}
