//! What the kvm tests share.

use ferry_kvm_memstress::KvmVm;
use ferry_memstress::read_progress;
use std::time::Duration;

/// Waits (at most 60 s, the vCPUs healthy) until every vCPU of `vm` has
/// completed `passes`.
pub fn wait_for_passes(vm: &KvmVm, passes: u64) {
    ferry_harness::guest::wait_for_passes(vm, passes, Duration::from_secs(60), |vm| {
        let p = read_progress(vm.ram(), vm.vcpus()).unwrap();
        p.iter().map(|v| v.passes).collect()
    });
}
