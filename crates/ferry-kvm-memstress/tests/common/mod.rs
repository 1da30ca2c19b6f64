//! What the kvm tests share.

use ferry_kvm_memstress::KvmVm;
use ferry_memstress::read_progress;
use ferry_vm::Vm;
use std::time::{Duration, Instant};

/// Waits (at most 60 s, the vCPUs healthy) until every vCPU of `vm` has
/// completed `passes`.
pub fn wait_for_passes(vm: &KvmVm, passes: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        vm.check_health().expect("vCPUs healthy");
        let p = read_progress(vm.ram(), vm.config().workload.vcpus).unwrap();
        if p.iter().all(|v| v.passes >= passes) {
            return;
        }
        assert!(Instant::now() < deadline, "guest made no progress: {p:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
