//! What a real drain reports: each policy's median run measured against
//! the simulator's prediction, as one JSON object and as tables. Kept
//! apart from the runs ([`super::policies`]) so that the numbers a script
//! reads and the tables a person reads come from one place.

use super::exec::Measured;
use ferry_fleet::{lower_bound, DrainOutcome};
use ferry_report::Table;
use serde_json::{json, Value};

/// A policy's median run (the lower of the two middle ones).
fn median(runs: &[Measured]) -> &Measured {
    let mut by: Vec<&Measured> = runs.iter().collect();
    by.sort_by(|x, y| x.makespan_s.total_cmp(&y.makespan_s));
    by[(by.len() - 1) / 2]
}

/// The JSON report: each policy measured and predicted (`fleet` as built,
/// whatever the plan assumed). Counts are over every run; the makespan,
/// the VMs and the peak are the median run's.
pub fn report(
    fleet: &ferry_fleet::Fleet,
    measured: &[Vec<Measured>],
    predicted: &[DrainOutcome],
) -> Value {
    let mut policies = serde_json::Map::new();
    for (runs, p) in measured.iter().zip(predicted) {
        let m = median(runs);
        let all = || runs.iter().flat_map(|r| &r.vms);
        let moved = || all().filter(|v| v.completed());
        policies.insert(
            m.policy.clone(),
            json!({
                "makespan_s": m.makespan_s,
                "predicted_makespan_s": p.makespan_s,
                "predicted_over_measured": p.makespan_s / m.makespan_s.max(1e-9),
                "runs": runs.len(),
                "makespans_s": runs.iter().map(|r| r.makespan_s).collect::<Vec<_>>(),
                "migrations": all().count(),
                "failed": all().count() - moved().count(),
                "digest_mismatches": moved().filter(|v| !v.digest_match).count(),
                "guest_mismatches": moved().filter_map(|v| v.guest_mismatches).sum::<u64>(),
                "over_target": moved().filter(|v| v.downtime_ms > v.downtime_target_ms).count(),
                "peak_concurrency": m.peak_concurrency,
                "bytes_sent": m.vms.iter().map(|v| v.bytes_sent).sum::<u64>(),
                "vms": m.vms,
                "predicted_vms": p.vms,
                "replans": runs.iter().flat_map(|r| &r.replans).collect::<Vec<_>>(),
            }),
        );
    }
    let span = |name: &str| {
        measured
            .iter()
            .find(|runs| runs.first().is_some_and(|m| m.policy == name))
            .map(|runs| median(runs).makespan_s)
    };
    let shorter = match (span("planner"), span("kubevirt")) {
        (Some(p), Some(k)) => json!(1.0 - p / k),
        _ => Value::Null,
    };
    json!({
        "policies": policies,
        "lower_bound_s": lower_bound(fleet),
        "planner_shorter_than_kubevirt": shorter,
        "fleet": fleet,
    })
}

/// The report as tables: each policy's median run.
pub fn render(report: &Value, runs: &[Vec<Measured>]) -> String {
    let medians: Vec<&Measured> = runs.iter().map(|r| median(r)).collect();
    let mut t = Table::new(
        "ferry drain: each policy on the same fleet, measured and predicted",
        &[
            "policy",
            "makespan (s)",
            "runs (s)",
            "predicted (s)",
            "pred/meas",
            "moved",
            "failed",
            "digest mismatches",
            "over target",
            "at once",
        ],
    );
    for (m, all) in medians.iter().zip(runs) {
        let p = &report["policies"][&m.policy];
        let each: Vec<String> = all.iter().map(|r| format!("{:.1}", r.makespan_s)).collect();
        t.row(vec![
            m.policy.clone(),
            format!("{:.1}", m.makespan_s),
            each.join(", "),
            format!("{:.1}", p["predicted_makespan_s"].as_f64().unwrap_or(0.0)),
            format!(
                "{:.2}",
                p["predicted_over_measured"].as_f64().unwrap_or(0.0)
            ),
            (p["migrations"].as_u64().unwrap_or(0) - p["failed"].as_u64().unwrap_or(0)).to_string(),
            p["failed"].to_string(),
            p["digest_mismatches"].to_string(),
            p["over_target"].to_string(),
            m.peak_concurrency.to_string(),
        ]);
    }
    for m in runs.iter().flatten() {
        for r in &m.replans {
            t.note(format!(
                "{} re-planned at {:.1} s ({} VMs not started): {}; predicted end {:.1} s before, {:.1} s after",
                m.policy, r.at_s, r.replanned_vms, r.why, r.predicted_end_before_s, r.predicted_end_after_s
            ));
        }
    }
    let versus = match report["planner_shorter_than_kubevirt"].as_f64() {
        Some(x) if x >= 0.0 => format!("; the planner {:.0}% shorter than kubevirt", x * 100.0),
        Some(x) => format!("; the planner {:.0}% longer than kubevirt", -x * 100.0),
        None => String::new(),
    };
    t.note(format!(
        "no schedule can end before {:.1} s (the busiest NIC carrying every byte once){versus}",
        report["lower_bound_s"].as_f64().unwrap_or(0.0),
    ));
    let mut v = Table::new(
        "every migration (each policy's median run)",
        &[
            "policy",
            "VM",
            "to",
            "start (s)",
            "end (s)",
            "converge",
            "status",
            "downtime (ms)",
            "digest",
        ],
    );
    for m in &medians {
        let mut vms = m.vms.clone();
        vms.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        for x in vms {
            v.row(vec![
                m.policy.clone(),
                x.vm.clone(),
                x.to.clone(),
                format!("{:.1}", x.start_s),
                format!("{:.1}", x.end_s),
                x.policy.clone(),
                x.status.clone(),
                format!("{:.0}", x.downtime_ms),
                if !x.completed() {
                    "-".into()
                } else if x.digest_match {
                    "match".into()
                } else {
                    "MISMATCH".into()
                },
            ]);
        }
    }
    format!("{}{}", t.render(), v.render())
}
