//! `minivmm probe-host --json`: each piece a device thread needs (in-kernel
//! irqchip, PIT, ioeventfd on MMIO and on a port, irqfd) is tried on a
//! fresh VM and reported, with the kernel's error where it is refused; and
//! the cost of a queue notification either way is measured, with every
//! notification delivered and only the exit way exiting.

mod common;

use common::{kvm, last_json, EXE};
use std::process::Command;

#[test]
fn every_piece_is_tried_and_a_refusal_says_why() {
    if !kvm("minivmm probe-host") {
        return;
    }
    let out = Command::new(EXE)
        .args([
            "probe-host",
            "--json",
            "--notifications",
            "2000",
            "--runs",
            "1",
        ])
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
    let ioeventfd = found.iter().any(|f| {
        f["what"]
            .as_str()
            .unwrap()
            .starts_with("KVM_IOEVENTFD (MMIO")
            && f["works"] == true
    });
    let costs = j["notify_cost"].as_array().expect("notify_cost");
    let ways: Vec<&str> = costs
        .iter()
        .map(|c| c["notify"].as_str().unwrap())
        .collect();
    let want: &[&str] = if ioeventfd {
        &["exit", "ioeventfd"]
    } else {
        &["exit"]
    };
    assert_eq!(ways, want, "{j}");
    for c in costs {
        assert_eq!(c["delivered"], 2000, "every notification arrives: {c}");
        assert!(c["us_per_notification"].as_f64().unwrap() > 0.0, "{c}");
        let want_exits = if c["notify"] == "exit" { 2000 } else { 0 };
        assert_eq!(c["exits"], want_exits, "{c}");
    }
    // An interrupt through an irqfd either reaches the guest's handler
    // (every one raised), or the report says how the vCPU stopped or what
    // else the guest's IDT took.
    let irqs = &j["interrupt_delivery"];
    if !irqs.is_null() {
        let raised = irqs["raised"].as_u64().unwrap();
        assert!(raised >= 1, "{irqs}");
        let delivered = irqs["delivered"].as_u64().unwrap();
        let explained = !irqs["vcpu_stopped"].is_null() || !irqs["other_vector"].is_null();
        assert!(delivered == raised || explained, "{irqs}");
    }
}
