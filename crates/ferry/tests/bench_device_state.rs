//! `ferry bench device-state --json` on a small soft guest: the same device
//! migrates with its state live and then all at the pause, each run
//! verified (digest, guest stamps, the device's bytes), and the JSON says
//! where the state went. No time is asserted.

mod common;

use common::{assert_success, last_json, Ferry};

#[test]
fn the_device_state_goes_live_or_at_the_pause_and_every_run_verifies() {
    let out_dir = std::env::temp_dir().join(format!("ferry-bench-ds-{}", std::process::id()));
    let out = Ferry::new("bench device-state")
        .on("soft")
        .mem("16M")
        .args(&[
            "--vcpus",
            "1",
            "--state",
            "4M",
            "--repeat",
            "1",
            "--warmup",
            "0.2",
            "--json",
            "--out",
            out_dir.to_str().expect("utf-8 temp dir"),
        ])
        .run();
    assert_success(&out);
    let line = last_json(&out);
    assert_eq!(line["bench"], "device-state", "{line}");
    let runs = line["results"]["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{line}");
    const STATE: u64 = 4 << 20;
    for r in runs {
        assert_eq!(r["verified"], true, "{r}");
        let (live, at_pause) = (
            r["device_bytes_live"].as_u64().unwrap(),
            r["device_bytes_at_pause"].as_u64().unwrap(),
        );
        match r["way"].as_str().unwrap() {
            "live" => assert!(live >= STATE && at_pause < STATE, "{r}"),
            "at the pause" => assert!(live == 0 && at_pause >= STATE, "{r}"),
            other => panic!("a way called {other}: {r}"),
        }
    }
    assert!(out_dir.join("device-state.svg").exists());
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn device_state_that_is_not_whole_blocks_is_refused_in_words() {
    let out = Ferry::new("bench device-state")
        .args(&["--state", "100K"])
        .run();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--state must be whole 64 KiB blocks"), "{err}");
}
