//! One cell under QEMU: a source and a destination QEMU (`-accel kvm`,
//! the microvm machine with ACPI, so the guest finds its virtio-mmio disk
//! the way it does under minivmm: `LNRO0005` in the DSDT), the guest
//! migrated between them by QMP's `migrate tcp:` over loopback with
//! QEMU's best convergence setting.

use super::qmp::Qmp;
use super::{Cell, Guest, Side};
use serde_json::json;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the migration's state is polled.
const POLL: Duration = Duration::from_millis(100);

/// A QEMU process with its console (serial on stdio) captured, killed when
/// dropped.
pub(super) struct Qemu {
    pub(super) child: Child,
    console: Arc<Mutex<String>>,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) qmp: PathBuf,
}

impl Qemu {
    /// Starts QEMU on `guest`, its console captured into `dir/name.console`;
    /// with `incoming`, waiting for the guest's state at that URI
    /// (`tcp:HOST:PORT`, `exec:COMMAND`).
    pub(super) fn start(
        qemu: &str,
        guest: &Guest,
        dir: &Path,
        name: &str,
        incoming: Option<&str>,
    ) -> Result<Qemu, String> {
        // UNIX sockets cannot live on the SVM host's 9p share: the
        // monitor's goes in the scratch directory beside the disk.
        let qmp = guest.scratch.join(format!("{name}.qmp"));
        let _ = std::fs::remove_file(&qmp);
        let mut cmd = Command::new(qemu);
        cmd.args(["-accel", "kvm", "-cpu", "host"])
            // acpi: the DSDT describes the disk; no virtio_mmio.device= on
            // the command line (Debian's kernel has no use for it).
            .args(["-machine", "microvm,acpi=on,auto-kernel-cmdline=off"])
            .args([
                "-smp",
                &guest.vcpus.to_string(),
                "-m",
                &guest.mem_mib.to_string(),
            ])
            .args(["-nodefaults", "-no-user-config", "-display", "none"])
            .arg("-kernel")
            .arg(&guest.kernel)
            .arg("-initrd")
            .arg(&guest.initrd)
            .args(["-append", &guest.cmdline])
            .args([
                "-chardev",
                "stdio,id=console,signal=off",
                "-serial",
                "chardev:console",
            ])
            .arg("-drive")
            .arg(format!(
                "file={},format=raw,if=none,id=vda,cache=writeback",
                guest.disk.display()
            ))
            .args(["-device", "virtio-blk-device,drive=vda"])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()));
        if let Some(uri) = incoming {
            cmd.args(["-incoming", uri]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {qemu}: {e}"))?;
        let console = Arc::new(Mutex::new(String::new()));
        let log = dir.join(format!("{name}.console"));
        for out in [
            Box::new(child.stdout.take().expect("piped")) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().expect("piped")),
        ] {
            let (console, log) = (Arc::clone(&console), log.clone());
            std::thread::spawn(move || capture(out, &console, &log));
        }
        let stdin = child.stdin.take();
        Ok(Qemu {
            child,
            console,
            stdin,
            qmp,
        })
    }

    pub(super) fn console(&self) -> String {
        self.console
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until `done` holds for the console, the process exits, or
    /// `limit` passes; says which.
    pub(super) fn wait_console(
        &mut self,
        limit: Duration,
        done: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if done(&self.console()) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // What it printed last may still be on its way.
                std::thread::sleep(Duration::from_millis(200));
                return match done(&self.console()) {
                    true => Ok(()),
                    false => Err(format!("QEMU exited ({status}): {}", tail(&self.console()))),
                };
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not within {} s: {}",
                    limit.as_secs(),
                    tail(&self.console())
                ));
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Appends what `out` says to `console` and to the file `log`.
fn capture(mut out: Box<dyn Read + Send>, console: &Mutex<String>, log: &Path) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .ok();
    let mut buf = [0u8; 4096];
    while let Ok(n) = out.read(&mut buf) {
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf[..n]);
        console
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_str(&text);
        if let Some(f) = file.as_mut() {
            let _ = f.write_all(&buf[..n]);
        }
    }
}

/// The last lines of `text`, for an error.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// A free loopback port (bound, then released for QEMU to take).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Whether `text` holds `n` of the checker's numbered lines.
pub(super) fn checker_lines(text: &str, n: usize) -> bool {
    use ferry_guest_checker::line::Line;
    text.lines()
        .filter_map(Line::parse)
        .filter(Result::is_ok)
        .count()
        >= n
}

/// Runs `cell` under QEMU with `limit` for the migration itself.
pub fn run(qemu: &str, guest: &Guest, cell: &Cell, limit: Duration, dir: &Path) -> Side {
    let mut side = Side {
        limit_s: Some(limit.as_secs_f64()),
        ..Side::default()
    };
    let stamper =
        super::stamps::Stamper::follow(dir, "qemu-source.console", "qemu-destination.console");
    let mut paused_unix_ms = None;
    if let Err(e) = migrate(
        qemu,
        guest,
        cell,
        limit,
        dir,
        &mut side,
        &mut paused_unix_ms,
    ) {
        side.error = Some(e);
    }
    let stamps = stamper.finish();
    super::stamps::keep(
        &dir.join("qemu-console-stamps.jsonl"),
        &stamps,
        paused_unix_ms,
    );
    side.place_pause(&stamps, paused_unix_ms);
    side
}

fn migrate(
    qemu: &str,
    guest: &Guest,
    cell: &Cell,
    limit: Duration,
    dir: &Path,
    side: &mut Side,
    paused_unix_ms: &mut Option<f64>,
) -> Result<(), String> {
    let mut source = Qemu::start(qemu, guest, dir, "qemu-source", None)?;
    source
        .wait_console(guest.boot_limit, |t| checker_lines(t, 3))
        .map_err(|e| format!("the source's guest did not boot to its checker: {e}"))?;
    let port = free_port()?;
    let uri = format!("tcp:127.0.0.1:{port}");
    let mut dest = Qemu::start(qemu, guest, dir, "qemu-destination", Some(&uri))?;
    let mut qmp = Qmp::connect(&source.qmp, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    // Dial the destination's monitor too: it is up before the move starts.
    let _dest_qmp = Qmp::connect(&dest.qmp, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    qmp.cmd(
        "migrate-set-capabilities",
        json!({ "capabilities": [{ "capability": "auto-converge", "state": true }] }),
    )
    .map_err(|e| e.to_string())?;
    qmp.cmd(
        "migrate-set-parameters",
        json!({
            "max-bandwidth": cell.bandwidth_mib_s << 20,
            "downtime-limit": cell.downtime_ms,
        }),
    )
    .map_err(|e| e.to_string())?;
    qmp.cmd("migrate", json!({ "uri": format!("tcp:127.0.0.1:{port}") }))
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let pid = source.child.id().to_string();
    let info = loop {
        let info = qmp.cmd("query-migrate", json!({})).map_err(|e| {
            format!(
                "{e}; the source QEMU's threads: {}",
                super::process_threads(&pid)
            )
        })?;
        let pct = info["cpu-throttle-percentage"].as_u64();
        side.throttle_pct = side.throttle_pct.max(pct);
        match info["status"].as_str() {
            Some("completed") => break info,
            Some("failed") | Some("cancelled") => {
                return Err(format!(
                    "QEMU's migration ended {}: {}",
                    info["status"], info["error-desc"]
                ));
            }
            _ => {}
        }
        if started.elapsed() > limit {
            let _ = qmp.cmd("migrate_cancel", json!({}));
            return Err(format!(
                "did not converge within its limit of {} s (throttle at {}%, {} MiB remaining)",
                limit.as_secs(),
                info["cpu-throttle-percentage"],
                info["ram"]["remaining"].as_u64().unwrap_or(0) >> 20
            ));
        }
        std::thread::sleep(POLL);
    };
    side.read_source(&source.console());
    // The source stopped the VM for the switchover (and never since).
    *paused_unix_ms = qmp.last_event_unix_ms("STOP");
    side.converged = true;
    side.total_ms = info["total-time"].as_f64();
    side.downtime_ms = info["downtime"].as_f64();
    side.syncs = info["ram"]["dirty-sync-count"].as_u64();
    side.link_mib_s = match (info["ram"]["transferred"].as_f64(), side.total_ms) {
        (Some(bytes), Some(ms)) if ms > 0.0 => Some(bytes / (ms / 1e3) / (1 << 20) as f64),
        _ => None,
    };
    let _ = qmp.cmd("quit", json!({}));
    run_on(&mut dest, guest, side)
}

/// The guest runs on at the destination, told that it moved; its checker
/// then powers it off, and QEMU exits. Its checks go into `side`.
pub(super) fn run_on(dest: &mut Qemu, guest: &Guest, side: &mut Side) -> Result<(), String> {
    dest.wait_console(Duration::from_secs(120), |t| checker_lines(t, 1))
        .map_err(|e| format!("the destination's guest printed nothing after the move: {e}"))?;
    if let Some(stdin) = dest.stdin.as_mut() {
        let _ = stdin.write_all(b"moved\n");
    }
    let after = Duration::from_secs(guest.after_move_s + 120);
    let done = ferry_guest_checker::line::DONE_PREFIX;
    dest.wait_console(after, |t| t.contains(done))
        .map_err(|e| format!("the destination's guest did not finish: {e}"))?;
    // Its checker powers the guest off, and QEMU exits: then the console
    // is whole.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        match dest.child.try_wait() {
            Ok(Some(status)) => break Some(status),
            _ if Instant::now() > deadline => break None,
            _ => std::thread::sleep(POLL),
        }
    };
    std::thread::sleep(Duration::from_millis(300));
    side.check_guest(&dest.console());
    if !status.is_some_and(|s| s.success()) {
        side.error.get_or_insert(format!(
            "the guest did not power off (QEMU: {})",
            status.map_or("still running after 60 s".into(), |s| s.to_string())
        ));
    }
    Ok(())
}
