//! `ferry plan` as an operator runs it: on a fleet file or a drawn one,
//! with every baseline beside the plan, and clear errors for bad input.

mod common;
use common::*;

/// A small fleet: two racks of three hosts at 1 GB/s, 3:1 uplinks, the
/// first rack drained with six VMs on it.
fn small_fleet() -> serde_json::Value {
    let host = |i: usize| {
        serde_json::json!({"name": format!("h{i}"), "rack": i / 3, "cpus": 64,
            "memory_bytes": 64u64 << 30, "nic_bytes_per_sec": 1e9})
    };
    let vm = |i: usize| {
        let bytes = (1u64 + i as u64 % 3) << 30;
        serde_json::json!({"name": format!("vm{i}"), "host": i % 3, "memory_bytes": bytes,
            "data_bytes": bytes, "dirty_bytes_per_sec": [2e7 * i as f64],
            "working_set_bytes": [bytes], "downtime_target_ms": 300.0})
    };
    serde_json::json!({
        "hosts": (0..6).map(host).collect::<Vec<_>>(),
        "network": {"kind": "fat-tree", "oversubscription": 3.0},
        "vms": (0..6).map(vm).collect::<Vec<_>>(),
        "drain": [0, 1, 2],
    })
}

/// A directory of this test's own, emptied first.
fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ferry-plan-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_fleet_file_is_planned_and_compared_with_every_baseline() {
    let dir = tempdir("file");
    let path = dir.join("fleet.json");
    std::fs::write(&path, small_fleet().to_string()).unwrap();
    let out = ferry()
        .args(["plan", path.to_str().unwrap(), "--compare", "--json"])
        .output()
        .unwrap();
    assert_success(&out);
    let j = last_json(&out);
    assert_eq!(j["vms"].as_array().unwrap().len(), 6, "{j}");
    assert_eq!(j["failed"], 0, "{j}");
    let (planned, bound) = (
        j["makespan_s"].as_f64().unwrap(),
        j["lower_bound_s"].as_f64().unwrap(),
    );
    assert!(planned >= bound * 0.999, "{j}");
    for v in j["vms"].as_array().unwrap() {
        let to = v["to"].as_str().unwrap();
        assert!(["h3", "h4", "h5"].contains(&to), "{v}");
    }
    let compare = j["compare"].as_object().unwrap();
    assert_eq!(compare.len(), 5, "{j}");
    // KubeVirt's 2 out of a node cannot beat one full-rate migration per host.
    assert!(
        compare["kubevirt"]["makespan_s"].as_f64().unwrap() >= planned,
        "{j}"
    );
}

#[test]
fn a_drawn_fleet_is_saved_and_planned_the_same_from_its_file() {
    let dir = tempdir("drawn");
    let path = dir.join("drawn.json");
    let drawn = ferry()
        .args([
            "plan",
            "--generate",
            "64",
            "--seed",
            "3",
            "--json",
            "--write-fleet",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert_success(&drawn);
    let again = ferry()
        .args(["plan", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_success(&again);
    let (a, b) = (last_json(&drawn), last_json(&again));
    assert_eq!(a["makespan_s"], b["makespan_s"]);
    assert!(a["vms"].as_array().unwrap().len() >= 200, "{a}");
}

#[test]
fn bad_fleets_get_clear_errors() {
    let dir = tempdir("bad");
    // `ferry plan` on a file holding `text`.
    let plan_file = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        vec!["plan".to_string(), p.display().to_string()]
    };
    let mut stray = small_fleet();
    stray["vms"][0]["host"] = 9.into();
    let mut huge = small_fleet();
    huge["vms"][5]["memory_bytes"] = (1u64 << 50).into();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["plan".into()],
            "give a fleet file, or --generate HOSTS",
        ),
        (
            vec!["plan".into(), dir.join("nope.json").display().to_string()],
            "cannot read",
        ),
        (
            plan_file("bad.json", "{\"hosts\": []}".into()),
            "not a fleet",
        ),
        (
            plan_file("stray.json", stray.to_string()),
            "vm0 is on host 9",
        ),
        (
            plan_file("huge.json", huge.to_string()),
            "VM vm5: no host takes it",
        ),
    ];
    for (args, want) in cases {
        let out = ferry().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn the_plan_is_exported_for_kubevirt_alone_on_stdout_or_to_a_file() {
    let dir = tempdir("export");
    let path = dir.join("fleet.json");
    std::fs::write(&path, small_fleet().to_string()).unwrap();
    let fleet = path.to_str().unwrap();
    let out = ferry()
        .args(["plan", fleet, "--export", "kubevirt", "--namespace", "vms"])
        .output()
        .unwrap();
    assert_success(&out);
    let list: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout holds the export alone");
    assert_eq!(list["kind"], "List", "{list}");
    let items = list["items"].as_array().unwrap();
    let migrations: Vec<&serde_json::Value> = items
        .iter()
        .filter(|o| o["kind"] == "VirtualMachineInstanceMigration")
        .collect();
    assert_eq!(migrations.len(), 6, "{list}");
    for m in &migrations {
        assert_eq!(m["metadata"]["namespace"], "vms", "{m}");
        let to = m["spec"]["addedNodeSelector"]["kubernetes.io/hostname"]
            .as_str()
            .unwrap();
        assert!(["h3", "h4", "h5"].contains(&to), "{m}");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kubectl label vmi --overwrite -n vms"),
        "{err}"
    );

    // With --out: the same export in the file, and the table as usual.
    let file = dir.join("plan.json");
    let out = ferry()
        .args(["plan", fleet, "--export", "kubevirt", "--namespace", "vms"])
        .arg("--out")
        .arg(&file)
        .output()
        .unwrap();
    assert_success(&out);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written, list);
    assert!(String::from_utf8_lossy(&out.stdout).contains("planner's drain"));

    // What cannot be exported, and nothing on stdout then.
    let mut huge = small_fleet();
    huge["vms"][5]["memory_bytes"] = (1u64 << 50).into();
    let huge_path = dir.join("huge.json");
    std::fs::write(&huge_path, huge.to_string()).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![fleet, "--export", "kubevirt", "--policy", "nova"],
            "--export writes the planner's plan, not nova's",
        ),
        (
            vec![fleet, "--export", "kubevirt", "--json"],
            "give --out FILE",
        ),
        (vec![fleet, "--out", "x.json"], "--export"),
        (
            vec![huge_path.to_str().unwrap(), "--export", "kubevirt"],
            "VM vm5: no host takes it",
        ),
    ];
    for (args, want) in cases {
        let out = ferry().arg("plan").args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} wrote to stdout");
    }
}
