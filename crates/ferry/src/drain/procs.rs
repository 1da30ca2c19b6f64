//! The processes of a real drain: each VM is a `ferry run --control` in its
//! host's namespace, and each migration's destination a `ferry receive` in
//! the target's, as a VMM and its migration target would be on real hosts.

use super::mini_fleet::Guest;
use super::DrainError;
use crate::netns::NetnsBridge;
use ferry_harness::child::read_listen_address;
use ferry_harness::output::last_json;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a VM may take to boot and answer on its control socket (fresh
/// memory is slow to touch here, and several boot at once).
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// What a VM that writes nothing does instead: read at this rate.
pub const READ_MIB_S: u64 = 64;

/// One `ferry` child process, killed if it is still running when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `ferry` command started in host `host`'s namespace, dying with us.
fn ferry(exe: &Path, bridge: &NetnsBridge, host: usize) -> Result<Command, DrainError> {
    let mut cmd = Command::new(exe);
    crate::child::die_with_parent(&mut cmd);
    bridge.run_in(host, &mut cmd)?;
    cmd.stdin(Stdio::null());
    Ok(cmd)
}

/// A child's stderr: `dir/name`, created afresh.
fn log_file(dir: &Path, name: &str) -> Result<(std::fs::File, PathBuf), DrainError> {
    let path = dir.join(name);
    let file = std::fs::File::create(&path).map_err(|source| DrainError::Io {
        what: format!("create {}", path.display()),
        source,
    })?;
    Ok((file, path))
}

/// A running VM, served on a control socket.
pub struct VmProcess {
    proc: Proc,
    /// Its control socket.
    pub control: PathBuf,
}

impl VmProcess {
    /// Boots `guest` on its host and waits until its control socket
    /// answers. Its log is `dir/NAME.log`.
    pub fn boot(
        exe: &Path,
        bridge: &NetnsBridge,
        guest: &Guest,
        backend: &str,
        dir: &Path,
    ) -> Result<Self, DrainError> {
        let control = dir.join(format!("{}.sock", guest.name));
        let _ = std::fs::remove_file(&control);
        let (log, log_path) = log_file(dir, &format!("{}.log", guest.name))?;
        let (write_percent, rate) = match guest.write_mib_s {
            0 => (0, READ_MIB_S),
            w => (100, w),
        };
        let mut cmd = ferry(exe, bridge, guest.host)?;
        cmd.arg("run")
            .arg("--control")
            .arg(&control)
            .args(["--vcpus", "1"])
            .args(["--mem-per-vcpu", &format!("{}M", guest.memory_mib)])
            .args(["--write-percent", &write_percent.to_string()])
            .args(["--rate-limit", &rate.to_string()])
            .args(["--fill", "text", "--interval", "86400"])
            .args(["--backend", backend])
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd.spawn().map_err(|source| DrainError::Io {
            what: format!("start VM {}", guest.name),
            source,
        })?;
        let mut vm = VmProcess {
            proc: Proc(child),
            control,
        };
        let until = Instant::now() + BOOT_TIMEOUT;
        loop {
            if let Ok(reply) = request(&vm.control, &serde_json::json!({"cmd": "status"})) {
                if reply.get("ok") != Some(&Value::Bool(false)) {
                    return Ok(vm);
                }
            }
            let exited = matches!(vm.proc.0.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > until {
                return Err(DrainError::Boot {
                    vm: guest.name.clone(),
                    why: if exited {
                        "it exited".into()
                    } else {
                        format!("no answer within {} s", BOOT_TIMEOUT.as_secs())
                    },
                    log: log_path,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Sends one request line to a control socket and reads its reply line.
/// A migrate request blocks until the migration ends.
pub fn request(control: &Path, line: &Value) -> Result<Value, DrainError> {
    let fail = |why: String| DrainError::Control {
        socket: control.to_path_buf(),
        why,
    };
    let mut s = UnixStream::connect(control).map_err(|e| fail(e.to_string()))?;
    writeln!(s, "{line}").map_err(|e| fail(e.to_string()))?;
    let mut reply = String::new();
    BufReader::new(&s)
        .read_line(&mut reply)
        .map_err(|e| fail(e.to_string()))?;
    serde_json::from_str(reply.trim()).map_err(|e| fail(format!("{e}: {reply:?}")))
}

/// A migration's destination: `ferry receive` listening on its host.
pub struct Receiver {
    proc: Proc,
    /// Where the source connects.
    pub addr: String,
    /// The last JSON line it prints: its own checks of the guest.
    report: JoinHandle<Option<Value>>,
}

impl Receiver {
    /// Starts a destination for `guest` on host `host`, and reads where it
    /// listens.
    pub fn spawn(
        exe: &Path,
        bridge: &NetnsBridge,
        host: usize,
        guest: &Guest,
        backend: &str,
        dir: &Path,
    ) -> Result<Self, DrainError> {
        let (log, log_path) = log_file(dir, &format!("{}.receive.log", guest.name))?;
        let mut cmd = ferry(exe, bridge, host)?;
        cmd.arg("receive")
            .args(["--listen", &format!("{}:0", NetnsBridge::addr(host))])
            .args(["--exit-after-report", "--json", "--run-after", "1"])
            .args(["--memory", &format!("{}M", guest.memory_mib)])
            .args(["--vcpus", "1", "--backend", backend])
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = cmd.spawn().map_err(|source| DrainError::Io {
            what: format!("start the destination of {}", guest.name),
            source,
        })?;
        let stdout = child.stdout.take().expect("piped");
        let proc = Proc(child);
        let mut out = BufReader::new(stdout);
        let addr = read_listen_address(&mut out).map_err(|e| DrainError::Boot {
            vm: format!("{}'s destination", guest.name),
            why: e.to_string(),
            log: log_path,
        })?;
        let report = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            last_json(&text)
        });
        Ok(Receiver { proc, addr, report })
    }

    /// Waits until `deadline` for it to report and exit; stops it then.
    pub fn report(mut self, deadline: Instant) -> Option<Value> {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.proc.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.proc.0.kill();
        let _ = self.proc.0.wait();
        self.report.join().ok().flatten()
    }
}
