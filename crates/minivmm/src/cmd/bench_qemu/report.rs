//! The benchmark's report: a table per measure, ferry beside QEMU with
//! their ratio, JSON for machines and bar charts (ferry-report).

use super::{CellResult, Side};
use ferry_report::{Bar, Bars, Report, Table};

/// One line on how a side did.
pub fn brief(s: &Side) -> String {
    match (s.converged, &s.error) {
        (true, None) => format!(
            "total {:.1} s, downtime {:.0} ms, {}",
            s.total_ms.unwrap_or(f64::NAN) / 1e3,
            s.downtime_ms.unwrap_or(f64::NAN),
            pause_words(s)
        ),
        (_, Some(e)) => format!("failed: {e}"),
        (false, None) => "did not converge".into(),
    }
}

/// Why a side that converged has no guest pause: its lines list each
/// second's longest gaps, and a throttle's stalls just before the move
/// can crowd out the pause's own.
const NOT_LISTED: &str = "the gap that spans the pause is not among those the checker's lines list";

/// The pause the guest saw, in words: measured, bounded, or missing.
fn pause_words(s: &Side) -> String {
    match (s.guest_pause_ms, s.guest_pause_at_most_ms) {
        (Some(p), _) => format!("the guest saw {p:.0} ms"),
        (None, Some(b)) => format!("the guest saw at most {b:.0} ms ({NOT_LISTED})"),
        (None, None) => NOT_LISTED.into(),
    }
}

/// The guest's pause for the table: `≤ N` where only bounded.
fn pause_cell(s: &Side) -> String {
    match (s.guest_pause_ms, s.guest_pause_at_most_ms) {
        (None, Some(b)) => format!("<= {b:.0}"),
        (p, _) => ms(p),
    }
}

/// QEMU's pause over ferry's, `>= x` where ferry's is only bounded.
fn pause_ratio(ferry: &Side, qemu: &Side) -> String {
    match (
        ferry.guest_pause_ms,
        ferry.guest_pause_at_most_ms,
        qemu.guest_pause_ms,
    ) {
        (None, Some(b), Some(q)) if b > 0.0 => format!(">= {:.2}x", q / b),
        _ => ratio(ferry.guest_pause_ms, qemu.guest_pause_ms),
    }
}

/// Milliseconds, rounded, or `-` where there is no value.
pub(super) fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

/// `qemu / ferry` where both have a value.
fn ratio(ferry: Option<f64>, qemu: Option<f64>) -> String {
    match (ferry, qemu) {
        (Some(f), Some(q)) if f > 0.0 => format!("{:.2}x", q / f),
        (Some(_), None) => "QEMU did not converge".into(),
        _ => "-".into(),
    }
}

/// With repeats, each cell's medians over its runs, per side (over the
/// runs that side converged in): one run's pause is a draw from the
/// guest's ordinary stalls on this host ("usual stall after"), so the
/// median over runs is the cell's figure.
fn median_notes(results: &[CellResult]) -> Vec<String> {
    let mut cells: Vec<&str> = Vec::new();
    for r in results {
        if !cells.contains(&r.cell.as_str()) {
            cells.push(&r.cell);
        }
    }
    let mut notes = Vec::new();
    for cell in cells {
        let runs: Vec<&CellResult> = results.iter().filter(|r| r.cell == cell).collect();
        if runs.len() < 2 {
            continue;
        }
        let ferry: Vec<&Side> = runs.iter().map(|r| &r.ferry).collect();
        let qemu: Vec<&Side> = runs.iter().map(|r| &r.qemu).collect();
        let of = |sides: &[&Side], f: fn(&Side) -> Option<f64>| {
            super::median(sides.iter().filter_map(|s| f(s)).collect())
        };
        let (ft, fp) = (of(&ferry, Side::total), of(&ferry, Side::pause));
        let (qt, qp) = (of(&qemu, Side::total), of(&qemu, Side::pause));
        notes.push(format!(
            "{cell}, medians of {} runs: ferry total {} ms, pause {} ms; QEMU total {} ms ({}), pause {} ms ({})",
            runs.len(),
            ms(ft),
            ms(fp),
            ms(qt),
            ratio(ft, qt),
            ms(qp),
            ratio(fp, qp),
        ));
    }
    notes
}

fn bar(s: &Side, v: Option<f64>) -> Bar {
    match (s.converged, v, &s.error) {
        (true, Some(v), _) => Bar::Value(v),
        (_, _, Some(_)) => Bar::NoValue("failed".into()),
        (true, None, None) => Bar::NoValue("not in the checker's lines".into()),
        (false, _, None) => Bar::NoValue("did not converge".into()),
    }
}

/// Prints the table, writes `<out>/qemu.{json,svg,html}`, and with `json`
/// prints `{"cells": [...]}` last.
pub fn write(results: &[CellResult], out: &std::path::Path, json: bool) -> Result<(), String> {
    let mut t = Table::new(
        "ferry (minivmm) and QEMU moving the same Linux guest, inside the SVM host",
        &[
            "cell",
            "run",
            "side",
            "total (ms)",
            "downtime (ms)",
            "guest pause (ms)",
            "gap near the move (ms)",
            "clock lost (ms)",
            "pause, host time (ms)",
            "usual stall after (ms)",
            "longest stall while moving (ms)",
            "guest wrote (MiB/s)",
            "mismatches",
            "QEMU / ferry total",
            "QEMU / ferry pause",
            "QEMU / ferry pause, host time",
        ],
    );
    for r in results {
        for (name, s) in [("ferry", &r.ferry), ("QEMU", &r.qemu)] {
            let first = name == "ferry";
            t.row(vec![
                if first { r.cell.clone() } else { String::new() },
                if first {
                    r.run.to_string()
                } else {
                    String::new()
                },
                name.into(),
                ms(s.total()),
                ms(s.downtime_ms.filter(|_| s.converged)),
                pause_cell(s),
                ms(s.gap_near_move_ms),
                s.guest_clock_lost_ms
                    .map_or("-".into(), |v| format!("{v:.0}")),
                ms(s.guest_pause_host_ms),
                ms(s.usual_stall_ms),
                ms(s.source_stall_ms),
                s.source_write_mib_s
                    .map_or("-".into(), |r| format!("{r:.1}")),
                s.checker_mismatches.map_or("-".into(), |m| m.to_string()),
                if first || r.qemu.error.is_some() {
                    String::new()
                } else {
                    ratio(r.ferry.total(), r.qemu.total())
                },
                if first || r.qemu.error.is_some() {
                    String::new()
                } else {
                    pause_ratio(&r.ferry, &r.qemu)
                },
                if first || r.qemu.error.is_some() {
                    String::new()
                } else {
                    ratio(r.ferry.guest_pause_host_ms, r.qemu.guest_pause_host_ms)
                },
            ]);
        }
    }
    if let Some(r) = results.first() {
        t.note(format!(
            "{} MiB guest, {} vCPUs; link cap {} MiB/s and downtime limit {} ms on both sides; the writing cell dirties {} MiB at {} MiB/s",
            r.guest_mib, r.vcpus, r.bandwidth_mib_s, r.downtime_limit_ms,
            results.iter().find(|r| r.writing).map_or(0, |r| r.hot_mib),
            results.iter().find(|r| r.writing).map_or(0, |r| r.rate_mib_s),
        ));
    }
    t.note("QEMU: -accel kvm, microvm with ACPI, auto-converge, migrate tcp: over loopback; its limit is max(5x ferry's total, 300 s)");
    t.note("guest pause: the gap in the guest's clock that spans the moment the source paused it for the switchover (the longest, over its vCPUs), placed on the guest's clock by the host's time of the checker's lines; gap near the move: the largest gap over the destination's first 3 checker lines, which can be a throttle's stall before the pause; clock lost: how far the guest's clock fell behind the host's across the move (QEMU's kvmclock does not count the time from saving the device state to the destination's start; ferry's counts it all); pause, host time: the two added; usual stall after: the median over the destination's checker lines after the third (one a second) of each line's largest gap, the stall the guest meets every second on this host under that VMM (a pause below it is lost in the guest's ordinary running)");
    for r in results {
        let f = &r.ferry;
        if f.policy.is_some() || f.rounds.is_some() {
            t.note(format!(
                "{} run {}, ferry: policy {}, {} rounds, {}",
                r.cell,
                r.run,
                f.policy.as_deref().unwrap_or("-"),
                f.rounds.map_or("-".into(), |v| v.to_string()),
                match r.ferry_harvest_within_rounds {
                    true => "harvests within rounds",
                    false => "harvests at round ends",
                },
            ));
        }
        let q = &r.qemu;
        if q.link_mib_s.is_some() || q.throttle_pct.is_some() {
            t.note(format!(
                "{} run {}, QEMU: sent {} MiB/s over its run (the cap: {} MiB/s), {} syncs, throttle up to {}%",
                r.cell,
                r.run,
                q.link_mib_s.map_or("-".into(), |v| format!("{v:.1}")),
                r.bandwidth_mib_s,
                q.syncs.map_or("-".into(), |v| v.to_string()),
                q.throttle_pct.map_or("-".into(), |v| v.to_string()),
            ));
        }
    }
    median_notes(results).into_iter().for_each(|n| t.note(n));
    for r in results {
        for (name, s) in [("ferry", &r.ferry), ("QEMU", &r.qemu)] {
            if let Some(e) = &s.error {
                t.note(format!("{} run {}, {name}: {e}", r.cell, r.run));
            }
        }
    }
    let categories: Vec<String> = results
        .iter()
        .map(|r| format!("{} #{}", r.cell, r.run))
        .collect();
    let chart = |title: &str, y: &str, f: fn(&Side) -> Option<f64>| Bars {
        title: title.into(),
        y_label: y.into(),
        categories: categories.clone(),
        groups: vec!["ferry".into(), "QEMU".into()],
        values: results
            .iter()
            .map(|r| vec![bar(&r.ferry, f(&r.ferry)), bar(&r.qemu, f(&r.qemu))])
            .collect(),
        references: Vec::new(),
        reference_label: String::new(),
    };
    let report = Report {
        name: "qemu".into(),
        tables: vec![t],
        results: results.to_vec(),
        charts: vec![
            chart("Total migration time", "seconds", |s| {
                s.total().map(|v| v / 1e3)
            })
            .into(),
            chart("The pause the guest saw", "milliseconds", |s| {
                s.guest_pause_ms
            })
            .into(),
            chart(
                "The pause the guest saw, with what its clock lost",
                "milliseconds",
                |s| s.guest_pause_host_ms,
            )
            .into(),
            chart(
                "The longest stall the guest saw while being moved",
                "milliseconds",
                |s| s.source_stall_ms,
            )
            .into(),
        ],
    };
    eprintln!("{}", report.render());
    let written = report.write(out).map_err(|e| e.to_string())?;
    eprintln!(
        "minivmm bench qemu: wrote {} and {}",
        written.json.display(),
        written.svg.display()
    );
    if json {
        println!("{}", serde_json::json!({ "cells": results }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cell: &str, run: u32, ferry: (f64, f64), qemu: Option<(f64, f64)>) -> CellResult {
        let side = |v: Option<(f64, f64)>| Side {
            converged: v.is_some(),
            total_ms: v.map(|v| v.0),
            guest_pause_ms: v.map(|v| v.1),
            ..Side::default()
        };
        CellResult {
            cell: cell.into(),
            run,
            guest_mib: 512,
            vcpus: 2,
            writing: cell == "writing",
            hot_mib: 128,
            rate_mib_s: 16,
            bandwidth_mib_s: 8,
            downtime_limit_ms: 300,
            ferry_harvest_within_rounds: true,
            ferry: side(Some(ferry)),
            qemu: side(qemu),
        }
    }

    #[test]
    fn repeats_get_each_cells_medians_over_the_runs_each_side_converged_in() {
        let results = [
            run("idle", 1, (15_000.0, 180.0), Some((13_000.0, 130.0))),
            run("writing", 1, (36_000.0, 240.0), None),
            run("idle", 2, (16_000.0, 100.0), Some((14_000.0, 600.0))),
            run("writing", 2, (35_000.0, 200.0), Some((90_000.0, 900.0))),
            run("idle", 3, (15_500.0, 150.0), Some((13_500.0, 580.0))),
        ];
        let notes = median_notes(&results);
        assert_eq!(notes.len(), 2);
        assert_eq!(
            notes[0],
            "idle, medians of 3 runs: ferry total 15500 ms, pause 150 ms; \
             QEMU total 13500 ms (0.87x), pause 580 ms (3.87x)"
        );
        // QEMU's one converged run is its median; ferry's is the upper one.
        assert!(notes[1].starts_with("writing, medians of 2 runs: ferry total 36000 ms"));
        assert!(notes[1].contains("QEMU total 90000 ms (2.50x), pause 900 ms (3.75x)"));
        assert!(median_notes(&results[..2]).is_empty(), "one run each");
    }

    #[test]
    fn a_side_that_converged_with_no_pause_in_its_lines_is_not_called_unconverged() {
        let moved = Side {
            converged: true,
            total_ms: Some(37_000.0),
            downtime_ms: Some(86.0),
            ..Side::default()
        };
        let said = |b: Bar| match b {
            Bar::NoValue(why) => why,
            _ => "a value".into(),
        };
        assert_eq!(said(bar(&moved, None)), "not in the checker's lines");
        assert!(brief(&moved).ends_with(NOT_LISTED), "{}", brief(&moved));
        let stuck = Side::default();
        assert_eq!(said(bar(&stuck, None)), "did not converge");
        let failed = Side {
            error: Some("the SVM host: hung".into()),
            ..moved.clone()
        };
        assert_eq!(said(bar(&failed, None)), "failed");
        assert_eq!(said(bar(&moved, Some(399.0))), "a value");
    }

    #[test]
    fn a_pause_crowded_out_of_its_lines_is_shown_as_its_bound() {
        let bounded = Side {
            converged: true,
            total_ms: Some(37_000.0),
            guest_pause_at_most_ms: Some(192.0),
            ..Side::default()
        };
        let qemu = Side {
            converged: true,
            guest_pause_ms: Some(704.0),
            ..Side::default()
        };
        assert_eq!(pause_cell(&bounded), "<= 192");
        assert_eq!(pause_ratio(&bounded, &qemu), ">= 3.67x");
        assert!(
            brief(&bounded).contains("the guest saw at most 192 ms"),
            "{}",
            brief(&bounded)
        );
        // A measured pause is shown as measured, whatever the bound.
        let measured = Side {
            guest_pause_ms: Some(177.0),
            ..bounded.clone()
        };
        assert_eq!(pause_cell(&measured), "177");
        assert_eq!(pause_ratio(&measured, &qemu), "3.98x");
        assert_eq!(pause_cell(&Side::default()), "-");
    }
}
