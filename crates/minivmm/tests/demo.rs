//! minivmm as a user runs it: `minivmm demo` in each mode, and a
//! destination killed mid-migration. Each needs /dev/kvm and says SKIP
//! where it is absent.

mod common;

use common::{kvm, EXE};
use minivmm::checks;
use std::process::{Command, Stdio};
use std::time::Duration;

fn demo(extra: &[&str]) -> serde_json::Value {
    let (ok, j) = common::demo_json(extra);
    assert!(ok, "{j}");
    j
}

fn assert_clean(j: &serde_json::Value) {
    assert_eq!(j["status"], "completed", "{j}");
    assert_eq!(j["digest_match"], true, "{j}");
    for key in [
        "console_lines_lost",
        "console_lines_doubled",
        "console_lines_bad",
        "blk_requests_lost",
        "blk_requests_doubled",
        "blk_bad_reads",
    ] {
        assert_eq!(j[key], 0, "{key}: {j}");
    }
    assert!(j["console_lines"].as_u64().unwrap() > 0, "{j}");
    assert!(j["blk_requests"].as_u64().unwrap() > 0, "{j}");
    // Both ends printed: the line stream crosses the switchover.
    assert!(j["source_console_lines"].as_u64().unwrap() > 0, "{j}");
    assert!(
        j["destination_console_lines"].as_u64() > j["source_console_lines"].as_u64(),
        "{j}"
    );
    let names: Vec<&str> = j["sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["serial", "virtio-blk"], "{j}");
    // One instance of each device per vCPU, each vCPU's streams whole and
    // moving.
    let vcpus = j["vcpus"].as_u64().unwrap();
    let instances: Vec<u64> = (0..vcpus).collect();
    for s in j["sections"].as_array().unwrap() {
        assert_eq!(s["instances"], serde_json::json!(instances), "{j}");
    }
    let per_vcpu = j["per_vcpu"].as_array().unwrap();
    assert_eq!(per_vcpu.len() as u64, vcpus, "{j}");
    for v in per_vcpu {
        assert!(v["console"]["lines"].as_u64().unwrap() > 0, "{j}");
        assert!(v["disk"]["requests"].as_u64().unwrap() > 0, "{j}");
    }
}

#[test]
fn the_demo_migrates_with_precopy_and_every_stream_is_whole() {
    if kvm("minivmm demo") {
        let j = demo(&["--vcpus", "4"]);
        assert_clean(&j);
        assert_eq!(j["vcpus"], 4);
        // Notifications reach the I/O thread through ioeventfds: none
        // exits to a vCPU thread.
        assert_eq!(j["notify"], "ioeventfd");
        assert_eq!(j["notify_exits"], 0, "{j}");
    }
}

#[test]
fn the_demo_migrates_with_notifications_served_by_exits_or_inline() {
    if kvm("minivmm demo") {
        for notify in ["exit", "inline"] {
            let j = demo(&["--notify", notify, "--vcpus", "1"]);
            assert_clean(&j);
            assert_eq!(j["notify"], notify);
            assert!(j["notify_exits"].as_u64().unwrap() > 0, "{j}");
        }
    }
}

#[test]
fn the_demo_migrates_with_postcopy_and_every_stream_is_whole() {
    if kvm("minivmm demo") {
        let j = demo(&["--mode", "postcopy"]);
        assert_clean(&j);
        assert_eq!(j["mode"], "postcopy");
    }
}

#[test]
fn a_destination_killed_mid_migration_leaves_the_source_running_without_a_gap() {
    if !kvm("minivmm demo") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("minivmm-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let console = dir.join("source.console");
    let (mut dest, addr) = common::receiver(&dir.join("destination.console"));
    // A slow link: the full pass alone takes seconds.
    let src = Command::new(EXE)
        .args([
            "migrate",
            "--json",
            "--data-mib",
            "32",
            "--bandwidth-mib-s",
            "4",
        ])
        .args(["--run-before-ms", "200", "--run-after-failure-ms", "1000"])
        .args(["--to", &addr])
        .arg("--disk")
        .arg(dir.join("disk.img"))
        .arg("--console")
        .arg(&console)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    dest.kill().unwrap();
    dest.wait().unwrap();
    // Both vCPUs' consoles (the default is two).
    let at_kill: u64 = (0..2)
        .map(|i| {
            let path = minivmm::serial::console_path(&console, i);
            checks::console(&std::fs::read_to_string(path).unwrap_or_default()).lines
        })
        .sum();
    let out = src.wait_with_output().unwrap();
    assert!(!out.status.success(), "the migration cannot have completed");
    // The guest ran on after the failure, its streams whole.
    let lines = common::source_kept_its_streams(&common::last_json(&out.stdout), &console);
    assert!(lines > at_kill, "{lines} lines (at the kill: {at_kill})");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_demo_saves_a_running_guest_and_restores_it_with_every_stream_whole() {
    if kvm("minivmm demo --snapshot") {
        for mode in ["lazy-working-set", "eager"] {
            let j = demo(&["--snapshot", "--restore", mode]);
            assert_clean(&j);
            assert_eq!(j["mode"], "snapshot", "{j}");
            // The guest's pause is the snapshot's, measured at its pause.
            assert!(j["downtime_ms"].as_f64().unwrap() > 0.0, "{j}");
        }
    }
}
