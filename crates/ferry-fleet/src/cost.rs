//! One migration's cost: ferry's own model (`ferry_engine::converge`), fed
//! with what the fleet knows of a VM and the bandwidth it would get.

use crate::fleet::Vm;
use ferry_engine::choices::ConvergeMode;
use ferry_engine::converge::model::MigrationModel;
use ferry_engine::converge::predict;
use ferry_engine::summary::{PolicyForecast, PredictInput};
use ferry_engine::tunables::DEFAULT_MAX_ROUNDS;

/// The model's input for `vm` over a link of `bytes_per_sec`.
pub fn input(vm: &Vm, bytes_per_sec: f64) -> PredictInput {
    PredictInput {
        memory_bytes: vm.memory_bytes,
        data_bytes: vm.data_bytes.min(vm.memory_bytes),
        dirty_bytes_per_sec: vm.dirty_bytes_per_sec.clone(),
        working_set_bytes: vm.working_set_bytes.clone(),
        // The fleet knows each VM's rate, not how it catches up after a
        // throttle's sleep: taken to be its rate.
        burst_bytes_per_sec: Vec::new(),
        link_bytes_per_sec: bytes_per_sec.max(1.0),
        link_known: true,
        downtime_target_ms: vm.downtime_target_ms,
        max_rounds: DEFAULT_MAX_ROUNDS,
        harvest_within_rounds: false,
    }
}

/// The policies a planner picks from: every one ferry's engine runs.
pub const POLICIES: [ConvergeMode; 4] = [
    ConvergeMode::None,
    ConvergeMode::Auto,
    ConvergeMode::DirtyLimit,
    ConvergeMode::Quota,
];

/// ferry's default convergence for a VM that meters each vCPU: the quota.
pub const DEFAULT_POLICY: ConvergeMode = ConvergeMode::Quota;

/// The policy that moves `vm` over `bytes_per_sec` soonest within its
/// downtime target, and its forecast. A drain is judged by when its last
/// VM lands, so time comes first; of policies within 5% of the quickest,
/// the one that holds the guest least (ferry's own recommendation, which
/// puts the guest first, would let a busy VM run unthrottled for rounds
/// while the rack waits). If none converges: the least downtime.
pub fn quickest(vm: &Vm, bytes_per_sec: f64) -> (ConvergeMode, PolicyForecast) {
    let p = predict(&input(vm, bytes_per_sec), &POLICIES);
    let converging: Vec<&PolicyForecast> = p
        .policies
        .iter()
        .filter(|f| f.converges && f.downtime_ms <= vm.downtime_target_ms)
        .collect();
    let pick = match converging.iter().map(|f| f.total_ms).reduce(f64::min) {
        Some(fastest) => converging
            .iter()
            .filter(|f| f.total_ms <= fastest * 1.05)
            .min_by(|a, b| a.throttled_ms.total_cmp(&b.throttled_ms))
            .map(|f| (*f).clone()),
        None => p
            .policies
            .iter()
            .min_by(|a, b| a.downtime_ms.total_cmp(&b.downtime_ms))
            .cloned(),
    }
    .expect("every policy was forecast");
    (pick.policy, pick)
}

/// A migration of `vm` under `mode` as the simulator runs it, with
/// `max_rounds` rounds at most (`None`: the engine's default).
pub fn model(vm: &Vm, mode: ConvergeMode, max_rounds: Option<u32>, seed: u64) -> MigrationModel {
    let mut input = input(vm, 1.0);
    input.max_rounds = max_rounds.unwrap_or(DEFAULT_MAX_ROUNDS);
    MigrationModel::new(&input, mode, seed)
}
