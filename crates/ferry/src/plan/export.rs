//! `ferry plan --export kubevirt`: the planner's plan as objects KubeVirt
//! applies (`ferry_fleet::export` makes them), written to a file or stdout,
//! with the commands that apply them wave by wave on stderr.

use crate::error::CmdError;
use ferry_fleet::export::{self, KubeVirtOptions, BEFORE_WAVE_LABEL, WAVE_LABEL};
use ferry_fleet::{DrainOutcome, Fleet};
use std::path::Path;

/// Where the export goes, and for which namespace.
pub struct Export<'a> {
    /// The file (and the table on stdout as usual), or stdout alone.
    pub out: Option<&'a Path>,
    /// The VMIs' namespace (default: kubectl's current one).
    pub namespace: Option<String>,
}

/// Writes the plan `o` of `fleet` as KubeVirt objects to `--out` or stdout,
/// and what to do with them to stderr. Nothing is written unless the whole
/// plan can be exported.
pub fn kubevirt(to: &Export, fleet: &Fleet, o: &DrainOutcome) -> Result<(), CmdError> {
    let opts = KubeVirtOptions {
        namespace: to.namespace.clone(),
    };
    let export = export::kubevirt(fleet, o, &opts).map_err(|e| CmdError::Failed(e.to_string()))?;
    let text = serde_json::to_string_pretty(&export.to_list())
        .map_err(|e| CmdError::Failed(e.to_string()))?;
    let file = match to.out {
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
