//! End-to-end precopy migrations between two ferry processes over loopback, on
//! the kvm backend, in every dirty-tracking mode. Each must prove itself: the
//! memory digest matches, the guest's stamp checks find nothing, and the guest
//! runs on at the destination.

mod common;
use common::*;

fn migrate_in_mode(mode: &str) {
    if !require_kvm(&format!("migration in {mode} mode")) {
        return;
    }
    let out = Ferry::demo()
        .guest("64M", 64)
        .args(&[
            "--dirty-tracking",
            mode,
            "--ring-entries",
            "4096",
            "--warmup",
            "0.5",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_verified(&j, &stderr);
    assert_eq!(j["dirty_tracking"], mode);
    assert!(j["rounds"].as_u64().unwrap() >= 2, "{j}");
    assert!(j["bytes_sent"].as_u64().unwrap() > 0, "{j}");
    assert!(out.status.success(), "{stderr}");
}

#[test]
fn migrates_with_bitmap_tracking() {
    migrate_in_mode("bitmap");
}

#[test]
fn migrates_with_clear_tracking() {
    migrate_in_mode("clear");
}

#[test]
fn migrates_with_ring_tracking() {
    migrate_in_mode("ring");
}

#[test]
fn killed_destination_leaves_the_source_running() {
    if !require_kvm("killed destination") {
        return;
    }
    let mut dest = Receiver::start(&[]);
    // A 16 MiB/s cap makes the 256 MiB full pass take ~16 s, so the kill
    // lands mid-precopy.
    let source = ferry()
        .args([
            "migrate",
            "--to",
            &dest.addr,
            "--json",
            "--mem-per-vcpu",
            "128M",
            "--bandwidth",
            "16",
            "--warmup",
            "0.2",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the destination has accepted the connection, then kill it.
    let mut stderr = dest.child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    use std::io::Read;
    while !String::from_utf8_lossy(&seen).contains("migration from") {
        let n = stderr.read(&mut buf).unwrap();
        assert!(n > 0, "destination closed stderr early");
        seen.extend_from_slice(&buf[..n]);
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    dest.child.kill().unwrap();
    let out = source.wait_with_output().unwrap();
    assert_no_panic(&out);
    let j = last_json(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(j["status"], "failed", "{j}");
    assert_eq!(j["digest_checked"], false, "{j}");
    assert!(j["error"].as_str().unwrap_or_default().len() > 5, "{j}");
    assert_eq!(j["guest_mismatches"], 0, "{j}");
    let line = text
        .lines()
        .find(|l| l.starts_with("the source VM is still running"))
        .unwrap_or_else(|| panic!("no liveness line:\n{text}"));
    let passes: u64 = line
        .split(": ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(passes > 0, "source guest stopped: {line}");
    assert!(!out.status.success());
}

#[test]
fn migrates_on_the_soft_backend() {
    // The soft backend needs no /dev/kvm: this runs everywhere.
    let out = Ferry::demo()
        .on("soft")
        .guest("32M", 32)
        .args(&["--warmup", "0.3"])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "soft");
    assert_eq!(j["backend"], "ferry-soft");
}

#[test]
fn random_order_partial_writes_and_stride_migrate_exactly() {
    for backend in backends("random-order migration") {
        let out = Ferry::demo()
            .on(backend)
            .guest("32M", 32)
            .args(&[
                "--dirty-tracking",
                "ring",
                "--ring-entries",
                "1024",
                "--order",
                "random",
                "--write-percent",
                "30",
                "--stride",
                "3",
                "--vcpus",
                "3",
                "--warmup",
                "0.3",
            ])
            .run();
        assert_no_panic(&out);
        let j = last_json(&out);
        assert_verified(&j, backend);
        assert!(
            j["dest_passes_after"].as_u64().unwrap() >= 3,
            "{backend}: {j}"
        );
    }
}

#[test]
fn harvests_within_rounds_send_pages_dirtied_ahead_once_on_kvm() {
    if !require_kvm("harvests within rounds") {
        return;
    }
    // A 2 s full pass over a 64 MiB/s cap: about twenty harvests in it,
    // racing the quota's meter on the dirty ring.
    let out = Ferry::demo()
        .guest("64M", 64)
        .args(&[
            "--bandwidth",
            "64",
            "--dirty-tracking",
            "ring",
            "--harvest-within-rounds",
            "--warmup",
            "0.5",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_verified(&j, &stderr);
    let ahead = j["spared_pages"].as_u64().unwrap() + j["deferred_pages"].as_u64().unwrap();
    assert!(ahead > 0, "{j}");
    assert!(out.status.success(), "{stderr}");
}

#[test]
fn a_destination_without_a_backend_takes_the_streams() {
    // `ferry receive` with no --backend (auto) builds whichever of ferry's
    // VMs the stream names, here a soft one, on any machine.
    let mut dest = Receiver::start(&[]);
    let out = ferry()
        .args(["migrate", "--to", &dest.addr, "--json", "--backend", "soft"])
        .args(["--mem-per-vcpu", "16M", "--warmup", "0.2"])
        .output()
        .unwrap();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "soft");
    let (ok, stderr) = dest.finish_within(60, "the migration");
    assert!(ok, "the destination failed:\n{stderr}");
    // An explicit, different backend is still refused with the reason.
    if require_kvm("a kvm destination refuses a soft stream") {
        let mut dest = Receiver::start(&["--backend", "kvm"]);
        let out = ferry()
            .args(["migrate", "--to", &dest.addr, "--json", "--backend", "soft"])
            .args(["--mem-per-vcpu", "16M", "--warmup", "0.2"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let j = last_json(&out);
        assert!(
            j["error"]
                .as_str()
                .unwrap_or_default()
                .contains("both ends must use the same"),
            "{j}"
        );
        dest.finish_within(60, "the refusal");
    }
}

#[test]
fn a_guest_that_dies_after_the_move_fails_the_demo() {
    // The destination breaks the guest's code once it resumes: its vCPUs
    // fault (a triple fault, with no IDT), and the demo must say the
    // migration failed, naming the vCPU and its exit, however well the
    // memory moved.
    if !require_kvm("a guest that dies after the move") {
        return;
    }
    let out = Ferry::demo()
        .on("kvm")
        .guest("32M", 32)
        .args(&["--warmup", "0.3", "--break-dest-guest"])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success(), "the demo exited 0");
    let j = last_json(&out);
    assert_eq!(j["digest_match"], true, "the memory still moved: {j}");
    let error = j["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {j}"));
    assert!(
        error.contains("after switchover") && error.contains("vCPU") && error.contains("Shutdown"),
        "{error}"
    );
    // Where the vCPU was when it stopped, so the failure classifies itself.
    assert!(error.contains("rip=") && error.contains("cr3="), "{error}");
}
