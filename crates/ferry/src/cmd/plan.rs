//! `ferry plan`: when would this drain end, and how? The planner's schedule
//! for a fleet (each VM's destination, start, policy and bandwidth), run
//! through the simulator on ferry's model, with the platforms' admission
//! beside it on request.
//!
//! ```text
//!   ferry plan FLEET.json                 the planner's plan for a fleet
//!   ferry plan --generate 128 --seed 1    ... for a seeded fat-tree
//!   ferry plan ... --compare              and every baseline's makespan
//!   ferry plan ... --write-fleet F.json   save the fleet (a start to edit)
//!   ferry plan ... --export kubevirt      the plan as KubeVirt objects
//! ```

use crate::error::CmdError;
use clap::Args;
use ferry_fleet::export::{self, KubeVirtOptions, BEFORE_WAVE_LABEL, WAVE_LABEL};
use ferry_fleet::{generate, lower_bound, policy_named, run, DrainOutcome, Fleet};
use ferry_report::Table;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `ferry plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The fleet, as JSON: hosts (name, rack, cpus, memory_bytes,
    /// nic_bytes_per_sec, cpu_model), network ({"kind": "flat"} or
    /// {"kind": "fat-tree", "oversubscription": 3}), vms (name, host,
    /// memory_bytes, data_bytes, dirty_bytes_per_sec and working_set_bytes
    /// per vCPU, downtime_target_ms, and optionally anti_affinity, pinned,
    /// forbidden) and drain (host indices). `--write-fleet` shows one.
    #[arg(conflicts_with = "generate")]
    pub fleet: Option<PathBuf>,
    /// Draw a fat-tree fleet of this many hosts instead (racks of 20-40,
    /// 25 Gbit/s NICs, 3:1 uplinks, rack 0 drained; see `ferry bench fleet`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(64..=100_000))]
    pub generate: Option<u64>,
    /// The generated fleet's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Whose schedule to show.
    #[arg(long, default_value = "planner", value_parser = ["planner", "kubevirt", "hco", "nova", "vsphere"])]
    pub policy: String,
    /// Also run every other policy on the same fleet and show each makespan.
    #[arg(long)]
    pub compare: bool,
    /// Write the fleet as JSON to this file.
    #[arg(long = "write-fleet")]
    pub write_fleet: Option<PathBuf>,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Write the planner's plan as objects for a platform to apply instead
    /// of the table. `kubevirt`: a JSON List of MigrationPolicies (wave 0:
    /// bandwidth cap and auto-converge) and one VirtualMachineInstanceMigration
    /// per VM, pinned to its planned node, in waves (label ferry.dev/wave);
    /// create wave N once the migrations labelled ferry.dev/before-wave=N
    /// have Succeeded (docs/fleet.md). Only the planner's plan (the default
    /// --policy), and only if every VM converges within its downtime target.
    #[arg(long, value_name = "PLATFORM", value_parser = ["kubevirt"])]
    pub export: Option<String>,
    /// Write the export to this file, and print the table as usual
    /// (default: the export on stdout, alone).
    #[arg(long, value_name = "FILE", requires = "export")]
    pub out: Option<PathBuf>,
    /// The VMIs' namespace, where their migrations are created (default:
    /// kubectl's current one).
    #[arg(long, requires = "export")]
    pub namespace: Option<String>,
}

fn load(a: &PlanArgs) -> Result<Fleet, CmdError> {
    match (&a.fleet, a.generate) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CmdError::Usage(format!("cannot read {}: {e}", path.display())))?;
            serde_json::from_str(&text)
                .map_err(|e| CmdError::Usage(format!("{}: not a fleet: {e}", path.display())))
        }
        (None, Some(hosts)) => Ok(generate::fat_tree(hosts as usize, a.seed)),
        (None, None) => Err(CmdError::Usage(
            "give a fleet file, or --generate HOSTS to draw one (see --help)".into(),
        )),
    }
}

/// Runs `ferry plan`.
pub fn run_plan(a: PlanArgs) -> Result<ExitCode, CmdError> {
    if a.export.is_some() {
        if a.policy != "planner" {
            return Err(CmdError::Usage(format!(
                "--export writes the planner's plan, not {}'s: drop --policy",
                a.policy
            )));
        }
        if a.out.is_none() && (a.json || a.compare) {
            return Err(CmdError::Usage(
                "--json and --compare print on stdout, which carries the export: give --out FILE"
                    .into(),
            ));
        }
    }
    let fleet = load(&a)?;
    fleet
        .validate()
        .map_err(|e| CmdError::Usage(e.to_string()))?;
    if let Some(path) = &a.write_fleet {
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
    let o = simulate(&a.policy)?;
    if a.export.is_some() {
        export_kubevirt(&a, &fleet, &o)?;
        if a.out.is_none() {
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
    if !a.json {
        print!("{}", t.render());
    }
    let mut others = serde_json::Map::new();
    if a.compare {
        let mut c = Table::new(
            "every policy on this fleet",
            &["policy", "makespan (s)", "over target", "peak at once"],
        );
        for name in ["planner", "kubevirt", "hco", "nova", "vsphere"] {
            let r = if name == a.policy {
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
        if !a.json {
            print!("{}", c.render());
        }
    }
    if a.json {
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

/// Writes the plan `o` of `fleet` as KubeVirt objects to `--out` or stdout,
/// and what to do with them to stderr. Nothing is written unless the whole
/// plan can be exported.
fn export_kubevirt(a: &PlanArgs, fleet: &Fleet, o: &DrainOutcome) -> Result<(), CmdError> {
    let opts = KubeVirtOptions {
        namespace: a.namespace.clone(),
    };
    let export = export::kubevirt(fleet, o, &opts).map_err(|e| CmdError::Failed(e.to_string()))?;
    let text = serde_json::to_string_pretty(&export.to_list())
        .map_err(|e| CmdError::Failed(e.to_string()))?;
    let file = match &a.out {
        Some(path) => {
            std::fs::write(path, text + "\n")
                .map_err(|e| CmdError::Failed(format!("cannot write {}: {e}", path.display())))?;
            path.display().to_string()
        }
        None => {
            println!("{text}");
            "FILE".into()
        }
    };
    let waves = export.waves.len();
    let some = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    eprintln!(
        "ferry plan: {} in {}, {}; to apply (docs/fleet.md):",
        some(o.vms.len(), "migration", "migrations"),
        some(waves, "wave", "waves"),
        some(
            export.policies.len(),
            "MigrationPolicy",
            "MigrationPolicies"
        ),
    );
    eprintln!("  kubectl create -f {file} -l {WAVE_LABEL}=0");
    for line in export.label_commands() {
        eprintln!("  {line}");
    }
    if waves > 0 {
        eprintln!("  kubectl create -f {file} -l {WAVE_LABEL}=1");
    }
    if waves > 1 {
        eprintln!(
            "  then for N in 2..{waves}: once the migrations labelled {BEFORE_WAVE_LABEL}=N have \
             Succeeded, kubectl create -f {file} -l {WAVE_LABEL}=N"
        );
    }
    if o.peak_concurrency > 5 {
        eprintln!(
            "ferry plan: the plan runs up to {} migrations at once; KubeVirt runs 5 in a \
             cluster and 2 out of a node unless its migrations config raises \
             parallelMigrationsPerCluster and parallelOutboundMigrationsPerNode (or give the \
             fleet those caps and plan again)",
            o.peak_concurrency
        );
    }
    Ok(())
}
