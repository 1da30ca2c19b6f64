//! `--local`, the same-host live upgrade, as a user runs it: the demo,
//! anonymous memory refused, and a destination that dies before it
//! resumes. Each needs /dev/kvm and says SKIP where it is absent.

mod common;

use common::{kvm, EXE};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn the_local_demo_maps_memory_and_every_stream_is_whole() {
    if !kvm("minivmm --local") {
        return;
    }
    let out = Command::new(EXE)
        .args(["demo", "--local", "--json", "--data-mib", "16"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(j["mode"], "local", "{j}");
    assert_eq!(j["status"], "completed", "{j}");
    assert_eq!(j["digest_match"], true, "{j}");
    assert!(j["downtime_ms"].as_f64().unwrap() > 0.0, "{j}");
    for key in [
        "console_lines_lost",
        "console_lines_doubled",
        "blk_requests_lost",
        "blk_requests_doubled",
        "blk_bad_reads",
    ] {
        assert_eq!(j[key], 0, "{key}: {j}");
    }
    assert!(j["destination_console_lines"].as_u64() > j["source_console_lines"].as_u64());
}

#[test]
fn local_with_anonymous_memory_is_refused_with_its_message() {
    let dir = std::env::temp_dir().join(format!("minivmm-anon-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(EXE)
        .args(["migrate", "--local"])
        .arg(dir.join("none.sock"))
        .arg("--disk")
        .arg(dir.join("disk.img"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--backing memfd"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_destination_that_dies_before_it_resumes_leaves_the_source_running() {
    if !kvm("minivmm --local") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("minivmm-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("local.sock");
    let console = dir.join("source.console");
    let mut dest = Command::new(EXE)
        .args(["receive", "--crash-on-restore", "--local"])
        .arg(&socket)
        .arg("--console")
        .arg(dir.join("destination.console"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(dest.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let out = Command::new(EXE)
        .args([
            "migrate",
            "--json",
            "--backing",
            "memfd",
            "--data-mib",
            "16",
        ])
        .args([
            "--run-before-ms",
            "300",
            "--run-after-failure-ms",
            "500",
            "--local",
        ])
        .arg(&socket)
        .arg("--disk")
        .arg(dir.join("disk.img"))
        .arg("--console")
        .arg(&console)
        .output()
        .unwrap();
    assert_eq!(
        dest.wait().unwrap().code(),
        Some(3),
        "the destination crashed"
    );
    assert!(!out.status.success());
    // The source ran on, on its own memory, losing no line or request.
    let j = common::last_json(&out.stdout);
    assert_eq!(j["status"], "failed", "{j}");
    assert!(common::source_kept_its_streams(&j, &console) > 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// The disk image's path is removed once the source has it open, before
/// the destination builds its VM: the destination serves the disk through
/// the fd the source handed over by name, and every block check passes.
#[test]
fn a_local_upgrade_adopts_the_disk_fd_when_its_path_is_gone() {
    if !kvm("minivmm --local --unlink-disk") {
        return;
    }
    let out = Command::new(EXE)
        .args([
            "demo",
            "--local",
            "--unlink-disk",
            "--json",
            "--data-mib",
            "16",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        !stderr.contains("opening the disks by their paths"),
        "{stderr}"
    );
    let j: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(j["disk_unlinked"], true, "{j}");
    assert_eq!(j["status"], "completed", "{j}");
    assert_eq!(j["digest_match"], true, "{j}");
    assert!(j["blk_requests"].as_u64() > Some(0), "{j}");
    for key in ["blk_requests_lost", "blk_requests_doubled", "blk_bad_reads"] {
        assert_eq!(j[key], 0, "{key}: {j}");
    }
}
