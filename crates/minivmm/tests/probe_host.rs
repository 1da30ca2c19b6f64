//! `minivmm probe-host --json`: each piece a device thread needs (in-kernel
//! irqchip, PIT, ioeventfd on MMIO and on a port, irqfd) is tried on a
//! fresh VM and reported, with the kernel's error where it is refused.

mod common;

use common::{kvm, last_json, EXE};
use std::process::Command;

#[test]
fn every_piece_is_tried_and_a_refusal_says_why() {
    if !kvm("minivmm probe-host") {
        return;
    }
    let out = Command::new(EXE)
        .args(["probe-host", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = last_json(&out.stdout);
    let found = j["findings"].as_array().expect("findings");
    let names: Vec<&str> = found.iter().map(|f| f["what"].as_str().unwrap()).collect();
    for want in [
        "KVM_CREATE_IRQCHIP",
        "KVM_CREATE_PIT2",
        "KVM_IOEVENTFD",
        "KVM_IRQFD",
    ] {
        assert!(names.iter().any(|n| n.starts_with(want)), "{want}: {j}");
    }
    for f in found {
        match f["works"].as_bool().unwrap() {
            true => assert!(f["error"].is_null(), "{f}"),
            false => assert!(!f["error"].as_str().unwrap().is_empty(), "{f}"),
        }
    }
}
