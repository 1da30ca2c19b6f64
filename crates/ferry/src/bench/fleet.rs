//! `ferry bench fleet`: draining a rack of a simulated fat-tree, by the
//! planner and by the platforms' own admission rules, on the same fleets.
//!
//! ```text
//!   fleets     seeded (ferry_fleet::generate): 128 to 1,024 hosts in racks of
//!              20–40, 10–40 VMs a host, rack 0 drained
//!   policies   planner; kubevirt (5 a cluster, 2 out of a node), hco (5, 1),
//!              nova (1 out of a host), vsphere (8 a host either way); every
//!              migration under ferry's default convergence unless the
//!              planner picks another
//!   judge      one simulator: every migration follows ferry's model under the
//!              bandwidth it gets as flows share NICs and ToR links
//!   bound      no schedule beats the busiest link: the drained rack's
//!              uplink (or a host's NIC) carrying every byte that must cross it
//! ```

use crate::cmd::CmdError;
use clap::Args;
use ferry_fleet::{generate, lower_bound, policies, run, DrainOutcome};
use ferry_report::{Plot, Report, Series, Table};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Arguments of `ferry bench fleet`.
#[derive(Args, Debug)]
pub struct FleetArgs {
    /// Fleet sizes, in hosts.
    #[arg(long, value_delimiter = ',', default_value = "128,256,512,1024")]
    pub hosts: Vec<usize>,
    /// Seeds of the fleets drawn at each size.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5")]
    pub seeds: Vec<u64>,
    /// Print one JSON object with `cells` as the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON and SVG outputs.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// One policy's drain of one fleet.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyResult {
    /// When the last VM had moved, seconds.
    pub makespan_s: f64,
    /// VMs whose downtime passed their target.
    pub over_target: usize,
    /// Migrations that did not converge.
    pub failed: usize,
    /// Time the policy spent deciding, seconds.
    pub solve_s: f64,
    /// Most migrations at once.
    pub peak_concurrency: usize,
}

/// One fleet and every policy's drain of it.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// Hosts in the fleet.
    pub hosts: usize,
    /// Hosts drained (rack 0).
    pub drained_hosts: usize,
    /// VMs moved.
    pub vms: usize,
    /// Their memory, bytes.
    pub bytes: u64,
    /// The fleet's seed.
    pub seed: u64,
    /// No schedule ends sooner: the busiest link's bytes over its rate.
    pub lower_bound_s: f64,
    /// By policy name.
    pub policies: BTreeMap<String, PolicyResult>,
}

/// Everything measured.
#[derive(Debug, Serialize)]
pub struct FleetResults {
    /// One per fleet size and seed.
    pub cells: Vec<Cell>,
}

/// Runs the bench.
pub fn run_bench(a: &FleetArgs) -> Result<Report<FleetResults>, CmdError> {
    if a.hosts.iter().any(|&h| h < 64) {
        return Err(CmdError::Usage(
            "--hosts: each fleet needs at least 64 hosts (a drained rack holds up to 40)".into(),
        ));
    }
    let mut cells = Vec::new();
    for &hosts in &a.hosts {
        for &seed in &a.seeds {
            let fleet = generate::fat_tree(hosts, seed);
            let moving = fleet.to_move();
            eprintln!(
                "ferry bench fleet: {hosts} hosts, seed {seed}: draining {} hosts, {} VMs ...",
                fleet.drain.len(),
                moving.len()
            );
            let mut results = BTreeMap::new();
            for mut p in policies() {
                let o: DrainOutcome = run(&fleet, p.as_mut(), seed)
                    .map_err(|e| CmdError::Failed(format!("{hosts} hosts, seed {seed}: {e}")))?;
                results.insert(
                    o.policy.clone(),
                    PolicyResult {
                        makespan_s: o.makespan_s,
                        over_target: o.over_target,
                        failed: o.failed,
                        solve_s: o.solve_s,
                        peak_concurrency: o.peak_concurrency,
                    },
                );
            }
            cells.push(Cell {
                hosts,
                drained_hosts: fleet.drain.len(),
                vms: moving.len(),
                bytes: moving.iter().map(|&v| fleet.vms[v].memory_bytes).sum(),
                seed,
                lower_bound_s: lower_bound(&fleet),
                policies: results,
            });
        }
    }
    Ok(report(FleetResults { cells }))
}

const BASELINES: [&str; 4] = ["kubevirt", "hco", "nova", "vsphere"];

/// The baseline with the shortest makespan in `c`.
fn best_baseline(c: &Cell) -> (&'static str, f64) {
    BASELINES
        .iter()
        .filter_map(|&b| c.policies.get(b).map(|r| (b, r.makespan_s)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .unwrap_or(("none", f64::NAN))
}

fn report(results: FleetResults) -> Report<FleetResults> {
    let mut cols = vec![
        "hosts",
        "drained",
        "VMs",
        "TiB",
        "seed",
        "bound (s)",
        "planner (s)",
    ];
    cols.extend(BASELINES.iter().map(|b| match *b {
        "kubevirt" => "kubevirt (s)",
        "hco" => "hco (s)",
        "nova" => "nova (s)",
        _ => "vsphere (s)",
    }));
    cols.extend(["planner vs best baseline", "planner over bound"]);
    let mut t = Table::new("Draining a rack: makespan by policy (simulated)", &cols);
    let mut t2 = Table::new(
        "Downtime targets and the planner's solve time",
        &[
            "hosts",
            "seed",
            "over target: planner / kubevirt / hco / nova / vsphere",
            "failed (all)",
            "planner solve (s)",
            "solve / makespan",
            "peak at once: planner / nova / vsphere",
        ],
    );
    for c in &results.cells {
        let get = |p: &str| c.policies.get(p).cloned();
        let ms = |p: &str| get(p).map_or_else(|| "-".into(), |r| format!("{:.0}", r.makespan_s));
        let planner = get("planner");
        let (best, best_s) = best_baseline(c);
        let mut row = vec![
            c.hosts.to_string(),
            c.drained_hosts.to_string(),
            c.vms.to_string(),
            format!("{:.1}", c.bytes as f64 / (1u64 << 40) as f64),
            c.seed.to_string(),
            format!("{:.0}", c.lower_bound_s),
            ms("planner"),
        ];
        row.extend(BASELINES.iter().map(|b| ms(b)));
        row.push(planner.as_ref().map_or_else(
            || "-".into(),
            |p| {
                format!(
                    "{:.0}% shorter than {best}",
                    100.0 * (1.0 - p.makespan_s / best_s)
                )
            },
        ));
        row.push(planner.as_ref().map_or_else(
            || "-".into(),
            |p| format!("{:.2}x", p.makespan_s / c.lower_bound_s),
        ));
        t.row(row);
        let over: Vec<String> = ["planner", "kubevirt", "hco", "nova", "vsphere"]
            .iter()
            .map(|p| get(p).map_or_else(|| "-".into(), |r| r.over_target.to_string()))
            .collect();
        let failed: usize = c.policies.values().map(|r| r.failed).sum();
        let peaks: Vec<String> = ["planner", "nova", "vsphere"]
            .iter()
            .map(|p| get(p).map_or_else(|| "-".into(), |r| r.peak_concurrency.to_string()))
            .collect();
        t2.row(vec![
            c.hosts.to_string(),
            c.seed.to_string(),
            over.join(" / "),
            failed.to_string(),
            planner
                .as_ref()
                .map_or_else(|| "-".into(), |p| format!("{:.2}", p.solve_s)),
            planner.as_ref().map_or_else(
                || "-".into(),
                |p| format!("{:.2}%", 100.0 * p.solve_s / p.makespan_s),
            ),
            peaks.join(" / "),
        ]);
    }
    t.note("Fat-trees of 25 Gbit/s NICs in racks of 20-40 hosts, ToR uplinks 3:1; 10-40 VMs a host, memory uniform over {2..64} GiB, dirty rate log-uniform 1-400 MiB/s, target 300 ms; rack 0 drained. Every policy runs through one simulator in which each migration follows ferry's model (the same as `ferry demo`'s prediction) under the bandwidth it gets. bound: the drained rack's uplink (or the busiest NIC) carrying every byte of the rack's VMs once; no schedule ends sooner.");
    t.note("Baselines: kubevirt 5 migrations a cluster and 2 out of a node; hco 5 and 1; nova 1 out of a host; vsphere 8 a host each way; every migration created at once, its target the host with most free memory, under ferry's default convergence (the quota), so that what differs is the schedule.");
    t2.note("solve: wall time the policy spent deciding, on this machine, during the whole drain (it decides as migrations end: a rolling horizon).");
    let mut series: Vec<Series> = ["planner", "kubevirt", "hco", "nova", "vsphere"]
        .iter()
        .map(|p| Series {
            label: p.to_string(),
            points: mean_by_size(&results.cells, |c| c.policies.get(*p).map(|r| r.makespan_s)),
        })
        .collect();
    series.push(Series {
        label: "lower bound".into(),
        points: mean_by_size(&results.cells, |c| Some(c.lower_bound_s)),
    });
    Report {
        name: "fleet".into(),
        tables: vec![t, t2],
        results,
        plot: Plot {
            title: "Draining a rack: makespan against fleet size (mean over seeds)".into(),
            x_label: "hosts in the fleet".into(),
            y_label: "makespan (s)".into(),
            log_y: true,
            series,
        },
    }
}

/// The mean of `f` over each fleet size's seeds, in size order.
fn mean_by_size(cells: &[Cell], f: impl Fn(&Cell) -> Option<f64>) -> Vec<(f64, f64)> {
    let mut by: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for c in cells {
        if let Some(v) = f(c) {
            by.entry(c.hosts).or_default().push(v);
        }
    }
    by.into_iter()
        .map(|(h, v)| (h as f64, v.iter().sum::<f64>() / v.len() as f64))
        .collect()
}

/// The `--json` summary: the issue's shape, one object per fleet.
pub fn summary_json(r: &FleetResults) -> serde_json::Value {
    serde_json::json!({ "cells": r.cells })
}
