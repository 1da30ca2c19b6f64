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
//!   exact      small drains (one host of 6 VMs to two others) on which every
//!              list schedule is tried (ferry_fleet::exact): the planner's
//!              makespan against the best
//! ```
//!
//! Named for what it runs: `fleet` is the `ferry_fleet` crate, and the
//! real drain on this machine is `drain/`.

use crate::error::CmdError;
use clap::Args;
use ferry_fleet::exact::best_list_schedule;
use ferry_fleet::{generate, lower_bound, policies, run, DrainOutcome, Planner};
use ferry_report::{Plot, Report, Series, Table};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `ferry bench fleet`.
#[derive(Args, Debug)]
pub struct FleetArgs {
    /// Fleet sizes, in hosts.
    #[arg(long, value_delimiter = ',', default_value = "128,256,512,1024")]
    pub hosts: Vec<usize>,
    /// Seeds of the fleets drawn at each size.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5")]
    pub seeds: Vec<u64>,
    /// VMs in each small drain solved by trying every schedule (0: none).
    #[arg(long = "exact-vms", default_value_t = 6,
          value_parser = clap::value_parser!(u64).range(0..=ferry_fleet::exact::MAX_VMS as u64))]
    pub exact_vms: u64,
    /// Seeds of the small drains.
    #[arg(
        long = "exact-seeds",
        value_delimiter = ',',
        default_value = "1,2,3,4,5"
    )]
    pub exact_seeds: Vec<u64>,
    /// Print one JSON object with `cells` (and `exact`) as the last line of
    /// stdout.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html, the page that
    /// holds them all.
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

/// A small drain: the planner against the best of every list schedule.
#[derive(Clone, Debug, Serialize)]
pub struct ExactCell {
    /// VMs moved.
    pub vms: usize,
    /// The fleet's seed.
    pub seed: u64,
    /// The planner's makespan, seconds.
    pub planner_s: f64,
    /// The best schedule's.
    pub best_s: f64,
    /// Schedules tried.
    pub tried: usize,
    /// The network's lower bound, seconds.
    pub lower_bound_s: f64,
    /// Wall time of the search.
    pub search_s: f64,
}

/// Everything measured.
#[derive(Debug, Serialize)]
pub struct FleetResults {
    /// One per fleet size and seed.
    pub cells: Vec<Cell>,
    /// The small drains solved by trying every schedule.
    pub exact: Vec<ExactCell>,
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
    let mut exact = Vec::new();
    for &seed in a.exact_seeds.iter().filter(|_| a.exact_vms > 0) {
        let fleet = generate::small(a.exact_vms as usize, seed);
        eprintln!(
            "ferry bench fleet: small drain of {} VMs, seed {seed}: trying every schedule ...",
            a.exact_vms
        );
        let fail =
            |e: ferry_fleet::FleetError| CmdError::Failed(format!("small drain, seed {seed}: {e}"));
        let t = std::time::Instant::now();
        let best = best_list_schedule(&fleet).map_err(fail)?;
        let search_s = t.elapsed().as_secs_f64();
        let planner = run(&fleet, &mut Planner::new(), 1).map_err(fail)?;
        exact.push(ExactCell {
            vms: a.exact_vms as usize,
            seed,
            planner_s: planner.makespan_s,
            best_s: best.makespan_s,
            tried: best.tried,
            lower_bound_s: lower_bound(&fleet),
            search_s,
        });
    }
    Ok(report(FleetResults { cells, exact }))
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
    let mut t3 = Table::new(
        "Small drains: the planner against the best of every list schedule",
        &[
            "VMs",
            "seed",
            "bound (s)",
            "best (s)",
            "planner (s)",
            "planner / best",
            "schedules tried",
            "search (s)",
        ],
    );
    for e in &results.exact {
        t3.row(vec![
            e.vms.to_string(),
            e.seed.to_string(),
            format!("{:.2}", e.lower_bound_s),
            format!("{:.2}", e.best_s),
            format!("{:.2}", e.planner_s),
            format!("{:.3}", e.planner_s / e.best_s),
            e.tried.to_string(),
            format!("{:.1}", e.search_s),
        ]);
    }
    t3.note("One host of VMs (1-8 GiB, 1-400 MiB/s) drained to two others over a flat 10 Gbit/s switch. A list schedule: each VM's destination, the order the VMs start in, and 1 or 2 migrations a link; each starts in order once its way has room. Every one runs through the same simulator as the planner's plan. Schedules outside that family are bounded by the network's lower bound.");
    let mut tables = vec![t, t2];
    if !results.exact.is_empty() {
        tables.push(t3);
    }
    Report {
        name: "fleet".into(),
        tables,
        results,
        charts: vec![Plot {
            title: "Draining a rack: makespan against fleet size (mean over seeds)".into(),
            x_label: "hosts in the fleet".into(),
            y_label: "makespan (s)".into(),
            log_y: true,
            references: Vec::new(),
            series,
        }
        .into()],
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
    serde_json::json!({ "cells": r.cells, "exact": r.exact })
}

/// `ferry bench fleet`: runs it, prints its tables and writes its files
/// ([`super::output`]), and with `--json` ends with its summary line.
pub fn run_and_print(a: &FleetArgs) -> Result<ExitCode, CmdError> {
    let report = run_bench(a)?;
    let code = super::output::emit(&report, &a.out)?;
    if a.json {
        println!("{}", summary_json(&report.results));
    }
    Ok(code)
}
