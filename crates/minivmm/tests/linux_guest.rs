//! `--guest linux` where it cannot run, and its bad input: refused before
//! anything starts, with a message that says why and what to do. (The
//! Linux guest itself runs inside the SVM host: scripts/svm-ci.sh.)

mod common;

use std::process::Command;

fn minivmm(args: &[&str]) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("minivmm-linux-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(common::EXE)
        .args(args)
        .arg("--disk")
        .arg(dir.join("disk.img"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn on_kvm_pvm() -> bool {
    let loaded = |m: &str| std::path::Path::new("/sys/module").join(m).exists();
    loaded("kvm_pvm") && !loaded("kvm_intel") && !loaded("kvm_amd")
}

#[test]
fn a_linux_guest_is_refused_on_a_host_that_runs_guests_only_at_cpl3() {
    if !on_kvm_pvm() {
        ferry_vm::skip!(
            "SKIP minivmm linux_guest: this host's KVM is not kvm_pvm, so nothing to refuse"
        );
        return;
    }
    let (ok, err) = minivmm(&[
        "run",
        "--guest",
        "linux",
        "--kernel",
        "/nonexistent",
        "--initrd",
        "/nonexistent",
    ]);
    assert!(!ok, "{err}");
    assert!(err.contains("kvm_pvm") && err.contains("CPL3"), "{err}");
    assert!(err.contains("scripts/svm-host.sh"), "{err}");
}

#[test]
fn a_linux_guest_without_a_kernel_or_with_too_little_memory_is_refused_by_name() {
    if on_kvm_pvm() {
        ferry_vm::skip!("SKIP minivmm linux_guest: kvm_pvm refuses a Linux guest before its arguments (the test above); scripts/svm-ci.sh runs this one in the SVM host");
        return;
    }
    let (ok, err) = minivmm(&[
        "run",
        "--guest",
        "linux",
        "--initrd",
        "/x",
        "--kernel",
        "/nonexistent",
    ]);
    assert!(!ok);
    assert!(err.contains("/nonexistent"), "{err}");
    let (ok, err) = minivmm(&[
        "run",
        "--guest",
        "linux",
        "--kernel",
        "/k",
        "--initrd",
        "/i",
        "--mem-mib",
        "64",
    ]);
    assert!(!ok);
    assert!(err.contains("--mem-mib 64"), "{err}");
}
