//! ferry's QMP socket driven by QEMU's own client library (`qemu.qmp` from
//! PyPI, which `scripts/setup.sh` installs into `target/qmp-venv`): the Python
//! script `qmp_client.py` migrates a `ferry run --qmp` VM to a `ferry
//! receive --qmp`, following the events to `completed` on both, the
//! destination's monitor connected (run state `inmigrate`) before the
//! migration starts; and the package's
//! `qmp-shell` runs a short script. Prints a SKIP line where the set-up
//! could not install the package.

mod common;

use common::{ferry, last_json, skip_unless_set_up_lacks};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A Python that has `qemu.qmp`: `FERRY_QMP_PYTHON`, the venv the set-up
/// makes, or the system's.
fn python() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/qmp-venv/bin/python");
    let candidates = [
        std::env::var_os("FERRY_QMP_PYTHON").map(PathBuf::from),
        Some(venv),
        Some(PathBuf::from("python3")),
    ];
    candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .args(["-c", "import qemu.qmp"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        assert!(Instant::now() < deadline, "no socket at {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn qemus_own_client_migrates_a_vm_and_reads_the_result() {
    let Some(python) = python() else {
        return skip_unless_set_up_lacks(
            "qemu.qmp client",
            "qemu.qmp",
            "the qemu.qmp package is not installed",
        );
    };
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let (src_sock, dst_sock) = (
        dir.join(format!("ferry-qmpc-src-{pid}.sock")),
        dir.join(format!("ferry-qmpc-dst-{pid}.sock")),
    );
    let mut dest = ferry()
        .args([
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            "soft",
            "--qmp",
        ])
        .arg(&dst_sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ferry receive runs");
    let mut first = String::new();
    BufReader::new(dest.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_string();
    let mut src = ferry()
        .args(["run", "--backend", "soft", "--mem-per-vcpu", "16M", "--qmp"])
        .arg(&src_sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ferry run runs");
    wait_for(&src_sock);

    // qmp-shell, as an operator would type it.
    let shell = python.with_file_name("qmp-shell");
    if shell.exists() {
        let mut sh = Command::new(&shell)
            .arg(&src_sock)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qmp-shell runs");
        sh.stdin
            .take()
            .unwrap()
            .write_all(b"query-status\nquery-version\n")
            .unwrap();
        let out = sh.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("running") && text.contains("ferry"), "{text}");
    }

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/qmp_client.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&src_sock)
        .arg(&addr)
        .arg(&dst_sock)
        .output()
        .expect("the client runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let seen = last_json(&out);
    assert_eq!(seen["digest_match"], true, "{seen}");
    assert_eq!(seen["unknown_command"], "CommandNotFound", "{seen}");
    assert_eq!(seen["run_state_after"], "postmigrate", "{seen}");
    // The destination's monitor was up before the migration, and followed it.
    assert_eq!(seen["destination_before"], "inmigrate", "{seen}");
    assert_eq!(seen["destination_after"], "running", "{seen}");
    // quit ended the source.
    let deadline = Instant::now() + Duration::from_secs(30);
    while src.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the source did not quit");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = dest.kill();
    let _ = dest.wait();
    let _ = std::fs::remove_file(&dst_sock);
}
