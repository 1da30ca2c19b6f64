//! `ferry demo --netns`: two hosts on one machine, each in a network
//! namespace of its own over a shaped veth pair, and nothing left behind.

mod common;
use common::*;
use std::process::{Command, Stdio};

/// Whether this machine can make network namespaces (root and iproute2's
/// ip and tc); prints a SKIP line if not.
fn require_netns(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["ip", "tc"].iter().all(|t| {
        Command::new(t)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !root {
        ferry_vm::skip!("SKIP {test}: network namespaces need root");
    } else if !tools {
        skip_unless_set_up_lacks(test, "iproute2", "iproute2's ip and tc are missing");
    }
    root && tools
}

fn namespaces() -> String {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts that ferry process `pid` left none of its namespaces (their
/// names end in its pid; other tests' may exist meanwhile).
fn assert_namespaces_gone(pid: u32, what: &str) {
    let left = namespaces();
    assert!(
        !left.contains(&format!("-{pid}")),
        "{what} left its namespaces behind: {left}"
    );
}

/// `ferry demo --json --backend soft --warmup 0.3 --netns` with a small
/// guest and `extra`.
fn netns_demo(extra: &[&str]) -> std::process::Command {
    let mut cmd = ferry();
    cmd.args([
        "demo",
        "--json",
        "--backend",
        "soft",
        "--mem-per-vcpu",
        "8M",
        "--warmup",
        "0.3",
        "--netns",
    ])
    .args(extra);
    cmd
}

#[test]
fn a_demo_between_two_namespaces_over_a_shaped_link_verifies_and_leaves_nothing() {
    if !require_netns("demo --netns") {
        return;
    }
    let child = netns_demo(&["--link-rate", "64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "demo --netns");
    // The prediction knew the shaped link's rate.
    assert_eq!(j["predicted"]["link_known"], true, "{j}");
    // Two hosts: the source hashed at once, yielding to no guest.
    assert_eq!(j["digest_yield_ms"].as_f64(), Some(0.0), "{j}");
    assert_namespaces_gone(pid, "the demo");
}

#[test]
fn bad_link_settings_are_refused_in_words() {
    let out = Ferry::new("demo").args(&["--link-rate", "64"]).run();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--netns"), "{err}");
    let out = Ferry::new("demo")
        .args(&["--netns", "--link-rate", "0"])
        .run();
    assert!(!out.status.success());
}

#[test]
fn a_link_delay_runs_or_is_refused_in_words() {
    if !require_netns("demo --netns --link-delay-ms") {
        return;
    }
    let out = netns_demo(&["--link-delay-ms", "2"]).output().unwrap();
    assert_no_panic(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        assert_verified(&last_json(&out), "demo --netns with a delay");
    } else {
        // Kernels built without netem cannot delay packets.
        assert!(err.contains("CONFIG_NET_SCH_NETEM"), "{err}");
    }
}

#[test]
fn namespaces_of_a_killed_demo_are_swept_by_the_next_one() {
    if !require_netns("demo --netns after SIGKILL") {
        return;
    }
    // 1 MiB/s for 16 MiB: the first demo is still migrating when killed.
    let mut first = netns_demo(&["--link-rate", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let name = format!("ferry-src-{}", first.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !namespaces().contains(&name) {
        assert!(
            std::time::Instant::now() < deadline,
            "no namespace appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(namespaces().contains(&name), "SIGKILL runs no cleanup");
    let out = netns_demo(&[]).output().unwrap();
    assert_verified(&last_json(&out), "demo --netns after a killed one");
    let left = namespaces();
    assert!(!left.contains(&name), "the stale pair survived: {left}");
}

/// `ferry drain --netns --small`: a real drain under every policy, each VM
/// moved and verified, the simulator's prediction beside each, and the
/// hosts' namespaces gone afterwards.
#[test]
fn a_real_drain_moves_every_vm_verified_under_every_policy() {
    if !require_netns("drain --netns") {
        return;
    }
    let backend = backends("drain --netns")[0];
    let child = ferry()
        .args([
            "drain",
            "--netns",
            "--small",
            "--json",
            "--backend",
            backend,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_success(&out);
    let j = last_json(&out);
    for policy in ["planner", "kubevirt", "kubevirt-default"] {
        let p = &j["policies"][policy];
        let context = format!("{policy}: {p}");
        assert_eq!(p["migrations"], 3, "{context}");
        assert_eq!(p["failed"], 0, "{context}");
        assert_eq!(p["digest_mismatches"], 0, "{context}");
        assert_eq!(p["guest_mismatches"], 0, "{context}");
        assert!(p["makespan_s"].as_f64().unwrap() > 0.0, "{context}");
        assert!(
            p["predicted_makespan_s"].as_f64().unwrap() > 0.0,
            "{context}"
        );
        for vm in p["vms"].as_array().unwrap() {
            assert_eq!(vm["status"], "completed", "{context}");
            assert_eq!(vm["from"], "host1", "{context}");
            assert_ne!(vm["to"], "host1", "{context}");
            assert!(
                vm["dest_passes_after"].as_u64().unwrap_or(0) >= 1,
                "{context}"
            );
        }
    }
    // The planner's destinations are its own; KubeVirt's are by free memory:
    // the first two go to the two hosts with the most.
    let kubevirt: Vec<&str> = j["policies"]["kubevirt"]["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["to"].as_str().unwrap())
        .collect();
    assert!(
        kubevirt.contains(&"host2") && kubevirt.contains(&"host3"),
        "{kubevirt:?}"
    );
    assert_namespaces_gone(pid, "the drain");
}

/// The planner's drain of the small fleet with `flags` (a link and what
/// the plan assumes), as its JSON, once every VM moved verified; `None`
/// (with a SKIP line) where network namespaces are not available.
fn planner_drain(what: &str, flags: &[&str]) -> Option<serde_json::Value> {
    if !require_netns(what) {
        return None;
    }
    let backend = backends(what)[0];
    let mut args = vec![
        "drain",
        "--netns",
        "--small",
        "--json",
        "--policies",
        "planner",
    ];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--backend", backend]);
    let out = run(&args);
    assert_success(&out);
    let p = last_json(&out)["policies"]["planner"].clone();
    assert_eq!(p["failed"], 0, "{p}");
    assert_eq!(p["digest_mismatches"], 0, "{p}");
    Some(p)
}

/// A plan that assumes NICs four times faster than the shaped ones: the
/// planner's drain runs slower than planned, measures the NIC, plans the
/// VM not yet started again, and says so; every VM still moves verified.
#[test]
fn a_drain_slower_than_planned_is_planned_again_from_the_measured_nic() {
    let flags = ["--link-rate", "100", "--assume-link-rate", "400"];
    let Some(p) = planner_drain("drain --netns --assume-link-rate", &flags) else {
        return;
    };
    // The first re-plan starts from the NIC assumed; a later one may refine
    // an early measurement (a migration looked at while it still ran). Each
    // found the NIC slower than the plan in force assumed.
    let replans = p["replans"].as_array().unwrap();
    assert!(!replans.is_empty(), "{p}");
    assert_eq!(replans[0]["assumed_nic_mib_s"], 400.0, "{p}");
    for r in replans {
        let assumed = r["assumed_nic_mib_s"].as_f64().unwrap();
        let measured = r["measured_nic_mib_s"].as_f64().unwrap();
        assert!(measured > 0.0 && measured < assumed * 0.85, "{r}");
        assert!(r["replanned_vms"].as_u64().unwrap() >= 1, "{r}");
    }
    let first = &replans[0];
    assert!(
        first["predicted_end_after_s"].as_f64().unwrap()
            > first["predicted_end_before_s"].as_f64().unwrap(),
        "{first}"
    );
}

#[test]
fn a_drain_whose_guests_dirty_faster_than_planned_is_planned_again_from_their_rates() {
    // The plan thinks each guest writes nothing; over a 50 MiB/s link the
    // 32 MiB/s one takes several times its planned time.
    let flags = ["--link-rate", "50", "--assume-dirty-share", "0"];
    let Some(p) = planner_drain("drain --netns --assume-dirty-share", &flags) else {
        return;
    };
    assert_eq!(p["guest_mismatches"], 0, "{p}");
    for r in p["replans"].as_array().unwrap() {
        // Whatever re-plan there was named each guest it found dirtier
        // than planned, at a measured rate the plan had not assumed.
        for d in r["dirtier"].as_array().unwrap() {
            assert_eq!(d["assumed_mib_s"], 0.0, "{r}");
            assert!(d["measured_mib_s"].as_f64().unwrap() > 2.0, "{r}");
        }
    }
    let dirtier: usize = p["replans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["dirtier"].as_array().map_or(0, |d| d.len()))
        .sum();
    assert!(
        dirtier >= 1,
        "no re-plan found a guest dirtier than planned: {p}"
    );
}
