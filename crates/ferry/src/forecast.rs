//! `--predict` (always on in `ferry demo`): before migrating, sample each
//! vCPU's dirtying with the migration's own dirty tracking on, then ask the
//! engine's model (`ferry_engine::converge::predict`) what each policy
//! would do, and print that forecast. The module is `forecast`, not
//! `predict`, so that `predict` names the engine's model alone.
//!
//! ```text
//!   sample   ferry_engine::converge::sample_dirtying: the VM's own logs and
//!            per-vCPU counts, as for any VM (no help from the guest)
//!   link     the lower of --bandwidth and the shaped --netns link's rate
//!   model    ferry_engine::converge::predict_vm
//! ```
//!
//! Earlier the demo counted memstress's own writes instead. Those include
//! rewrites of a page already dirty, which cost a migration nothing: on
//! kvm a 64 MiB writer counted tens of gigabytes a second of them, where it
//! can dirty clean pages only as fast as its write-protect faults allow, and
//! the model then said auto-converge could never hold it (it did converge).

use crate::error::CmdError;
use ferry_engine::converge::{predict_vm, sample_dirtying, PredictSettings};
use ferry_engine::summary::Prediction;
use ferry_engine::Tunables;
use ferry_report::Table;
use ferry_vm::Vm;
use std::time::Duration;

/// Samples the guest for `secs` and predicts every policy the backend serves.
pub fn sample_and_predict(
    vm: &mut dyn Vm,
    tunables: &Tunables,
    link_rate: Option<u64>,
    secs: Duration,
    harvest_within_rounds: bool,
) -> Result<Prediction, CmdError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        CmdError::Failed(format!("prediction: cannot {what}: {e}"))
    };
    let sample = sample_dirtying(vm, secs).map_err(|e| failed("sample the guest", &e.chain()))?;
    // The lower of the engine's cap and the link's known rate.
    let cap = [tunables.bandwidth_bytes_per_sec(), link_rate.unwrap_or(0)]
        .into_iter()
        .filter(|&r| r > 0)
        .min();
    let settings = PredictSettings {
        link_bytes_per_sec: cap.map(|c| c as f64),
        downtime_target: tunables.downtime_target(),
        max_rounds: tunables.max_rounds(),
        harvest_within_rounds,
    };
    predict_vm(vm, &sample, &settings).map_err(|e| failed("predict", &e.chain()))
}

/// The prediction as a text table.
pub fn render(p: &Prediction) -> String {
    table(p).render()
}

/// The prediction as a table.
pub fn table(p: &Prediction) -> Table {
    let mut t = Table::new(
        "prediction (before starting)",
        &[
            "policy",
            "converges",
            "rounds",
            "total s",
            "downtime ms",
            "guest runtime %",
            "throttled s",
        ],
    );
    for f in &p.policies {
        t.row(vec![
            f.policy.to_string(),
            if f.converges { "yes" } else { "NO" }.into(),
            f.rounds.to_string(),
            format!("{:.1}", f.total_ms / 1e3),
            format!("{:.0}", f.downtime_ms),
            format!("{:.0}", f.runtime_pct),
            format!("{:.1}", f.throttled_ms / 1e3),
        ]);
    }
    t.note(format!(
        "recommended: {} (converges, and keeps the guest throttled least)",
        p.recommended
    ));
    if !p.link_known {
        t.note("link rate not known: assumed 1 GiB/s (give --bandwidth for a sharper prediction)");
    }
    t
}
