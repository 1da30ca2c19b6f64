//! minivmm's vhost-user fill device, whose backend is a process of its own
//! writing guest memory through its own mapping: in precopy, postcopy and
//! on a same-host upgrade every filled buffer's number arrives once and in
//! order; in postcopy the destination's backend faults on pages not yet
//! there through its own userfaultfd, which the engine serves; without the
//! vhost-user dirty log the digest catches the pages the migration then
//! misses; and a backend killed mid-migration fails the migration with the
//! reason while the source's guest runs on. A snapshot of it restores
//! lazily, the backend's faults served as in postcopy.

mod common;

use common::{kvm, last_json, EXE};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn demo(extra: &[&str]) -> (bool, serde_json::Value) {
    common::demo_json(&[&["--vhost"], extra].concat())
}

fn assert_fills_whole(j: &serde_json::Value) {
    assert!(j["vhost_requests"].as_u64().unwrap() > 0, "{j}");
    for key in [
        "vhost_requests_lost",
        "vhost_requests_doubled",
        "vhost_bad_fills",
        "console_lines_lost",
        "console_lines_doubled",
        "blk_requests_lost",
        "blk_requests_doubled",
        "blk_bad_reads",
    ] {
        assert_eq!(j[key], 0, "{key}: {j}");
    }
}

#[test]
fn the_fill_device_migrates_in_precopy_and_on_a_same_host_upgrade() {
    if !kvm("minivmm vhost") {
        return;
    }
    for extra in [&[][..], &["--local"]] {
        let (ok, j) = demo(extra);
        assert!(ok, "{j}");
        assert_eq!(j["status"], "completed", "{j}");
        assert_eq!(j["digest_match"], true, "{j}");
        assert_fills_whole(&j);
        let names: Vec<&str> = j["sections"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"vhost-fill"), "{j}");
    }
}

#[test]
fn without_the_vhost_dirty_log_the_digest_catches_the_backends_pages() {
    if !kvm("minivmm vhost") {
        return;
    }
    let (ok, j) = demo(&["--no-vhost-dirty-log"]);
    assert!(!ok, "{j}");
    assert_eq!(j["digest_match"], false, "{j}");
    let error = j["error"].as_str().unwrap_or_default();
    assert!(error.contains("digest mismatch"), "{j}");
    // The source's guest ran on, every stream whole.
    assert_fills_whole(&j);
}

#[test]
fn in_postcopy_the_backend_faults_through_its_own_userfaultfd_and_is_served() {
    if !kvm("minivmm vhost") {
        return;
    }
    let (ok, j) = demo(&["--mode", "postcopy"]);
    assert!(ok, "{j}");
    assert_eq!(j["status"], "completed", "{j}");
    assert_eq!(j["digest_match"], true, "{j}");
    assert!(j["postcopy_blocked"].is_null(), "{j}");
    // Pure postcopy: the destination's backend starts its ring on pages
    // still at the source (its used ring), so it faults at least once.
    assert!(j["vhost_postcopy_faults"].as_u64().unwrap() > 0, "{j}");
    assert_fills_whole(&j);
}

/// The pids of `parent`'s children.
fn children(parent: u32) -> Vec<u32> {
    let task = format!("/proc/{parent}/task/{parent}/children");
    std::fs::read_to_string(task)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn a_backend_killed_mid_migration_fails_it_with_the_reason_and_the_guest_runs_on() {
    if !kvm("minivmm vhost") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("minivmm-vhost-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut dest, addr) = common::receiver(&dir.join("destination.console"));
    // A slow link: the first pass alone takes seconds.
    let console = dir.join("source.console");
    let src = Command::new(EXE)
        .args(["migrate", "--json", "--vhost", "--backing", "memfd"])
        .args(["--data-mib", "32", "--bandwidth-mib-s", "4"])
        .args(["--run-before-ms", "300", "--run-after-failure-ms", "1000"])
        .args(["--to", &addr])
        .arg("--disk")
        .arg(dir.join("disk.img"))
        .arg("--console")
        .arg(&console)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its backend is its only child.
    let started = Instant::now();
    let backend = loop {
        if let [pid] = children(src.id())[..] {
            break pid;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no backend");
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on a pid this test read as the source's child.
    assert_eq!(unsafe { libc::kill(backend as i32, libc::SIGKILL) }, 0);
    let out = src.wait_with_output().unwrap();
    let _ = dest.kill();
    let _ = dest.wait();
    assert!(!out.status.success(), "the migration cannot have completed");
    let j = last_json(&out.stdout);
    let error = j["error"].as_str().unwrap_or_default();
    assert!(error.contains("vhost-user"), "{j}");
    assert!(j["vhost_failure"].is_string(), "{j}");
    // The guest ran on: its consoles and disks whole and moving.
    let lines = common::source_kept_its_streams(&j, &console);
    assert!(lines > 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_snapshot_of_the_fill_device_restores_lazily_with_every_fill_whole() {
    if !kvm("minivmm vhost --snapshot") {
        return;
    }
    // A lazy restore registers the new backend's userfaultfd before guest
    // memory is emptied: whatever the backend touches first waits for its
    // page instead of reading a hole (the engine's snapshot tests make it
    // fault for certain; here the whole device runs on).
    for mode in ["lazy", "lazy-working-set"] {
        let (ok, j) = demo(&["--snapshot", "--restore", mode]);
        assert!(ok, "{mode}: {j}");
        assert_eq!(j["status"], "completed", "{mode}: {j}");
        assert_eq!(j["digest_match"], true, "{mode}: {j}");
        assert!(j["vhost_restore_faults"].is_u64(), "{mode}: {j}");
        assert_fills_whole(&j);
    }
}
