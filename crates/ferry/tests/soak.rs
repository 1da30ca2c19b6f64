//! `ferry bench soak`: a guest ping-pongs A→B→A..., every hop verified, and
//! no process is left behind.

mod common;
use common::*;

fn soak(backend: &str, count: &str, modes: &str) {
    let out_dir =
        std::env::temp_dir().join(format!("ferry-soak-test-{}-{backend}", std::process::id()));
    let out = Ferry::new("bench soak")
        .on(backend)
        .mem("16M")
        .args(&[
            "--count",
            count,
            "--modes",
            modes,
            "--json",
            "--out",
            out_dir.to_str().unwrap(),
        ])
        .run();
    assert_no_panic(&out);
    assert_success(&out);
    let j = last_json(&out);
    assert_eq!(j["hops"].as_u64(), count.parse().ok(), "{j}");
    assert_eq!(j["failed"], 0, "{j}");
    assert_eq!(j["last_end_clean"], true, "{j}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("B→A"), "{table}");
    assert!(out_dir.join(format!("soak-{backend}.svg")).exists());
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn a_soft_guest_ping_pongs_and_every_hop_verifies() {
    soak("soft", "4", "precopy,hybrid");
}

#[test]
fn a_kvm_guest_ping_pongs_and_every_hop_verifies() {
    if !require_kvm("soak on kvm") {
        return;
    }
    soak("kvm", "3", "precopy,postcopy,hybrid");
}
