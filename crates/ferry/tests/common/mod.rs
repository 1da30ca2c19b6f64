//! Helpers for tests that run the `ferry` binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// The ferry binary under test. The process dies (SIGKILL) when the
/// thread that started it ends, as each test runs on a thread of its own:
/// a test that fails half-way leaves no `ferry` behind.
pub fn ferry() -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    // SAFETY: the closure runs in the forked child before exec and calls
    // only prctl, which is async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// True if /dev/kvm is usable; otherwise prints the skip line.
#[allow(unused_imports)]
pub use ferry_kvm::require_kvm;

/// A ferry command line, built from what a test varies: the subcommand,
/// the backend, the guest's size and write rate, then anything else.
#[derive(Clone, Debug)]
pub struct Ferry {
    args: Vec<String>,
}

impl Ferry {
    /// `ferry SUBCOMMAND`, whose words (`bench local`) are separate
    /// arguments.
    pub fn new(subcommand: &str) -> Ferry {
        Ferry {
            args: subcommand.split_whitespace().map(String::from).collect(),
        }
    }

    /// `ferry demo --json`: a whole migration between two processes, whose
    /// summary is the last stdout line.
    pub fn demo() -> Ferry {
        Ferry::new("demo").args(&["--json"])
    }

    /// `--backend BACKEND`.
    pub fn on(self, backend: &str) -> Ferry {
        self.args(&["--backend", backend])
    }

    /// A guest of `mem_per_vcpu` per vCPU (`64M`).
    pub fn mem(self, mem_per_vcpu: &str) -> Ferry {
        self.args(&["--mem-per-vcpu", mem_per_vcpu])
    }

    /// A guest of `mem_per_vcpu` per vCPU (`64M`) writing at most
    /// `rate_mib_s` MiB/s.
    pub fn guest(self, mem_per_vcpu: &str, rate_mib_s: u32) -> Ferry {
        self.mem(mem_per_vcpu)
            .args(&["--rate-limit", &rate_mib_s.to_string()])
    }

    /// More arguments, as written.
    pub fn args(mut self, args: &[&str]) -> Ferry {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// The arguments, for a caller that spawns the command itself.
    pub fn to_args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }

    /// Runs it to the end and returns its output.
    pub fn run(&self) -> Output {
        run(&self.to_args())
    }
}

/// What `scripts/setup.sh` (the README's test command's first step) could
/// not install because the machine cannot provide it: the reason it
/// recorded for `name` in `target/setup/missing`, if any.
pub fn set_up_lacks(name: &str) -> Option<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/setup/missing");
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": ").map(str::to_string))
}

/// For a test that needs `name`, which it found missing (`what`): prints
/// its SKIP line where the set-up recorded that this machine cannot provide
/// it, and fails otherwise, since the set-up installs it wherever it can.
pub fn skip_unless_set_up_lacks(test: &str, name: &str, what: &str) {
    match set_up_lacks(name) {
        Some(why) => ferry_vm::skip!("SKIP {test}: {what}: {why}"),
        None => panic!(
            "{test}: {what}, though scripts/setup.sh did not record {name} as impossible here: \
             run `bash scripts/setup.sh` (the README's test command does)"
        ),
    }
}

/// The backends a test body runs on: soft always, kvm where /dev/kvm is
/// (printing the SKIP line for `test` where it is not).
pub fn backends(test: &str) -> Vec<&'static str> {
    if require_kvm(&format!("{test} on kvm")) {
        vec!["kvm", "soft"]
    } else {
        vec!["soft"]
    }
}

/// Runs ferry with `args` and returns its output.
pub fn run(args: &[&str]) -> Output {
    ferry().args(args).output().expect("ferry runs")
}

/// The JSON object on the last line of stdout.
pub fn last_json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    ferry_harness::output::last_line_json(&stdout).unwrap_or_else(|e| {
        panic!(
            "last stdout line is not JSON ({e}):\n--- stdout\n{stdout}\n--- stderr\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Asserts what every successful migration must show: completed, memory
/// digest matched, and no guest mismatch up to the pause. Where the summary
/// also heard from the destination (`ferry demo` reads the destination's
/// own summary), the guest ran on there without a mismatch. A source
/// migrating to a separate `ferry receive` knows only its own side: that
/// receive checks the guest after the switchover and exits non-zero on a
/// mismatch.
pub fn assert_verified(j: &serde_json::Value, context: &str) {
    assert_eq!(j["status"], "completed", "{context}: {j}");
    assert_eq!(j["digest_match"], true, "{context}: {j}");
    assert_eq!(j["guest_mismatches"], 0, "{context}: {j}");
    assert_eq!(j["mismatches_before"], 0, "{context}: {j}");
    if !j["dest_passes_after"].is_null() {
        assert!(
            j["dest_passes_after"].as_u64().unwrap_or(0) >= 1,
            "{context}: {j}"
        );
        assert_eq!(j["mismatches_after"], 0, "{context}: {j}");
    }
}

/// Asserts that ferry exited 0 and nothing panicked.
pub fn assert_success(out: &Output) {
    assert_no_panic(out);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that nothing panicked.
pub fn assert_no_panic(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "ferry panicked:\n{stderr}");
}

/// A `ferry receive` child and the address it listens on.
pub struct Receiver {
    pub child: Child,
    pub addr: String,
}

impl Receiver {
    /// A receiver that exits once it has reported.
    pub fn start(extra: &[&str]) -> Receiver {
        let mut args = vec!["--exit-after-report"];
        args.extend_from_slice(extra);
        Receiver::serving(&args)
    }

    /// A receiver that runs the guest on after the migration.
    pub fn serving(extra: &[&str]) -> Receiver {
        let mut child = ferry()
            .args(["receive", "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ferry receive starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Receiver { child, addr }
    }
}

impl Receiver {
    /// Waits for the receiver to exit, failing the test if it is still
    /// running after `secs` seconds (`what` says after what); returns
    /// whether it succeeded and its stderr.
    pub fn finish_within(&mut self, secs: u64, what: &str) -> (bool, String) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the destination still runs {secs} s after {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        self.finish()
    }

    /// Waits for the receiver to exit; returns whether it succeeded and its stderr.
    pub fn finish(&mut self) -> (bool, String) {
        let ok = self.child.wait().unwrap().success();
        let mut stderr = String::new();
        use std::io::Read;
        if let Some(mut e) = self.child.stderr.take() {
            e.read_to_string(&mut stderr).unwrap();
        }
        (ok, stderr)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ferry ctl SOCK events --json`, once it has subscribed: events flow only
/// to connections that sent qmp_capabilities, and it says on stderr that
/// it has before it prints any.
pub fn follow_events(sock: &std::path::Path) -> Child {
    let mut events = ferry()
        .arg("ctl")
        .arg(sock)
        .args(["events", "--json", "--timeout", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ferry ctl events runs");
    let mut said = String::new();
    BufReader::new(events.stderr.as_mut().expect("piped"))
        .read_line(&mut said)
        .expect("ferry ctl's first line");
    assert!(said.contains("following events"), "{said}");
    events
}

/// Sends one request line to a control socket; returns the reply.
pub fn ask(path: &std::path::Path, req: &str) -> serde_json::Value {
    let mut conn = std::os::unix::net::UnixStream::connect(path).unwrap();
    std::io::Write::write_all(&mut conn, format!("{req}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

/// `vm` (a `ferry run` command line) with `--control SOCK`, once its
/// socket answers.
pub fn run_with_control(vm: Ferry) -> (std::process::Child, std::path::PathBuf) {
    // Tests run in parallel in one process: each gets its own socket.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let sock = std::env::temp_dir().join(format!("ferry-test-{}-{n}.sock", std::process::id()));
    let vm = ferry()
        .args(vm.to_args())
        .arg("--control")
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "control socket never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (vm, sock)
}
