//! No process outlives the command that started it: the demo's destination
//! dies with the demo, even when the demo is killed with SIGKILL.

mod common;
use common::*;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn the_destination_dies_with_a_killed_demo() {
    let mut demo = ferry()
        .args(["demo", "--backend", "soft", "--mem-per-vcpu", "32M"])
        .args(["--rate-limit", "8", "--warmup", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // "... destination pid N on ADDR"
    let mut stderr = demo.stderr.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    let pid: u32 = loop {
        let n = stderr.read(&mut buf).unwrap();
        assert!(n > 0, "demo ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        if let Some(p) = seen
            .split("destination pid ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|p| p.parse().ok())
        {
            break p;
        }
    };
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    demo.kill().unwrap();
    demo.wait().unwrap();
    assert_gone(pid, "the killed demo");
}

/// Waits (30 s at most) for the demo's destination `pid` to be gone,
/// failing the test if it outlives the demo (`what`). A zombie of ours
/// would stay listed; the destination is the demo's child, reaped by init
/// once the demo is gone.
fn assert_gone(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "destination {pid} outlived {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads `stderr` until it contains `marker`; returns all that was read.
fn read_until(stderr: &mut impl Read, marker: &str) -> String {
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains(marker) {
        let n = stderr.read(&mut buf).unwrap();
        assert!(n > 0, "ended before {marker:?}: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    seen
}

/// Waits for `child` to exit, failing the test if it hangs.
fn wait_or_fail(child: &mut std::process::Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not exit after the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &std::process::Child, sig: i32) {
    // SAFETY: kill sends a signal to a process this test started; it touches
    // no memory of ours.
    let r = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(r, 0, "kill failed");
}

#[test]
fn sigint_cancels_a_migration_cleanly_and_the_source_says_so() {
    // 16 MiB/s for a 64 MiB guest that never stops writing: still migrating
    // when the signal comes.
    let mut demo = ferry()
        .args([
            "demo",
            "--json",
            "--backend",
            "soft",
            "--mem-per-vcpu",
            "32M",
        ])
        .args(["--bandwidth", "16", "--converge", "none"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = demo.stderr.take().unwrap();
    read_until(&mut stderr, "sampling the guest");
    // Usually mid-way through the first pass by then; a signal that comes
    // earlier cancels the migration as it starts, with the same outcome.
    std::thread::sleep(Duration::from_secs(2));
    signal(&demo, libc::SIGINT);
    let status = wait_or_fail(&mut demo, "the demo");
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(!rest.contains("panicked"), "{rest}");
    let mut stdout = String::new();
    demo.stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let j: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("a summary");
    assert!(!status.success(), "a cancelled migration is not a success");
    assert_eq!(j["status"], "failed", "{j}");
    assert_eq!(j["digest_checked"], false, "{j}");
    let error = j["error"].as_str().unwrap_or_default();
    assert!(error.contains("stopped by SIGINT"), "{j}");
    assert!(rest.contains("source VM keeps running"), "{rest}");
}

#[test]
fn sigterm_stops_ferry_run_cleanly_and_removes_its_socket() {
    let sock = std::env::temp_dir().join(format!("ferry-sigterm-{}.sock", std::process::id()));
    let mut vm = ferry()
        .args(["run", "--backend", "soft", "--mem-per-vcpu", "8M"])
        .arg("--control")
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = vm.stderr.take().unwrap();
    read_until(&mut stderr, "control socket at");
    signal(&vm, libc::SIGTERM);
    let status = wait_or_fail(&mut vm, "ferry run");
    let mut stdout = String::new();
    vm.stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(status.success(), "{stdout}");
    assert!(stdout.contains("stopped after"), "{stdout}");
    assert!(!sock.exists(), "the socket file was left behind");
}

/// The child processes of `pid` (of all its threads).
fn children(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process is alive");
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// One demo stopped by SIGTERM in `phase`: sent once `marker` shows on its
/// stderr (plus `settle`), the demo must exit, not panic, and leave no
/// destination behind, on `backend`; and not succeed, unless `may_finish`:
/// a postcopy cannot be cancelled (the destination runs the guest), so
/// its source finishes serving the pages, within the stall timeout.
fn sigterm_in(
    backend: &str,
    phase: &str,
    args: &[&str],
    marker: &str,
    settle: Duration,
    may_finish: bool,
) {
    let mut demo = ferry()
        .args([
            "demo",
            "--json",
            "--backend",
            backend,
            "--mem-per-vcpu",
            "32M",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = demo.stderr.take().unwrap();
    read_until(&mut stderr, marker);
    let dest_pid = children(demo.id())
        .first()
        .copied()
        .unwrap_or_else(|| panic!("{phase} on {backend}: the demo has no destination process"));
    std::thread::sleep(settle);
    signal(&demo, libc::SIGTERM);
    let status = wait_or_fail(&mut demo, &format!("the demo on {backend} in {phase}"));
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(!rest.contains("panicked"), "{phase} on {backend}: {rest}");
    assert!(
        may_finish || !status.success(),
        "{phase} on {backend}: a stopped demo is not a success: {rest}"
    );
    assert!(rest.contains("SIGTERM"), "{phase} on {backend}: {rest}");
    assert_gone(
        dest_pid,
        &format!("the demo stopped in {phase} on {backend}"),
    );
}

#[test]
fn sigterm_stops_the_demo_in_every_phase() {
    for backend in backends("SIGTERM in every phase") {
        let second = Duration::from_secs(1);
        sigterm_in(
            backend,
            "the warm-up",
            &["--warmup", "120"],
            "warming up the guest",
            second,
            false,
        );
        sigterm_in(
            backend,
            "precopy",
            &["--bandwidth", "8", "--converge", "none"],
            "migration from",
            second,
            false,
        );
        sigterm_in(
            backend,
            "postcopy",
            &["--mode", "postcopy", "--bandwidth", "4"],
            "migration from",
            second,
            true,
        );
        sigterm_in(
            backend,
            "after the switchover",
            &["--run-after", "120"],
            "switched over",
            second,
            false,
        );
    }
}
