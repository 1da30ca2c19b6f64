//! Postcopy and hybrid demos between two ferry processes over loopback, on
//! both backends, with a guest that writes as fast as it can. Each must
//! prove itself like a precopy: the digest of the source's memory at
//! switchover matches the pages the destination received, and the guest's
//! own stamp checks find nothing.

mod common;
use common::*;

fn demo(backend: &str, mode: &str) {
    demo_with(backend, mode, None);
}

/// A demo in `mode`; `fault_path` forces the destination's fault path.
fn demo_with(backend: &str, mode: &str, fault_path: Option<&str>) {
    if backend == "kvm" && !require_kvm(&format!("{mode} on kvm")) {
        return;
    }
    let forced = fault_path.map_or(vec![], |p| vec!["--fault-path", p]);
    let args: Vec<&str> = [
        "demo",
        "--json",
        "--backend",
        backend,
        "--mode",
        mode,
        "--unthrottled",
        "--mem-per-vcpu",
        "64M",
        "--warmup",
        "0.3",
        // So tight that precopy never converges first (a hybrid that
        // converges finishes as precopy, as the engine tests check).
        "--downtime-ms",
        "1",
    ]
    .into_iter()
    .chain(forced)
    .collect();
    let out = run(&args);
    assert_no_panic(&out);
    let j = last_json(&out);
    let context = format!("{backend} {mode}: {}", String::from_utf8_lossy(&out.stderr));
    assert_verified(&j, &context);
    assert_eq!(j["mode"], mode, "{j}");
    let p = &j["postcopy"];
    assert!(p["missing_pages"].as_u64().unwrap() > 0, "{j}");
    assert!(p["postcopy_ms"].as_f64().unwrap() > 0.0, "{j}");
    assert!(p["page_requests"].as_u64().is_some(), "{j}");
    assert!(p["block_ms"].as_f64().is_some(), "{j}");
    // Soft vCPUs resolve their own faults (annotated exits); kvm's fault
    // through userfaultfd (this host has no KVM_EXIT_MEMORY_FAULT).
    let path = match (backend, fault_path) {
        (_, Some(forced)) => forced,
        ("soft", None) => "vcpu exit",
        _ => "userfaultfd",
    };
    assert_eq!(p["fault_path"], path, "{j}");
    if path == "vcpu exit" {
        assert!(p["vcpu_exits"].as_u64().unwrap() > 0, "{j}");
    }
    // Soft vCPUs touch guest memory on their own threads on either path;
    // a KVM vCPU's faults may be served by KVM's async page-fault workers.
    blocked_threads(&j, backend == "soft");
    let kinds: Vec<_> = j["round_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds.last().map(String::as_str), Some("postcopy"), "{j}");
    if mode == "hybrid" {
        assert_eq!(kinds[0], "full", "{j}");
    } else {
        assert_eq!(kinds.len(), 1, "{j}");
    }
    assert!(out.status.success(), "{context}");
}

/// Each thread's waits add up to at least the guest's (which counts a
/// page once, from its first waiter on); where vCPUs fault on their own
/// threads (`own_threads`) every vCPU is named, and a thread that is not
/// one has a name.
fn blocked_threads(j: &serde_json::Value, own_threads: bool) {
    let p = &j["postcopy"];
    let blocked = p["blocked"].as_array().expect("blocked threads");
    let each: f64 = blocked
        .iter()
        .map(|b| b["blocked_ms"].as_f64().unwrap())
        .sum();
    let total = p["block_ms"].as_f64().unwrap();
    assert!(
        each + 0.01 >= total,
        "{each} ms in threads < {total} ms: {p}"
    );
    assert!(p["blocked_bin_ms"].as_f64().unwrap() >= 10.0, "{p}");
    for b in blocked {
        assert!(
            b["vcpu"].is_u64() || !b["name"].as_str().unwrap_or("").is_empty(),
            "a waiting thread is named: {b}"
        );
    }
    if own_threads {
        let vcpus = j["vcpu_shares"].as_array().map_or(1, Vec::len) as u64;
        for v in 0..vcpus {
            assert!(blocked.iter().any(|b| b["vcpu"] == v), "vCPU {v}: {p}");
        }
    }
}

#[test]
fn postcopy_on_kvm() {
    demo("kvm", "postcopy");
}

#[test]
fn hybrid_on_kvm() {
    demo("kvm", "hybrid");
}

#[test]
fn postcopy_on_soft() {
    demo("soft", "postcopy");
}

#[test]
fn hybrid_on_soft() {
    demo("soft", "hybrid");
}

#[test]
fn soft_postcopy_through_userfaultfd_when_asked() {
    demo_with("soft", "postcopy", Some("userfaultfd"));
}

#[test]
fn postcopy_refuses_delta_and_unknown_modes() {
    let out = Ferry::new("demo")
        .on("soft")
        .args(&["--mode", "postcopy", "--delta"])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("delta re-sends cannot be used with a postcopy migration"),
        "{stderr}"
    );
    let out = Ferry::new("demo").args(&["--mode", "sideways"]).run();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("expected one of precopy, postcopy, hybrid"),
        "{stderr}"
    );
}

#[test]
fn switch_settings_need_a_hybrid() {
    for args in [
        ["demo", "--on-stall", "postcopy", "--backend", "soft"],
        ["demo", "--postcopy-after-rounds", "3", "--backend", "soft"],
    ] {
        let out = run(&args);
        assert_no_panic(&out);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("needs the hybrid mode"),
            "{args:?}: {stderr}"
        );
    }
}

/// Free 2 MiB huge pages in the host's pool.
fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// kvm vCPUs on hugetlb guest RAM fault through userfaultfd for whole
/// 2 MiB pages, which the destination fills before it places them.
fn demo_on_hugetlb(mode: &str) {
    let test = format!("{mode} onto hugetlb on kvm");
    if !require_kvm(&test) {
        return;
    }
    // Two guests of 1 x 32 MiB plus their system slots, source and
    // destination both on hugetlb.
    if free_huge_pages() < 48 {
        ferry_vm::skip!(
            "SKIP {test}: 48 free 2 MiB huge pages needed, {} free",
            free_huge_pages()
        );
        return;
    }
    let out = Ferry::demo()
        .on("kvm")
        .mem("32M")
        .args(&[
            "--backing",
            "hugetlb",
            "--mode",
            mode,
            "--unthrottled",
            "--vcpus",
            "1",
            "--warmup",
            "0.3",
            "--downtime-ms",
            "1",
            "--fault-handlers",
            "2",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    let context = format!(
        "kvm {mode} on hugetlb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_verified(&j, &context);
    assert_eq!(j["mode"], mode, "{j}");
    assert_eq!(j["postcopy"]["fault_path"], "userfaultfd", "{j}");
    assert!(j["postcopy"]["missing_pages"].as_u64().unwrap() > 0, "{j}");
    assert!(out.status.success(), "{context}");
}

/// One test for both modes, one after the other: two at once could take
/// more huge pages than CI reserves (64).
#[test]
fn postcopy_and_hybrid_onto_hugetlb_on_kvm() {
    demo_on_hugetlb("postcopy");
    demo_on_hugetlb("hybrid");
}

#[test]
fn a_destination_started_with_no_postcopy_refuses_a_hybrid_source_before_memory_moves() {
    let mut dest = Receiver::start(&["--backend", "soft", "--no-postcopy"]);
    let out = Ferry::new("migrate")
        .on("soft")
        .mem("32M")
        .args(&[
            "--to", &dest.addr, "--mode", "hybrid", "--json", "--warmup", "0.2",
        ])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "the destination does not take postcopy: \
             this destination was started with --no-postcopy"
        ),
        "{err}"
    );
    let j = last_json(&out);
    assert_eq!(j["status"], "failed", "{j}");
    assert_eq!(j["round_stats"].as_array().map(Vec::len), Some(0), "{j}");
    let (ok, derr) = dest.finish_within(30, "the refusal");
    assert!(!ok && derr.contains("does not take postcopy"), "{derr}");
}
