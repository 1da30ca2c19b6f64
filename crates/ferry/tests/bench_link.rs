//! `ferry bench link` end to end on a small soft guest: every cell verified,
//! the placed-TCP ceiling measured next to raw TCP, the repeated cells as
//! medians of their runs, JSON and SVG written.

mod common;

use common::{assert_success, last_json, Ferry};

#[test]
fn bench_link_measures_the_placed_ceiling_and_verifies_every_cell() {
    let out_dir = std::env::temp_dir().join(format!("ferry-bench-link-{}", std::process::id()));
    let out = Ferry::new("bench link")
        .on("soft")
        .args(&[
            "--mem",
            "64M",
            "--connections",
            "1",
            "--raw-secs",
            "0.2",
            "--cap-mib-s",
            "0",
            "--repeat",
            "2",
            "--json",
            "--out",
            out_dir.to_str().expect("utf-8 temp dir"),
        ])
        .run();
    assert_success(&out);
    let j = last_json(&out);
    for key in ["loopback_gib_s", "placed_floor_gib_s", "first_pass_gib_s"] {
        assert!(j[key].as_f64().unwrap_or(0.0) > 0.0, "{key}: {j}");
    }
    let f = |key: &str| j[key].as_f64().unwrap_or(0.0);
    let vs_floor = f("first_pass_gib_s") / f("placed_floor_gib_s");
    assert!((f("vs_placed_floor") - vs_floor).abs() < 1e-9, "{j}");
    let written: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("link.json")).expect("link.json written"),
    )
    .expect("link.json is JSON");
    let cells = written["results"]["cells"]
        .as_array()
        .or_else(|| written["cells"].as_array())
        .expect("cells");
    // The floor and the plain first pass ran twice each: their figure is
    // the median (here the mean) of the two runs kept in the JSON.
    for (what, fill, compress) in [
        ("raw TCP, placed", "-", "-"),
        ("first pass", "text", "none"),
    ] {
        let c = cells
            .iter()
            .find(|c| c["what"] == what && c["fill"] == fill && c["compress"] == compress)
            .unwrap_or_else(|| panic!("no {what} cell: {written}"));
        let runs: Vec<f64> = c["runs_gib_s"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: no runs: {c}"))
            .iter()
            .map(|r| r.as_f64().expect("GiB/s"))
            .collect();
        assert_eq!(runs.len(), 2, "{c}");
        let mean = (runs[0] + runs[1]) / 2.0;
        assert!(
            (c["gib_s"].as_f64().expect("gib_s") - mean).abs() < 1e-9,
            "{c}"
        );
    }
    for c in cells {
        assert_eq!(c["verified"], true, "{c}");
    }
    assert!(out_dir.join("link.svg").exists());
    let _ = std::fs::remove_dir_all(&out_dir);
}
