//! `ferry bench converge` end to end on one small soft cell: the quota
//! converges a guest that dirties faster than the link, and the outputs have
//! the promised shape; a malformed cell is refused in words.

mod common;

use common::{assert_no_panic, assert_success, last_json, Ferry};

#[test]
fn bench_converge_runs_a_cell_per_policy_and_writes_its_outputs() {
    let out_dir = std::env::temp_dir().join(format!("ferry-bench-converge-{}", std::process::id()));
    let out = Ferry::new("bench converge")
        .on("soft")
        .args(&[
            "--policies",
            "auto,quota",
            "--cell",
            "16M,1,max,100,32",
            "--skip-mixes",
            "--json",
            "--out",
            out_dir.to_str().expect("utf-8 temp dir"),
        ])
        .run();
    assert_success(&out);
    let j = last_json(&out);
    let cells = j["cells"].as_array().cloned().unwrap_or_default();
    assert_eq!(cells.len(), 1, "{j}");
    let quota = &cells[0]["results"]["quota"];
    assert_eq!(quota["converged"], true, "{j}");
    for key in ["total_ms", "downtime_ms", "runtime_pct", "progress_pct"] {
        assert!(quota[key].as_f64().is_some(), "{key}: {j}");
    }
    assert!(cells[0]["results"]["auto"].is_object(), "{j}");
    assert!(out_dir.join("converge-soft.json").exists());
    assert!(out_dir.join("converge-soft.svg").exists());
    assert!(out_dir.join("converge-soft-cell1-quota.svg").exists());
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn a_malformed_cell_is_refused_in_words() {
    let out = Ferry::new("bench converge")
        .args(&["--cell", "16M,1,fast,100,32"])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rate 'fast'"), "{stderr}");
}
