//! The README's main job on a machine without a usable `/dev/kvm`: it runs
//! on the soft backend, says so in one line, and ends with the digest
//! matched. `/dev/kvm` is hidden by binding `/dev/null` over it in a
//! private mount namespace (util-linux's `unshare`), so the rest of the
//! machine is untouched. An explicit `--backend kvm` still fails, clearly.

mod common;

use common::last_json;
use std::path::Path;
use std::process::{Command, Output};

/// The README's main-job arguments: the first `cargo run --release --` line
/// under "Run the main job", after the `--`.
fn main_job_args() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("README.md");
    let after = &readme[readme.find("Run the main job").expect("a main job")..];
    let line = after
        .lines()
        .find(|l| l.starts_with("cargo run --release -- "))
        .expect("a cargo run line");
    line["cargo run --release -- ".len()..]
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Runs ferry with `args` where `/dev/kvm` is `/dev/null`; `None` (with a
/// SKIP line) where this process may not make a mount namespace.
fn without_kvm(test: &str, args: &[String]) -> Option<Output> {
    let ferry = env!("CARGO_BIN_EXE_ferry");
    let mut cmd = if Path::new("/dev/kvm").exists() {
        // SAFETY: geteuid has no preconditions and touches no memory.
        if unsafe { libc::geteuid() } != 0 {
            ferry_vm::skip!("SKIP {test}: hiding /dev/kvm needs root (a mount namespace)");
            return None;
        }
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind /dev/null /dev/kvm && exec "$0" "$@""#)
            .arg(ferry);
        c
    } else {
        Command::new(ferry)
    };
    Some(cmd.args(args).output().expect("unshare runs"))
}

#[test]
fn the_main_job_runs_on_the_soft_backend_without_kvm() {
    let mut args = main_job_args();
    args.push("--json".into());
    let Some(out) = without_kvm("the main job without /dev/kvm", &args) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);
    let json = last_json(&out);
    assert_eq!(json["backend"], "ferry-soft", "{json}");
    assert_eq!(json["digest_match"], true, "{json}");
    assert!(json["error"].is_null(), "{json}");
    let said: Vec<_> = stderr
        .lines()
        .filter(|l| l.contains("running on the soft backend"))
        .collect();
    assert_eq!(
        said.len(),
        1,
        "one line says why the soft backend runs:\n{stderr}"
    );
    assert!(said[0].contains("/dev/kvm"), "{}", said[0]);
}

#[test]
fn an_explicit_kvm_backend_still_fails_clearly() {
    let args: Vec<String> = ["demo", "--backend", "kvm", "--mem-per-vcpu", "16M"]
        .map(String::from)
        .to_vec();
    let Some(out) = without_kvm("--backend kvm without /dev/kvm", &args) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("/dev/kvm"),
        "the error names /dev/kvm: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
