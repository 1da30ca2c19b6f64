//! Same-host live upgrade through the `ferry` binary: `bench local` on a
//! small kvm guest (the local move verified, TCP for contrast, outputs
//! written), `migrate --local` with anonymous memory refused in words, and
//! `migrate --local` into a `receive --local` process.

mod common;

use common::{assert_no_panic, assert_success, ferry, last_json, require_kvm, Ferry};
use std::io::{BufRead, BufReader};
use std::process::Stdio;

#[test]
fn bench_local_moves_a_small_guest_both_ways_and_writes_its_outputs() {
    if !require_kvm("bench local") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferry-bench-local-{}", std::process::id()));
    let out = Ferry::new("bench local")
        .args(&[
            "--sizes-gib",
            "1",
            "--repeat",
            "2",
            "--warmup",
            "0.3",
            "--json",
            "--out",
            dir.to_str().expect("utf-8 temp dir"),
        ])
        .run();
    assert_success(&out);
    let j = last_json(&out);
    let cells = j["cells"].as_array().cloned().unwrap_or_default();
    assert_eq!(cells.len(), 2, "{j}");
    for c in &cells {
        assert_eq!(c["mem_gib"], 1, "{j}");
        assert_eq!(c["verified"], true, "{j}");
        assert!(c["downtime_ms"].as_f64().unwrap() > 0.0, "{j}");
        // Where the pause went: its phases fit inside it.
        let phases: f64 = c["pause"]
            .as_object()
            .expect("the pause's phases")
            .values()
            .map(|v| v.as_f64().unwrap())
            .sum();
        assert!(phases <= c["downtime_ms"].as_f64().unwrap() + 1e-6, "{j}");
    }
    let size = &j["sizes"][0];
    assert_eq!(size["moves"], 2, "{j}");
    assert!(size["min_ms"].as_f64() <= size["median_ms"].as_f64(), "{j}");
    assert!(size["median_ms"].as_f64() <= size["max_ms"].as_f64(), "{j}");
    assert_eq!(j["downtime_ratio"], 1.0, "{j}");
    assert_eq!(j["tcp"][0]["verified"], true, "{j}");
    assert!(dir.join("local.json").exists() && dir.join("local.svg").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn migrate_local_refuses_anonymous_memory_naming_memfd() {
    let out = Ferry::new("migrate")
        .mem("64M")
        .args(&["--local", "/nonexistent/ferry.sock"])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--backing memfd"), "{err}");
}

#[test]
fn migrate_local_hands_a_kvm_guest_to_a_receive_local_process() {
    if !require_kvm("migrate --local") {
        return;
    }
    let socket = std::env::temp_dir().join(format!("ferry-local-{}.sock", std::process::id()));
    let mut dest = ferry()
        .args([
            "receive",
            "--json",
            "--run-after",
            "0.3",
            "--exit-after-report",
            "--local",
        ])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ferry receive runs");
    let mut stdout = BufReader::new(dest.stdout.take().expect("piped"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("the listening line");
    assert!(first.starts_with("listening on"), "{first}");
    let src = Ferry::new("migrate")
        .mem("256M")
        .args(&[
            "--backing",
            "memfd",
            "--vcpus",
            "1",
            "--warmup",
            "0.3",
            "--json",
            "--local",
            socket.to_str().expect("utf-8 path"),
        ])
        .run();
    assert_success(&src);
    let j = last_json(&src);
    assert_eq!(j["status"], "completed", "{j}");
    assert_eq!(j["digest_match"], true, "{j}");
    // The guest's 256 MiB and the VM's system slot, mapped and not copied.
    assert!(j["memory_bytes"].as_u64().unwrap() > 256 << 20, "{j}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).expect("destination output");
    let status = dest.wait().expect("ferry receive exits");
    assert!(status.success(), "{rest}");
    let d: serde_json::Value = serde_json::from_str(rest.lines().last().unwrap()).unwrap();
    assert_eq!(d["digest_match"], true, "{d}");
}
