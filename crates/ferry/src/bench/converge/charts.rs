//! `bench converge`'s charts, shaped like its tables:
//!
//! ```text
//!   table A   migration time: a bar per policy in each cell, the cells
//!             named on the axis; a policy that did not converge is its own
//!             labelled mark, never a bar at the time limit. The seed's
//!             cells (8-512 GB guests) have no counterpart here: the chart
//!             says so rather than set them side by side.
//!   table B   guest runtime %: a bar per policy in each mix, the seed's
//!             published figures (its "current", auto-converge, and its
//!             dirty quota) as ticks across the matching bars
//! ```

use super::{CellResult, CellSpec, RunResult};
use ferry_report::{Bar, Bars, Reference};

/// The dirty-quota seed's table B: guest runtime % under the throttling
/// of its day (auto-converge) and under the dirty quota, per mix.
const SEED_TABLE_B: [(&str, f64, f64); 3] = [
    ("write-intensive", 26.4, 35.3),
    ("read-write-balanced", 40.6, 70.8),
    ("read-intensive", 63.1, 81.8),
];

/// A table A cell's name on the axis: "256M 1×max →128".
pub fn cell_name(i: usize, c: &CellSpec) -> String {
    format!(
        "{}: {}M {}×{} {}% →{}",
        i + 1,
        c.mem_mib,
        c.vcpus,
        c.rate(),
        c.write_percent,
        c.link_mib_s
    )
}

/// A table B mix's name on the axis.
pub fn mix_name(c: &CellSpec) -> String {
    format!("{} ({}W/{}R)", c.mix, c.vcpus - c.readers, c.readers)
}

/// What a run that has no time shows instead.
fn no_value(r: &RunResult) -> String {
    match r.why_not.as_deref() {
        Some(w) if w.starts_with("not verified") => "NOT VERIFIED".into(),
        Some(w) if w.starts_with("not finished in") => format!("did not converge ({w})"),
        Some(w) => format!("did not converge: {w}"),
        None => "did not converge".into(),
    }
}

/// Table A's chart: migration time per cell and policy.
pub fn table_a(backend: &str, policies: &[String], cells: &[CellResult]) -> Bars {
    let a: Vec<&CellResult> = cells.iter().filter(|c| c.cell.mix.is_empty()).collect();
    Bars {
        title: format!(
            "A. migration time per cell and policy ({backend}); the seed's cells are 8-512 GB guests, with no counterpart here"
        ),
        y_label: "migration time, s".into(),
        categories: a.iter().enumerate().map(|(i, c)| cell_name(i, &c.cell)).collect(),
        groups: policies.to_vec(),
        values: a
            .iter()
            .map(|c| {
                policies
                    .iter()
                    .map(|p| match c.results.iter().find(|r| &r.policy == p) {
                        Some(r) if r.converged => Bar::Value(r.total_ms / 1e3),
                        Some(r) => Bar::NoValue(no_value(r)),
                        None => Bar::NotRun,
                    })
                    .collect()
            })
            .collect(),
        references: Vec::new(),
        reference_label: String::new(),
    }
}

/// Table B's chart: guest runtime % per mix and policy, with the seed's.
pub fn table_b(backend: &str, policies: &[String], cells: &[CellResult]) -> Bars {
    let b: Vec<&CellResult> = cells.iter().filter(|c| !c.cell.mix.is_empty()).collect();
    let mut references = Vec::new();
    for (ci, c) in b.iter().enumerate() {
        let Some(&(_, current, quota)) = SEED_TABLE_B.iter().find(|s| s.0 == c.cell.mix) else {
            continue;
        };
        for (gi, p) in policies.iter().enumerate() {
            let seed = match p.as_str() {
                "auto" => current,
                "quota" => quota,
                _ => continue,
            };
            references.push(Reference {
                category: ci,
                group: gi,
                value: seed,
            });
        }
    }
    Bars {
        title: format!("B. guest runtime during the migration, per mix and policy ({backend})"),
        y_label: "guest runtime, % (mean over vCPUs)".into(),
        categories: b.iter().map(|c| mix_name(&c.cell)).collect(),
        groups: policies.to_vec(),
        values: b
            .iter()
            .map(|c| {
                policies
                    .iter()
                    .map(|p| match c.results.iter().find(|r| &r.policy == p) {
                        // Killed, or no summary: nothing was measured.
                        Some(r)
                            if r.why_not
                                .as_deref()
                                .is_some_and(|w| w.starts_with("ferry demo")) =>
                        {
                            Bar::NoValue(no_value(r))
                        }
                        // The guest's runtime was measured, converged or not.
                        Some(r) => Bar::Value(r.runtime_pct),
                        None => Bar::NotRun,
                    })
                    .collect()
            })
            .collect(),
        references,
        reference_label: "the seed's figure (auto: its \"current\"; quota: its dirty quota)".into(),
    }
}
