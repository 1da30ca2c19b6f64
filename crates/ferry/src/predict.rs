//! `--predict` (always on in `ferry demo`): before migrating, sample each
//! vCPU's dirty rate with the migration's own dirty tracking on, then ask
//! the engine's model (`ferry_engine::converge::predict`) what each policy
//! would do.
//!
//! ```text
//!   start dirty logging ─ guest write counters ─ SECS ─ counters, harvest ─ stop logging
//!   rate per vCPU = writes × 4 KiB / SECS   (tracking's own cost included: on
//!                                            a shadow-paging host it is most of it)
//!   working set   = the vCPU's region if it writes, else 0
//!   link          = the --bandwidth cap or the shaped --netns link's rate
//! ```
//!
//! memstress counts every write, rewrites of a page included, which the
//! dirty logs cannot see; the rest (data bytes, the policies the VM serves,
//! the model) is the engine's [`ferry_engine::converge::predict_vm`], as for
//! any VM.

use crate::cmd::CmdError;
use ferry_engine::converge::{predict_vm, DirtySample, PredictSettings, Prediction};
use ferry_engine::Tunables;
use ferry_memstress::{read_progress, Workload};
use ferry_report::Table;
use ferry_vm::{DirtyPages, Vm, PAGE_SIZE};
use std::time::{Duration, Instant};

/// Samples the guest for `secs` and predicts every policy the backend serves.
pub fn sample_and_predict(
    vm: &mut dyn Vm,
    w: &Workload,
    tunables: &Tunables,
    link_rate: Option<u64>,
    secs: Duration,
    harvest_within_rounds: bool,
) -> Result<Prediction, CmdError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        CmdError::Failed(format!("prediction: cannot {what}: {e}"))
    };
    let no_log = || CmdError::Failed("prediction: this VM keeps no dirty log".into());
    vm.dirty_log()
        .ok_or_else(no_log)?
        .start_dirty_log()
        .map_err(|e| failed("start dirty logging", &e))?;
    let before = read_progress(vm.ram(), w.vcpus).map_err(|e| failed("read the guest", &e));
    let t0 = Instant::now();
    std::thread::sleep(secs);
    let after = read_progress(vm.ram(), w.vcpus).map_err(|e| failed("read the guest", &e));
    let took = t0.elapsed().as_secs_f64();
    let mut scratch = DirtyPages::new(vm.ram().pages());
    let log = vm.dirty_log().ok_or_else(no_log)?;
    let harvested = log.harvest_dirty(&mut scratch);
    log.stop_dirty_log()
        .map_err(|e| failed("stop dirty logging", &e))?;
    harvested.map_err(|e| failed("harvest the dirty log", &e))?;
    let (before, after) = (before?, after?);
    let rates = before
        .iter()
        .zip(&after)
        .map(|(a, b)| b.writes.saturating_sub(a.writes) as f64 * PAGE_SIZE as f64 / took)
        .collect();
    let working_set_bytes = (0..w.vcpus)
        .map(|v| match w.vcpu_write_percent(v) {
            0 => 0,
            _ => w.bytes_per_vcpu,
        })
        .collect();
    // The lower of the engine's cap and the link's known rate.
    let cap = [tunables.bandwidth_bytes_per_sec(), link_rate.unwrap_or(0)]
        .into_iter()
        .filter(|&r| r > 0)
        .min();
    let sample = DirtySample {
        dirty_bytes_per_sec: rates,
        working_set_bytes,
    };
    let settings = PredictSettings {
        link_bytes_per_sec: cap.map(|c| c as f64),
        downtime_target: tunables.downtime_target(),
        max_rounds: tunables.max_rounds(),
        harvest_within_rounds,
    };
    predict_vm(vm, &sample, &settings).map_err(|e| failed("predict", &e.chain()))
}

/// The prediction as a table.
pub fn render(p: &Prediction) -> String {
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
            f.policy.clone(),
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
    t.render()
}
