//! `minivmm receive --cpu-without`: a destination that withholds a CPU
//! feature the source's guest was given refuses it before any memory
//! moves, naming the feature, and the source runs on. Needs /dev/kvm and
//! says SKIP where it is absent.

mod common;

use common::{kvm, EXE};
use std::process::{Command, Stdio};

/// A feature this host's KVM offers, so that the source's guest has it.
fn offered_feature() -> Option<&'static str> {
    let kvm = kvm_ioctls::Kvm::new().ok()?;
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .ok()?;
    let has = |function: u32, reg: fn(&kvm_bindings::kvm_cpuid_entry2) -> u32, bit: u32| {
        cpuid
            .as_slice()
            .iter()
            .any(|e| e.function == function && e.index == 0 && reg(e) & (1 << bit) != 0)
    };
    [
        ("avx2", has(7, |e| e.ebx, 5)),
        ("sse2", has(1, |e| e.edx, 26)),
    ]
    .into_iter()
    .find(|f| f.1)
    .map(|f| f.0)
}

#[test]
fn a_destination_without_a_feature_refuses_a_guest_given_it_and_the_source_runs_on() {
    if !kvm("minivmm receive --cpu-without") {
        return;
    }
    let Some(feature) = offered_feature() else {
        ferry_vm::skip!("SKIP minivmm --cpu-without: this host's KVM offers none of avx2, sse2");
        return;
    };
    let dir = std::env::temp_dir().join(format!("minivmm-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (dest, to) = common::receiver_with(
        &dir.join("destination.console"),
        &["--cpu-without", feature],
        Stdio::piped(),
    );
    let console = dir.join("source.console");
    let out = Command::new(EXE)
        .args(["migrate", "--json", "--data-mib", "16", "--to", &to])
        .args(["--run-before-ms", "300", "--run-after-failure-ms", "500"])
        .arg("--disk")
        .arg(dir.join("disk.img"))
        .arg("--console")
        .arg(&console)
        .output()
        .unwrap();
    let dest_out = dest.wait_with_output().unwrap();
    assert!(!dest_out.status.success(), "the destination took the guest");
    let dest_err = String::from_utf8_lossy(&dest_out.stderr);
    assert!(dest_err.contains(feature), "{dest_err}");
    assert!(!out.status.success());
    let j = common::last_json(&out.stdout);
    assert_eq!(j["status"], "failed", "{j}");
    assert!(j["error"].as_str().unwrap_or("").contains(feature), "{j}");
    assert!(common::source_kept_its_streams(&j, &console) > 0, "{j}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_unknown_feature_is_refused_before_anything_waits() {
    let out = Command::new(EXE)
        .args([
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--cpu-without",
            "nosuchflag",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cpu-without") && err.contains("nosuchflag"),
        "{err}"
    );
}
