//! `ferry demo --snapshot` on each backend: the guest saved to a file while
//! it writes, the source ended, the guest restored (lazily with its working
//! set first by default, and eagerly) and running on, its own stamp checks
//! clean on both sides and the digest compared. (Damaged files:
//! crates/ferry-engine/tests/snapshot.rs.)

mod common;
use common::*;

#[test]
fn the_snapshot_demo_saves_a_writing_guest_and_restores_it_checked() {
    for backend in backends("snapshot demo") {
        let dir =
            std::env::temp_dir().join(format!("ferry-snapdemo-{backend}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("guest.snap");
        let out = Ferry::demo()
            .on(backend)
            .guest("32M", 64)
            .args(&["--snapshot", "--snapshot-file", file.to_str().unwrap()])
            .run();
        check_demo(backend, &out, "lazy-working-set");
        // The file is kept where asked, and is what the JSON says.
        let j = last_json(&out);
        let on_disk = std::fs::metadata(&file).unwrap();
        assert_eq!(on_disk.len(), j["snapshot"]["file_bytes"].as_u64().unwrap());
        assert!(
            j["restore"]["working_set_pages"].as_u64().unwrap() > 0,
            "{j}"
        );
        for mode in ["eager", "lazy"] {
            let out = Ferry::demo()
                .on(backend)
                .guest("32M", 64)
                .args(&["--snapshot", "--restore", mode])
                .run();
            check_demo(backend, &out, mode);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The demo's verdicts, and the keys its JSON must carry.
fn check_demo(backend: &str, out: &std::process::Output, mode: &str) {
    assert_no_panic(out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let j = last_json(out);
    assert!(out.status.success(), "{backend}: {stderr}\n{j}");
    assert_eq!(j["status"], "completed", "{j}");
    assert_eq!(j["digest_match"], true, "{j}");
    assert_eq!(j["mismatches_before"], 0, "{j}");
    assert_eq!(j["mismatches_after"], 0, "{j}");
    assert!(j["dest_passes_after"].as_u64().unwrap() >= 1, "{j}");
    assert_eq!(j["restore"]["mode"], mode, "{j}");
    for key in ["total_ms", "pause_ms", "bytes"] {
        assert!(j["snapshot"][key].as_f64().unwrap() > 0.0, "{key}: {j}");
    }
    for key in ["first_instruction_ms", "working_set_ms", "resident_ms"] {
        assert!(j["restore"][key].as_f64().unwrap() > 0.0, "{key}: {j}");
    }
    // Lazily, how many touches wait depends on the race between the
    // guest and the fill; eagerly, none can.
    let faults = j["restore"]["blocking_faults"].as_u64().unwrap();
    assert!(mode != "eager" || faults == 0, "{j}");
}

#[test]
fn the_snapshot_demo_refuses_what_it_cannot_do() {
    let out = run(&["demo", "--snapshot", "--tls"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--tls") && stderr.contains("--snapshot"),
        "{stderr}"
    );
    for args in [
        &["demo", "--snapshot-file", "/tmp/x.snap"][..],
        &["demo", "--restore", "lazy"],
    ] {
        let out = run(args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--snapshot"), "{args:?}: {stderr}");
    }
    let out = run(&["demo", "--snapshot", "--restore", "sideways"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lazy-working-set"), "{stderr}");
}
