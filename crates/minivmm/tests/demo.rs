//! minivmm as a user runs it: `minivmm demo` in each mode, and a
//! destination killed mid-migration. Each needs /dev/kvm and says SKIP
//! where it is absent.

use minivmm::checks;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_minivmm");

fn kvm() -> bool {
    let ok = kvm_ioctls::Kvm::new().is_ok();
    if !ok {
        println!("SKIP minivmm demo: /dev/kvm is not available here");
    }
    ok
}

fn demo(extra: &[&str]) -> serde_json::Value {
    let out = Command::new(EXE)
        .args(["demo", "--json", "--data-mib", "16"])
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
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
}

#[test]
fn the_demo_migrates_with_precopy_and_every_stream_is_whole() {
    if kvm() {
        assert_clean(&demo(&[]));
    }
}

#[test]
fn the_demo_migrates_with_postcopy_and_every_stream_is_whole() {
    if kvm() {
        let j = demo(&["--mode", "postcopy"]);
        assert_clean(&j);
        assert_eq!(j["mode"], "postcopy");
    }
}

#[test]
fn a_destination_killed_mid_migration_leaves_the_source_running_without_a_gap() {
    if !kvm() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("minivmm-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let console = dir.join("source.console");
    let mut dest = Command::new(EXE)
        .args(["receive", "--listen", "127.0.0.1:0", "--console"])
        .arg(dir.join("destination.console"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(dest.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr: serde_json::Value = serde_json::from_str(&first).unwrap();
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
        .args(["--to", addr["listening"].as_str().unwrap()])
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
    let at_kill = checks::console(&std::fs::read_to_string(&console).unwrap()).lines;
    let out = src.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the migration cannot have completed");
    let j: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_ne!(j["status"], "completed", "{j}");
    assert!(j["error"].is_string(), "{j}");
    // The guest ran on after the failure, its streams whole.
    let lines = checks::console(&std::fs::read_to_string(&console).unwrap());
    assert!(lines.lines > at_kill, "{lines:?} (at the kill: {at_kill})");
    assert_eq!(
        (lines.lost, lines.doubled, lines.bad),
        (0, 0, 0),
        "{lines:?}"
    );
    let runs: Vec<[u64; 2]> = serde_json::from_value(j["disk_runs"].clone()).unwrap();
    let journal: Vec<u64> = runs.iter().flat_map(|&[a, b]| a..=b).collect();
    let disk = checks::disk(&journal);
    assert_eq!((disk.lost, disk.doubled), (0, 0), "{disk:?}");
    assert_eq!(j["guest"]["bad_reads"], 0, "{j}");
    let _ = std::fs::remove_dir_all(dir);
}
