//! A drain planned, as `ferry plan` shows it: the fleet read or drawn, the
//! schedule of one policy run through the simulator on ferry's model
//! (`ferry_fleet`), the table or JSON of it, every other policy beside it
//! on request, and the planner's plan as objects a platform applies
//! ([`export`]). The planning itself is `ferry_fleet`'s; this is what the
//! CLI makes of it, apart from the subcommand's parsing of its flags.

mod export;

use crate::error::CmdError;
use ferry_fleet::{generate, lower_bound, policy_named, run, DrainOutcome, Fleet};
use ferry_report::Table;
use std::path::Path;
use std::process::ExitCode;

pub use export::Export;

/// One `ferry plan`: which schedule to show, and how.
pub struct Plan<'a> {
    /// The fleet, read or drawn ([`load`]).
    pub fleet: Fleet,
    /// Whose schedule to show.
    pub policy: &'a str,
    /// Also run every other policy and show each makespan.
    pub compare: bool,
    /// Write the fleet as JSON here.
    pub write_fleet: Option<&'a Path>,
    /// One JSON object as the last line of stdout, instead of the tables.
    pub json: bool,
    /// The plan as KubeVirt objects, instead of (or beside) the table.
    pub export: Option<Export<'a>>,
}

/// The fleet from `path` (JSON), or a fat-tree of `generate` hosts drawn
/// with `seed`.
pub fn load(path: Option<&Path>, generate: Option<u64>, seed: u64) -> Result<Fleet, CmdError> {
    match (path, generate) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CmdError::Usage(format!("cannot read {}: {e}", path.display())))?;
            serde_json::from_str(&text)
                .map_err(|e| CmdError::Usage(format!("{}: not a fleet: {e}", path.display())))
        }
        (None, Some(hosts)) => Ok(generate::fat_tree(hosts as usize, seed)),
        (None, None) => Err(CmdError::Usage(
            "give a fleet file, or --generate HOSTS to draw one (see --help)".into(),
        )),
    }
}

/// Runs the plan `p`: prints its schedule (and the comparison), or writes
/// its export.
pub fn run_plan(p: Plan) -> Result<ExitCode, CmdError> {
    let fleet = p.fleet;
    fleet
        .validate()
        .map_err(|e| CmdError::Usage(e.to_string()))?;
    if let Some(path) = p.write_fleet {
        let text =
            serde_json::to_string_pretty(&fleet).map_err(|e| CmdError::Failed(e.to_string()))?;
        std::fs::write(path, text)
            .map_err(|e| CmdError::Failed(format!("cannot write {}: {e}", path.display())))?;
        eprintln!("ferry plan: wrote the fleet to {}", path.display());
    }
    // The simulator's own draws (each round's time about its nominal one)
    // do not depend on where the fleet came from: a fleet saved and read
    // back plans the same.
    let seed = 1;
    let simulate = |name: &str| -> Result<DrainOutcome, CmdError> {
        let mut p = policy_named(name)
            .ok_or_else(|| CmdError::Usage(format!("no policy called {name}")))?;
        run(&fleet, p.as_mut(), seed)
            .map_err(|e| CmdError::Failed(format!("the plan cannot be met: {e}")))
    };
    let o = simulate(p.policy)?;
    if let Some(to) = &p.export {
        export::kubevirt(to, &fleet, &o)?;
        if to.out.is_none() {
            return Ok(ExitCode::SUCCESS);
        }
    }
    let bound = lower_bound(&fleet);
    let mut t = Table::new(
        format!(
            "{}'s drain of {} host(s): {} VM(s)",
            o.policy,
            fleet.drain.len(),
            o.migrations
        ),
        &[
            "VM",
            "from",
            "to",
            "start (s)",
            "end (s)",
            "policy",
            "mean Gbit/s",
            "downtime (ms)",
        ],
    );
    let mut vms = o.vms.clone();
    vms.sort_by(|x, y| x.start_s.total_cmp(&y.start_s));
    for v in &vms {
        t.row(vec![
            v.vm.clone(),
            v.from.clone(),
            v.to.clone(),
            format!("{:.1}", v.start_s),
            format!("{:.1}", v.end_s),
            v.policy.to_string(),
            format!("{:.2}", v.mean_rate * 8.0 / 1e9),
            format!(
                "{:.0}{}",
                v.downtime_ms,
                if v.downtime_ms > v.downtime_target_ms {
                    " (over target)"
                } else {
                    ""
                }
            ),
        ]);
    }
    t.note(format!(
        "makespan {:.0} s; no schedule can end before {:.0} s (the busiest link carrying every byte once); {} over their downtime target; decided in {:.2} s",
        o.makespan_s, bound, o.over_target, o.solve_s
    ));
    if !p.json {
        print!("{}", t.render());
    }
    let mut others = serde_json::Map::new();
    if p.compare {
        let mut c = Table::new(
            "every policy on this fleet",
            &["policy", "makespan (s)", "over target", "peak at once"],
        );
        for name in ["planner", "kubevirt", "hco", "nova", "vsphere"] {
            let r = if name == p.policy {
                o.clone()
            } else {
                simulate(name)?
            };
            c.row(vec![
                name.into(),
                format!("{:.0}", r.makespan_s),
                r.over_target.to_string(),
                r.peak_concurrency.to_string(),
            ]);
            others.insert(
                name.into(),
                serde_json::json!({"makespan_s": r.makespan_s, "over_target": r.over_target}),
            );
        }
        if !p.json {
            print!("{}", c.render());
        }
    }
    if p.json {
        let line = serde_json::json!({
            "policy": o.policy,
            "makespan_s": o.makespan_s,
            "lower_bound_s": bound,
            "over_target": o.over_target,
            "failed": o.failed,
            "solve_s": o.solve_s,
            "vms": o.vms,
            "compare": others,
        });
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
