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
//!
//! This checks the flags against each other; [`crate::plan`] does the rest.

use crate::error::CmdError;
use crate::plan::{self, Export, Plan};
use clap::Args;
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
    let fleet = plan::load(a.fleet.as_deref(), a.generate, a.seed)?;
    plan::run_plan(Plan {
        fleet,
        policy: &a.policy,
        compare: a.compare,
        write_fleet: a.write_fleet.as_deref(),
        json: a.json,
        export: a.export.as_ref().map(|_| Export {
            out: a.out.as_deref(),
            namespace: a.namespace.clone(),
        }),
    })
}
