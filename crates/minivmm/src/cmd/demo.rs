//! `minivmm demo`: a destination and a source as two processes of this
//! binary, over loopback, then every check on what both printed.

use super::expand;
use minivmm::blk::Notify;
use minivmm::checks;
use minivmm::serial::console_path;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// precopy, postcopy, or hybrid.
    #[arg(long, default_value = "precopy")]
    mode: String,
    /// Data connections.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Mutual TLS, with throwaway certificates made for the demo.
    #[arg(long)]
    tls: bool,
    /// Same-host live upgrade: the destination maps the source's memfd
    /// memory over a UNIX socket instead of receiving a copy.
    #[arg(long, conflicts_with_all = ["tls", "connections", "mode"])]
    local: bool,
    /// A snapshot instead of a migration: the source saves the running
    /// guest to a file and ends, then a new process restores it from the
    /// file (`--restore`) and runs it on.
    #[arg(long, conflicts_with_all = ["tls", "connections", "mode", "local"])]
    snapshot: bool,
    /// With --snapshot: how the pages come in: eager, lazy, or
    /// lazy-working-set.
    #[arg(long, default_value = "lazy-working-set", requires = "snapshot")]
    restore: String,
    /// With --snapshot: wait this many seconds between the save and the
    /// restore, as a snapshot kept a while is restored. The guest's clock
    /// moves on by them; a Linux guest held over 20 s takes the hold for a
    /// soft lockup unless the VMM tells it (KVM_KVMCLOCK_CTRL).
    #[arg(long, default_value_t = 0, requires = "snapshot")]
    restore_after_s: u64,
    /// With --local: remove the disk image's path once the source has it
    /// open, before the destination builds its VM. The destination can then
    /// only serve the disk through the fd the source hands over.
    #[arg(long, requires = "local")]
    unlink_disk: bool,
    /// vCPUs (1 to 4), each with its own console and disk, checked on its
    /// own. More vCPUs than host cores time-share them.
    #[arg(long, default_value_t = 2)]
    vcpus: u32,
    /// How disk notifications reach the I/O thread: ioeventfd, exit or
    /// inline (see `minivmm migrate --help`).
    #[arg(long, default_value = "ioeventfd")]
    notify: Notify,
    /// writethrough (each disk write on storage before it completes) or
    /// writeback.
    #[arg(long, default_value = "writethrough")]
    cache: String,
    /// Add the fill device, served by a vhost-user backend process on each
    /// end (guest memory in memfds).
    #[arg(long)]
    vhost: bool,
    /// Testing: leave the fill backend's writes out of the migration (no
    /// vhost-user dirty log): the digest must catch the pages missed.
    #[arg(long, hide = true, requires = "vhost")]
    no_vhost_dirty_log: bool,
    /// MiB of the data region the guest sweeps.
    #[arg(long, default_value_t = 64)]
    data_mib: u64,
    /// What slows the guest if precopy does not converge: none, auto,
    /// dirty-limit or quota (the last two need --dirty-log ring). Default:
    /// the best the VM serves (the quota, with rings).
    #[arg(long)]
    converge: Option<String>,
    /// How the source's KVM tracks the guest's writes: ring (per vCPU, so
    /// it can meter each) or bitmap.
    #[arg(long, default_value = "ring", value_parser = ["ring", "bitmap"])]
    dirty_log: String,
    /// Cap the link at this many MiB/s (0: no cap).
    #[arg(long, default_value_t = 0)]
    bandwidth_mib_s: u64,
    /// The downtime target, in milliseconds.
    #[arg(long, default_value_t = 300)]
    downtime_ms: u64,
    /// Lift the cap while the guest is paused for the switchover, as QEMU
    /// does (see `minivmm migrate --help`).
    #[arg(long)]
    uncapped_pause: bool,
    /// Harvest the dirty log while rounds are sent (see `minivmm migrate
    /// --help`): the full pass leaves a page dirtied ahead of it for the
    /// next round, later rounds send such a page once.
    #[arg(long)]
    harvest_within_rounds: bool,
    /// Measuring: the destination holds no outputs, so the guest stays
    /// paused until the digest's verdict (see `minivmm receive`).
    #[arg(long, hide = true)]
    no_output_gate: bool,
    /// Measuring: the destination's page placement (auto, uffd, write).
    #[arg(long, hide = true, default_value = "auto")]
    placement: String,
    /// Keep the demo's files (disk, consoles, and each end's whole summary
    /// as source.json and destination.json: rounds, throttle, vCPU shares;
    /// and the vCPU traces, source-vcpus.jsonl and, over the network,
    /// destination-vcpus.jsonl, as `--vcpu-trace` writes them; for a Linux
    /// guest, the host's time of each checker line and of the pause,
    /// console-stamps.jsonl)
    /// here instead of a fresh temporary directory that is removed
    /// afterwards.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// End with the summary as one JSON line on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    guest: super::guest::GuestArgs,
}

impl DemoArgs {
    /// How the guest moves, as the summary names it.
    fn mode_name(&self) -> &str {
        match (self.snapshot, self.local) {
            (true, _) => "snapshot",
            (false, true) => "local",
            (false, false) => &self.mode,
        }
    }
}

pub fn demo(a: DemoArgs) -> Result<(), String> {
    let (dir, temporary) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("minivmm-demo-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = run_demo(&a, &dir);
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn run_demo(a: &DemoArgs, dir: &Path) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let (src_console, dst_console) = (dir.join("source.console"), dir.join("destination.console"));
    let disk = dir.join("disk.img");
    let _ = std::fs::remove_file(&disk);
    let mut tls = Vec::new();
    if a.tls {
        let certs = dir.join("tls");
        let _ = std::fs::remove_dir_all(&certs);
        ferry_engine::transport::tls::pki::write_throwaway(&certs, &[])
            .map_err(|e| e.to_string())?;
        tls = vec!["--tls".into(), certs.display().to_string()];
    }

    // The host's time of each checker line, to place the guest's pause.
    let stamper = a
        .guest
        .is_linux()
        .then(|| super::stamps::Stamper::follow(dir, "source.console", "destination.console"));
    let ends = match a.snapshot {
        true => snapshot_ends(a, dir, &exe, (&src_console, &dst_console), &disk),
        false => migration_ends(a, dir, &exe, (&src_console, &dst_console), &disk, tls),
    };
    let stamps = stamper.map(|s| s.finish()).unwrap_or_default();
    let (src_json, dest_json, dest_ok) = ends?;
    if a.guest.is_linux() {
        return linux_summary(
            a,
            (&src_json, &dest_json, dest_ok),
            (&src_console, &dst_console),
            stamps,
        );
    }

    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let mut console = checks::ConsoleCheck::default();
    let mut disk = checks::DiskCheck::default();
    let mut per_vcpu = Vec::new();
    for i in 0..a.vcpus {
        let text = read(&console_path(&src_console, i)) + &read(&console_path(&dst_console, i));
        let c = checks::console(&text);
        let journal: Vec<u64> = [&src_json, &dest_json]
            .iter()
            .flat_map(|j| {
                let runs: Vec<[u64; 2]> =
                    serde_json::from_value(j["disk_runs"][i as usize].clone()).unwrap_or_default();
                expand(&runs)
            })
            .collect();
        let d = checks::disk(&journal);
        console.add(&c);
        disk.add(&d);
        per_vcpu.push(serde_json::json!({ "console": c, "disk": d }));
    }
    let bad_reads = dest_json["guest"]["bad_reads"].as_u64().unwrap_or(0)
        + src_json["guest"]["bad_reads"].as_u64().unwrap_or(0);
    let digest_match = src_json["digest_match"] == true && dest_json["digest_match"] == true;
    // The guest's fill counters travel with its memory: the destination's
    // cover the whole run, or the source's if the VM never left.
    let fills = match dest_json["guest"]["fills"].as_u64() {
        Some(_) => dest_json["guest"].clone(),
        None => src_json["guest"].clone(),
    };
    let postcopy_blocked = src_json["error"]
        .as_str()
        .filter(|e| e.contains("postcopy"))
        .filter(|_| a.vhost && a.mode != "precopy")
        .map(String::from);
    let completed = src_json["status"] == "completed" && dest_ok;
    let mode = a.mode_name();
    let summary = serde_json::json!({
        "vcpus": a.vcpus,
        "notify": a.notify,
        "mode": mode,
        "connections": a.connections,
        "tls": a.tls,
        "status": src_json["status"],
        "digest_match": digest_match,
        "downtime_ms": src_json["downtime_ms"],
        // How long the destination held the guest's disk and console
        // output while it ran before the digest's verdict.
        "outputs_held_ms": dest_json["summary"]["outputs_held_ms"],
        "total_ms": src_json["total_ms"],
        "sections": dest_json["sections"],
        "disk_unlinked": a.unlink_disk,
        "console_lines": console.lines,
        "console_lines_lost": console.lost,
        "console_lines_doubled": console.doubled,
        "console_lines_bad": console.bad,
        "blk_requests": disk.requests,
        "blk_requests_lost": disk.lost,
        "blk_requests_doubled": disk.doubled,
        "blk_bad_reads": bad_reads,
        "source_console_lines": src_json["guest"]["console_lines"],
        "destination_console_lines": dest_json["guest"]["console_lines"],
        "requests_in_flight_at_pause": src_json["requests_in_flight_at_pause"],
        "vhost": a.vhost,
        "vhost_requests": fills["fills"],
        "vhost_requests_lost": fills["fills_lost"],
        "vhost_requests_doubled": fills["fills_doubled"],
        "vhost_bad_fills": fills["fills_bad"],
        "vhost_failure": src_json["vhost_failure"],
        "vhost_postcopy_faults": dest_json["summary"]["postcopy"]["device_faults"],
        // A lazy restore's: the backend's touches of pages not yet in.
        "vhost_restore_faults": dest_json["summary"]["device_faults"],
        "postcopy_blocked": postcopy_blocked,
        "error": src_json["error"],
        "notify_exits": src_json["notify_exits"],
        "per_vcpu": per_vcpu,
    });
    eprintln!(
        "minivmm demo ({} vCPUs, {} {}{}): {}, digest {}, downtime {:.1} ms; console {} lines, {} lost, {} doubled; disk {} writes, {} lost, {} doubled, {} bad reads",
        a.vcpus,
        mode,
        a.connections,
        if a.tls { ", tls" } else { "" },
        summary["status"].as_str().unwrap_or("?"),
        if digest_match { "match" } else { "MISMATCH" },
        summary["downtime_ms"].as_f64().unwrap_or(f64::NAN),
        console.lines,
        console.lost,
        console.doubled,
        disk.requests,
        disk.lost,
        disk.doubled,
        bad_reads
    );
    if a.json {
        println!("{summary}");
    }
    let fills_clean = ["fills_lost", "fills_doubled", "fills_bad"]
        .iter()
        .all(|k| fills[k].as_u64().unwrap_or(0) == 0);
    let streams_clean = console.lost + console.doubled + console.bad == 0
        && disk.lost + disk.doubled + bad_reads == 0
        && fills_clean;
    // A postcopy the fill device blocks, refused before anything moved,
    // with the source's guest running on whole, is the answer asked for.
    let blocked_cleanly = postcopy_blocked.is_some() && streams_clean;
    let clean = (completed && digest_match && streams_clean) || blocked_cleanly;
    if clean {
        Ok(())
    } else {
        Err("the demo's checks failed (see the summary)".into())
    }
}

/// The summary of a Linux guest's move ([`super::demo_linux`]).
fn linux_summary(
    a: &DemoArgs,
    (src_json, dest_json, dest_ok): (&serde_json::Value, &serde_json::Value, bool),
    (src_console, dst_console): (&Path, &Path),
    stamps: Vec<super::stamps::Stamp>,
) -> Result<(), String> {
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    if let Some(dir) = &a.dir {
        let paused = src_json["paused_unix_ms"].as_f64();
        super::stamps::keep(&dir.join("console-stamps.jsonl"), &stamps, paused);
        for (name, j) in [("source.json", src_json), ("destination.json", dest_json)] {
            let path = dir.join(name);
            if let Err(e) = std::fs::write(&path, format!("{j:#}\n")) {
                eprintln!("minivmm demo: {}: {e}", path.display());
            }
        }
    }
    let ends = super::demo_linux::Ends {
        source: src_json,
        destination: dest_json,
        destination_ok: dest_ok,
        source_console: read(src_console),
        destination_console: read(dst_console),
        stamps,
    };
    let mode = a.mode_name();
    let (summary, clean) = super::demo_linux::summarize(mode, a.vcpus, &ends);
    eprintln!(
        "minivmm demo (Linux {}, {} vCPUs, {mode}): {}, digest {}, downtime {:.1} ms, the guest saw {:.1} ms; checker lines {} ({} lost, {} doubled, {} bad), {} mismatches; disk {} records ({} lost, {} doubled, {} bad reads); {} kernel warnings; guest {}",
        summary["kernel"].as_str().unwrap_or("?"),
        a.vcpus,
        summary["status"].as_str().unwrap_or("?"),
        if summary["digest_match"] == true { "match" } else { "MISMATCH" },
        summary["downtime_ms"].as_f64().unwrap_or(f64::NAN),
        summary["guest_pause_ms"].as_f64().unwrap_or(f64::NAN),
        summary["console_lines"],
        summary["console_lines_lost"],
        summary["console_lines_doubled"],
        summary["console_lines_bad"],
        summary["checker_mismatches"],
        summary["blk_requests"],
        summary["blk_requests_lost"],
        summary["blk_requests_doubled"],
        summary["blk_bad_reads"],
        summary["kernel_warnings"].as_array().map_or(0, Vec::len),
        summary["guest_exit"].as_str().unwrap_or("did not power off"),
    );
    if a.json {
        println!("{summary}");
    }
    match (clean, summary["error"].as_str()) {
        (true, _) => Ok(()),
        (false, Some(e)) => Err(format!("the Linux guest's move failed: {e}")),
        (false, None) => Err("the demo's checks failed (see the summary)".into()),
    }
}

/// A child process that is killed and reaped if the demo leaves early, so
/// that an error never leaves a destination waiting for a source that will
/// not come (it holds the demo's stderr, and whoever reads it would wait
/// with it).
struct Reaped(Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits for `child` and returns the last JSON line it printed.
fn last_json(child: &mut Child, what: &str) -> Result<serde_json::Value, String> {
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        std::io::Read::read_to_string(&mut out, &mut stdout)
            .map_err(|e| format!("the {what}: {e}"))?;
    }
    let status = child.wait().map_err(|e| format!("the {what}: {e}"))?;
    ferry_harness::output::last_json(&stdout)
        .ok_or_else(|| format!("the {what} printed no summary (exit {status})"))
}

/// Waits until `child` has `path` open, then removes the path. No clock
/// decides: a slow host (the SVM host runs at TCG speed) only makes it
/// wait longer, and a child that exits first ends the wait.
fn unlink_once_open(child: &mut Child, path: &Path) -> Result<(), String> {
    // The image may not exist yet (the source makes it): name it by its
    // directory's real path.
    let want = path
        .parent()
        .and_then(|d| std::fs::canonicalize(d).ok())
        .zip(path.file_name())
        .map(|(d, f)| d.join(f))
        .ok_or_else(|| format!("{}: no such directory", path.display()))?;
    let pid = child.id();
    loop {
        let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| std::fs::read_link(e.path()).ok().as_ref() == Some(&want));
        if open {
            return std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()));
        }
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!(
                "the source exited ({status}) before it opened {}",
                path.display()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The two ends of a migration: a destination listening, a source that
/// boots the guest and moves it there. Returns what each printed last,
/// and whether the destination exited 0.
fn migration_ends(
    a: &DemoArgs,
    dir: &Path,
    exe: &Path,
    (src_console, dst_console): (&Path, &Path),
    disk: &Path,
    tls: Vec<String>,
) -> Result<(serde_json::Value, serde_json::Value, bool), String> {
    let socket = dir.join("local.sock");
    let at: Vec<String> = if a.local {
        vec!["--local".into(), socket.display().to_string()]
    } else {
        vec!["--listen".into(), "127.0.0.1:0".into()]
    };
    let mut dest = Reaped(
        Command::new(exe)
            .args(["receive", "--json", "--console"])
            .arg(dst_console)
            .args(&at)
            .args(&tls)
            .args(a.no_output_gate.then_some("--no-output-gate"))
            .args(dest_trace(a))
            .args(["--placement", &a.placement])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the destination: {e}"))?,
    );
    let mut dest_out = BufReader::new(dest.stdout.take().expect("piped"));
    let mut first = String::new();
    dest_out
        .read_line(&mut first)
        .map_err(|e| format!("the destination said nothing: {e}"))?;
    let addr = serde_json::from_str::<serde_json::Value>(&first)
        .ok()
        .and_then(|v| v["listening"].as_str().map(String::from))
        .ok_or_else(|| format!("the destination did not say where it listens: {first:?}"))?;

    let mut src_args: Vec<String> = if a.local {
        let memfd = ["--backing", "memfd"].map(String::from);
        [
            vec!["migrate".into(), "--local".into(), addr],
            memfd.to_vec(),
        ]
        .concat()
    } else {
        let mode = [
            "--mode",
            &a.mode,
            "--connections",
            &a.connections.to_string(),
        ]
        .map(String::from);
        [vec!["migrate".into(), "--to".into(), addr], mode.to_vec()].concat()
    };
    src_args.extend(source_args(a, disk, src_console));
    src_args.extend(tls);
    let mut src = Reaped(
        Command::new(exe)
            .args(&src_args)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the source: {e}"))?,
    );
    if a.unlink_disk {
        unlink_once_open(&mut src, disk)?;
    }
    let src_json = last_json(&mut src, "source")?;
    if src_json["status"] != "completed" {
        // A source refused before it connected leaves the destination
        // waiting: give it a moment to end on its own, then end it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while dest.try_wait().map_err(|e| e.to_string())?.is_none()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = dest.kill();
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut dest_out, &mut rest).map_err(|e| e.to_string())?;
    let dest_ok = dest.wait().map_err(|e| e.to_string())?.success();
    let dest_json = ferry_harness::output::last_json(&rest).filter(|j| j["role"] == "destination");
    if dest_json.is_none() && src_json["status"] == "completed" {
        return Err("the destination printed no summary".into());
    }
    let dest_json = dest_json.unwrap_or(serde_json::Value::Null);
    Ok((src_json, dest_json, dest_ok))
}

/// The two ends of a snapshot: a source that boots the guest, saves it to
/// a file and ends, then a process that restores it from the file and
/// runs it on. Returns what each printed last, and whether the second
/// exited 0.
fn snapshot_ends(
    a: &DemoArgs,
    dir: &Path,
    exe: &Path,
    (src_console, dst_console): (&Path, &Path),
    disk: &Path,
) -> Result<(serde_json::Value, serde_json::Value, bool), String> {
    let file = dir.join("guest.snap");
    let _ = std::fs::remove_file(&file);
    let mut src_args: Vec<String> = vec!["migrate".into(), "--snapshot".into()];
    src_args.push(file.display().to_string());
    src_args.extend(source_args(a, disk, src_console));
    let mut src = Reaped(
        Command::new(exe)
            .args(&src_args)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the source: {e}"))?,
    );
    let src_json = last_json(&mut src, "source")?;
    if src_json["status"] != "completed" {
        return Ok((src_json, serde_json::Value::Null, false));
    }
    if a.restore_after_s > 0 {
        eprintln!(
            "minivmm demo: the snapshot waits {} s before its restore",
            a.restore_after_s
        );
        std::thread::sleep(std::time::Duration::from_secs(a.restore_after_s));
    }
    let mut dest = Reaped(
        Command::new(exe)
            .args(["receive", "--json", "--console"])
            .arg(dst_console)
            .arg("--from-snapshot")
            .arg(&file)
            .args(["--restore", &a.restore])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the restore: {e}"))?,
    );
    let mut out = String::new();
    if let Some(mut o) = dest.stdout.take() {
        std::io::Read::read_to_string(&mut o, &mut out).map_err(|e| e.to_string())?;
    }
    let dest_ok = dest.wait().map_err(|e| e.to_string())?.success();
    let dest_json = ferry_harness::output::last_json(&out)
        .filter(|j| j["role"] == "destination")
        .ok_or("the restored VM printed no summary")?;
    let _ = std::fs::remove_file(&file);
    Ok((src_json, dest_json, dest_ok))
}

/// What both kinds of source take: the guest, its devices, the link.
fn source_args(a: &DemoArgs, disk: &Path, src_console: &Path) -> Vec<String> {
    let mut src_args = Vec::new();
    src_args.extend([
        "--json".into(),
        "--vcpus".into(),
        a.vcpus.to_string(),
        "--notify".into(),
        a.notify.to_string(),
        "--cache".into(),
        a.cache.clone(),
        "--data-mib".into(),
        a.data_mib.to_string(),
        "--bandwidth-mib-s".into(),
        a.bandwidth_mib_s.to_string(),
        "--downtime-ms".into(),
        a.downtime_ms.to_string(),
        "--disk".into(),
        disk.display().to_string(),
        "--console".into(),
        src_console.display().to_string(),
    ]);
    if a.vhost {
        src_args.push("--vhost".into());
        if !a.local {
            src_args.extend(["--backing".into(), "memfd".into()]);
        }
    }
    if a.uncapped_pause {
        src_args.push("--uncapped-pause".into());
    }
    if a.harvest_within_rounds {
        src_args.push("--harvest-within-rounds".into());
    }
    if a.no_vhost_dirty_log {
        src_args.push("--no-vhost-dirty-log".into());
    }
    if let Some(c) = &a.converge {
        src_args.extend(["--converge".into(), c.clone()]);
    }
    src_args.extend(["--dirty-log".into(), a.dirty_log.clone()]);
    if let Some(kept) = &a.dir {
        // Kept runs keep where the source's vCPUs spent their time.
        let trace = kept.join("source-vcpus.jsonl");
        src_args.extend(["--vcpu-trace".into(), trace.display().to_string()]);
    }
    src_args.extend(a.guest.to_args());
    src_args
}

/// A kept run keeps the destination's vCPU trace too, for the pause its
/// guest sees after the move (destination-vcpus.jsonl).
fn dest_trace(a: &DemoArgs) -> Vec<String> {
    match (&a.dir, a.local) {
        (Some(kept), false) => {
            let trace = kept.join("destination-vcpus.jsonl");
            vec!["--vcpu-trace".into(), trace.display().to_string()]
        }
        _ => Vec::new(),
    }
}
