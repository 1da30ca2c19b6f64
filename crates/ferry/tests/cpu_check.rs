//! A destination whose host cannot give the guest the CPU it was given
//! refuses before any memory moves, naming the features, and the source's
//! guest runs on. The destination's KVM_GET_SUPPORTED_CPUID result loses
//! a feature (`ferry receive --cpu-without avx2`, a fleet's baseline CPU),
//! so the real check runs on the real input.

mod common;
use common::*;

/// A feature this host's KVM gives guests, to take away: (name, where).
/// kvm_pvm offers few (no avx2), so the list goes down to sse2.
fn offered_feature() -> Option<(&'static str, &'static str)> {
    let kvm = kvm_ioctls::Kvm::new().unwrap();
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .unwrap();
    let has = |function: u32, reg: fn(&kvm_bindings::kvm_cpuid_entry2) -> u32, bit: u32| {
        cpuid
            .as_slice()
            .iter()
            .any(|e| e.function == function && e.index == 0 && reg(e) & (1 << bit) != 0)
    };
    [
        ("avx2", "leaf 7 ebx bit 5", has(7, |e| e.ebx, 5)),
        ("clflushopt", "leaf 7 ebx bit 23", has(7, |e| e.ebx, 23)),
        ("sse2", "leaf 1 edx bit 26", has(1, |e| e.edx, 26)),
    ]
    .into_iter()
    .find(|f| f.2)
    .map(|f| (f.0, f.1))
}

#[test]
fn a_destination_without_a_feature_refuses_a_guest_given_it_and_the_source_runs_on() {
    if !require_kvm("the CPU check") {
        return;
    }
    let Some((feature, place)) = offered_feature() else {
        ferry_vm::skip!("SKIP the CPU check: this host's KVM offers none of the features it masks");
        return;
    };
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("kvm").guest("32M", 32));
    let mut dest = Receiver::start(&["--backend", "kvm", "--cpu-without", feature]);
    let out = Ferry::new("migrate")
        .args(&[
            "--to",
            &dest.addr,
            "--control",
            sock.to_str().unwrap(),
            "--json",
        ])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let lacks = format!("it lacks {feature} ({place})");
    let j = last_json(&out);
    assert_eq!(
        j["error"],
        format!("destination refused the stream: this host cannot give the guest the CPU it was given: {lacks}"),
        "{j}"
    );
    assert_eq!(j["round_stats"].as_array().map(Vec::len), Some(0), "{j}");
    let (ok, derr) = dest.finish_within(30, "the refusal");
    assert!(!ok && derr.contains(&lacks), "{derr}");

    // The guest runs on at the source, and a destination without the mask
    // takes it.
    let status = ask(&sock, r#"{"execute":"query-status"}"#);
    assert_eq!(status["return"]["status"], "running", "{status}");
    let dest = Receiver::start(&["--backend", "kvm"]);
    let out = Ferry::new("migrate")
        .args(&[
            "--to",
            &dest.addr,
            "--control",
            sock.to_str().unwrap(),
            "--json",
        ])
        .run();
    assert_verified(&last_json(&out), "after the refusal");
    assert!(vm.wait().unwrap().success());
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn an_unknown_feature_is_refused_before_listening() {
    let out = Ferry::new("receive")
        .args(&["--listen", "127.0.0.1:0", "--cpu-without", "avx9000"])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cpu-without: unknown CPU feature 'avx9000'"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"));
}
