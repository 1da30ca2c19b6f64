//! One migration's cost: ferry's own model (`ferry_engine::converge`), fed
//! with what the fleet knows of a VM and the bandwidth it would get.

use crate::fleet::Vm;
use ferry_engine::converge::model::MigrationModel;
use ferry_engine::converge::{predict, ConvergeMode, PolicyForecast, PredictInput};
use ferry_engine::tunables::DEFAULT_MAX_ROUNDS;

/// The model's input for `vm` over a link of `bytes_per_sec`.
pub fn input(vm: &Vm, bytes_per_sec: f64) -> PredictInput {
    PredictInput {
        memory_bytes: vm.memory_bytes,
        data_bytes: vm.data_bytes.min(vm.memory_bytes),
        dirty_bytes_per_sec: vm.dirty_bytes_per_sec.clone(),
        working_set_bytes: vm.working_set_bytes.clone(),
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

/// The policy ferry recommends for `vm` over `bytes_per_sec` (converges
/// with the guest held least), and its forecast.
pub fn recommended(vm: &Vm, bytes_per_sec: f64) -> (ConvergeMode, PolicyForecast) {
    let p = predict(&input(vm, bytes_per_sec), &POLICIES);
    let mode = POLICIES
        .iter()
        .copied()
        .find(|m| m.to_string() == p.recommended)
        .unwrap_or(DEFAULT_POLICY);
    let f = p
        .policies
        .into_iter()
        .find(|f| f.policy == p.recommended)
        .expect("the recommended policy was forecast");
    (mode, f)
}

/// A migration of `vm` under `mode` as the simulator runs it.
pub fn model(vm: &Vm, mode: ConvergeMode, seed: u64) -> MigrationModel {
    MigrationModel::new(&input(vm, 1.0), mode, seed)
}
