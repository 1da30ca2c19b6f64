//! One migration over time, from its summary's JSON (`ferry demo --json`
//! prints it; `bench converge` keeps one per run): panels on one time
//! axis, one unit each.
//!
//! ```text
//!   MiB/s       each round's dirty rate against the link's rate
//!   MiB         what is left to send: each round's bytes, sent down to 0
//!   the policy  each throttle change, in its own unit: a time throttle in %,
//!               a dirty limit or a quota per vCPU in MiB/s (a panel per unit
//!               where a migration escalated from one to another)
//!   % of time   in postcopy, the share of time each vCPU waited for pages
//!   bands       the pause (the downtime, with its prediction), and postcopy
//! ```

use ferry_report::{Band, Panel, Series, Shape, Timeline};
use serde_json::Value;

const MIB: f64 = (1u64 << 20) as f64;

/// The timeline of the migration `j` summarizes, titled `title`.
pub fn of(j: &Value, title: String) -> Timeline {
    let rounds = j["round_stats"].as_array().cloned().unwrap_or_default();
    let (mut dirty, mut link, mut left) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0.0;
    for r in &rounds {
        let ms = r["ms"].as_f64().unwrap_or(0.0);
        left.push((at / 1e3, r["raw_bytes"].as_f64().unwrap_or(0.0) / MIB));
        at += ms;
        left.push((at / 1e3, 0.0));
        dirty.push((
            at / 1e3,
            r["dirty_rate_pages_s"].as_f64().unwrap_or(0.0) * 4096.0 / MIB,
        ));
        link.push((
            at / 1e3,
            r["bandwidth_mb_s"].as_f64().unwrap_or(0.0) * 1e6 / MIB,
        ));
    }
    let series = |label: &str, points| Series {
        label: label.into(),
        points,
    };
    let mut panels = vec![
        Panel {
            y_label: "MiB/s".into(),
            shape: Shape::StepBefore,
            series: vec![
                series("dirty rate, each round", dirty),
                series("link rate, each round", link),
            ],
        },
        Panel {
            y_label: "MiB left to send".into(),
            shape: Shape::Line,
            series: vec![series("each round's bytes, sent down to 0", left)],
        },
    ];
    panels.extend(throttle_panels(j));
    panels.extend(blocked_panel(j));
    Timeline {
        title,
        x_label: "s since the migration started".into(),
        panels,
        bands: bands(j),
    }
}

/// Each throttle change, a panel per unit.
fn throttle_panels(j: &Value) -> Vec<Panel> {
    let steps = j["throttle_timeline"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut panels: Vec<Panel> = Vec::new();
    let mut add = |unit: &str, label: String, point: (f64, f64)| {
        let panel = match panels.iter_mut().position(|p| p.y_label == unit) {
            Some(i) => &mut panels[i],
            None => {
                panels.push(Panel {
                    y_label: unit.into(),
                    shape: Shape::StepAfter,
                    series: Vec::new(),
                });
                panels.last_mut().expect("just pushed")
            }
        };
        match panel.series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push(point),
            None => panel.series.push(Series {
                label,
                points: vec![point],
            }),
        }
    };
    let mut unit = "time throttle, % asleep";
    for t in &steps {
        let s = t["at_ms"].as_f64().unwrap_or(0.0) / 1e3;
        if let Some(limit) = t["limit_bytes_per_sec"].as_f64() {
            unit = "dirty limit per vCPU, MiB/s";
            add(unit, "every vCPU's limit".into(), (s, limit / MIB));
        } else if let Some(q) = t["quota_bytes"].as_f64() {
            unit = "quota per vCPU, MiB/s";
            let per_sec = 1e3 / t["quota_interval_ms"].as_f64().unwrap_or(100.0).max(1e-3);
            let each = t["vcpu_quota_bytes"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if each.is_empty() {
                add(unit, "every vCPU's quota".into(), (s, q * per_sec / MIB));
            }
            for (v, b) in each.iter().enumerate() {
                let b = b.as_f64().unwrap_or(q);
                add(unit, format!("vCPU {v}"), (s, b * per_sec / MIB));
            }
        } else if let Some(p) = t["percent"].as_f64().filter(|p| *p > 0.0) {
            unit = "time throttle, % asleep";
            add(unit, "every vCPU".into(), (s, p));
        } else {
            // Released: 0 in the unit in force.
            add(unit, "released".into(), (s, 0.0));
        }
    }
    panels
}

/// Where postcopy ran and a thread waited for pages: the share of time
/// each vCPU (or other thread) waited, from the guest's resume on.
fn blocked_panel(j: &Value) -> Option<Panel> {
    let p = &j["postcopy"];
    let threads = p["blocked"].as_array().filter(|b| !b.is_empty())?;
    let bin_s = p["blocked_bin_ms"].as_f64().unwrap_or(0.0) / 1e3;
    let resumed = resumed_ms(j) / 1e3;
    let series = threads
        .iter()
        .map(|t| Series {
            label: crate::summary::blocked_label(
                t["vcpu"].as_u64(),
                t["thread"].as_u64().unwrap_or(0),
                t["name"].as_str().unwrap_or(""),
            ),
            points: t["blocked_pct"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .enumerate()
                .map(|(i, pct)| (resumed + i as f64 * bin_s, pct.as_f64().unwrap_or(0.0)))
                .collect(),
        })
        .collect();
    Some(Panel {
        y_label: "blocked on pages, % of time".into(),
        shape: Shape::StepAfter,
        series,
    })
}

/// When the guest resumed on the destination, in ms since the start.
fn resumed_ms(j: &Value) -> f64 {
    j["total_ms"].as_f64().unwrap_or(0.0) - j["postcopy"]["postcopy_ms"].as_f64().unwrap_or(0.0)
}

/// The pause, and postcopy where it ran.
fn bands(j: &Value) -> Vec<Band> {
    let total = j["total_ms"].as_f64().unwrap_or(0.0);
    let downtime = j["downtime_ms"].as_f64().unwrap_or(0.0);
    let predicted = j["predicted_downtime_ms"].as_f64().unwrap_or(0.0);
    let postcopy_ms = j["postcopy"]["postcopy_ms"].as_f64().unwrap_or(0.0);
    let resumed = resumed_ms(j);
    let mut bands = vec![Band {
        label: if predicted > 0.0 {
            format!("pause {downtime:.0} ms (predicted {predicted:.0} ms)")
        } else {
            format!("pause {downtime:.0} ms")
        },
        from: (resumed - downtime).max(0.0) / 1e3,
        to: resumed / 1e3,
    }];
    if postcopy_ms > 0.0 {
        let blocked = j["postcopy"]["block_ms"].as_f64().unwrap_or(0.0);
        bands.push(Band {
            label: format!("postcopy {postcopy_ms:.0} ms, vCPUs blocked on pages {blocked:.0} ms"),
            from: resumed / 1e3,
            to: total / 1e3,
        });
    }
    bands
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_panel_per_unit_and_a_band_for_the_pause() {
        let j = serde_json::json!({
            "total_ms": 3000.0, "downtime_ms": 12.0, "predicted_downtime_ms": 10.0,
            "round_stats": [
                {"ms": 2000.0, "raw_bytes": 1048576000.0, "dirty_rate_pages_s": 1000.0, "bandwidth_mb_s": 500.0},
                {"ms": 988.0, "raw_bytes": 10485760.0, "dirty_rate_pages_s": 0.0, "bandwidth_mb_s": 500.0}
            ],
            "throttle_timeline": [
                {"at_ms": 100.0, "percent": 20, "limit_bytes_per_sec": null, "quota_bytes": null},
                {"at_ms": 1100.0, "percent": 40, "limit_bytes_per_sec": null, "quota_bytes": null},
                {"at_ms": 2100.0, "percent": 0, "quota_bytes": 1048576.0, "quota_interval_ms": 100.0,
                 "vcpu_quota_bytes": [1048576.0, 2097152.0], "limit_bytes_per_sec": null}
            ]
        });
        let t = of(&j, "t".into());
        let units: Vec<&str> = t.panels.iter().map(|p| p.y_label.as_str()).collect();
        assert_eq!(
            units,
            [
                "MiB/s",
                "MiB left to send",
                "time throttle, % asleep",
                "quota per vCPU, MiB/s"
            ]
        );
        assert_eq!(t.panels[3].series.len(), 2, "a series per vCPU");
        assert!((t.panels[3].series[1].points[0].1 - 20.0).abs() < 1e-9);
        assert_eq!(t.bands.len(), 1);
        assert!((t.bands[0].to - 3.0).abs() < 1e-9 && (t.bands[0].from - 2.988).abs() < 1e-9);
        assert!(t.bands[0].label.contains("predicted 10 ms"));
    }

    #[test]
    fn postcopy_draws_each_vcpus_blocked_time_from_the_resume() {
        let j = serde_json::json!({
            "total_ms": 1500.0, "downtime_ms": 5.0,
            "round_stats": [{"ms": 1000.0, "raw_bytes": 1.0, "dirty_rate_pages_s": 0.0, "bandwidth_mb_s": 1.0}],
            "postcopy": {"postcopy_ms": 500.0, "block_ms": 30.0, "blocked_bin_ms": 100.0, "blocked": [
                {"vcpu": 0, "thread": 11, "blocked_ms": 20.0, "waits": 3, "blocked_pct": [10.0, 5.0, 0.0]},
                {"vcpu": null, "thread": 12, "blocked_ms": 10.0, "waits": 1, "blocked_pct": [10.0]}
            ]}
        });
        let t = of(&j, "t".into());
        let p = t.panels.last().expect("panels");
        assert_eq!(p.y_label, "blocked on pages, % of time");
        let labels: Vec<&str> = p.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["vCPU 0", "thread 12 (not a vCPU)"]);
        assert_eq!(p.series[0].points, [(1.0, 10.0), (1.1, 5.0), (1.2, 0.0)]);
        assert_eq!(t.bands.len(), 2, "the pause and postcopy");
    }
}
