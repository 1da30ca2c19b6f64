//! A guest's progress, waited for: tests start a VM, then wait until its
//! guest has completed some passes over its memory before they migrate it
//! or check it, each guest counting its passes its own way.

use ferry_vm::Vm;
use std::time::{Duration, Instant};

/// Waits (at most `limit`, checking `vm`'s health each time) until every
/// count `passes_of` reads from `vm` (one per vCPU, or one for the whole
/// guest) has reached `passes`. Panics, naming the counts, when it does
/// not: a test's guest that stopped making progress.
pub fn wait_for_passes(
    vm: &dyn Vm,
    passes: u64,
    limit: Duration,
    passes_of: impl Fn(&dyn Vm) -> Vec<u64>,
) {
    let deadline = Instant::now() + limit;
    loop {
        vm.check_health().expect("the guest's vCPUs are healthy");
        let counts = passes_of(vm);
        if counts.iter().all(|&n| n >= passes) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the guest did not reach pass {passes} in {limit:?}: {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
