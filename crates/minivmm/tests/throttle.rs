//! minivmm's throttle (`ferry_kvm::throttle`, the one every VMM in the
//! tree shares), through what the VM declares to the engine:
//!
//! - with the dirty ring (the default), each vCPU's writes are metered, a
//!   migration's default policy is the seed's quota, and a quota puts the
//!   vCPUs that write to sleep;
//! - with the bitmap, the VM declares no meter: the default is
//!   auto-converge, and a quota is refused by name;
//! - the time throttle sleeps every vCPU, whether or not the guest exits.

use ferry_engine::choices::ConvergeMode;
use ferry_engine::converge;
use ferry_engine::vmm::{Backing, DirtyPages, Quota, TimeThrottle, Vm};
use minivmm::serial::ConsoleOut;
use minivmm::{MiniConfig, MiniVm};
use std::time::{Duration, Instant};

mod common;

fn boot(name: &str, dirty_ring: bool) -> (MiniVm, std::path::PathBuf) {
    let disk = std::env::temp_dir().join(format!(
        "minivmm-throttle-{name}-{}.img",
        std::process::id()
    ));
    let mut config = MiniConfig::new(2, 16, disk.clone());
    for i in 0..2 {
        let f = std::fs::File::create(config.disk_path(i)).unwrap();
        f.set_len(minivmm::layout::DISK_BLOCKS * minivmm::layout::BLOCK_BYTES)
            .unwrap();
    }
    config.dirty_ring = dirty_ring;
    let consoles = (0..2)
        .map(|_| ConsoleOut::new(Box::new(std::io::sink())))
        .collect();
    let vm = MiniVm::boot(config, Backing::Anonymous, consoles).unwrap();
    (vm, disk)
}

fn remove_disks(disk: &std::path::Path) {
    let _ = std::fs::remove_file(disk);
    let _ = std::fs::remove_file(format!("{}.1", disk.display()));
}

/// Harvests (re-arming every page, so the guest's sweep dirties anew)
/// until `done` holds, or fails after 60 s with `what`.
fn harvest_until(vm: &mut MiniVm, what: &str, mut done: impl FnMut(&mut MiniVm) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pages = DirtyPages::new(vm.ram().pages());
    while !done(vm) {
        assert!(Instant::now() < deadline, "{what}");
        for s in vm.dirty_sources() {
            s.collect(&mut pages).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn with_the_ring_each_vcpu_is_metered_and_a_quota_sleeps_the_writers() {
    if !common::kvm("minivmm throttle") {
        return;
    }
    let (mut vm, disk) = boot("ring", true);
    assert!(vm.dirty_meter().is_some(), "the ring meters each vCPU");
    assert_eq!(
        converge::choose(None, &mut vm).unwrap(),
        ConvergeMode::Quota
    );
    for s in vm.dirty_sources() {
        s.start().unwrap();
    }
    vm.start().unwrap();

    // Both vCPUs sweep their slice of the data: each ring counts them.
    harvest_until(&mut vm, "a vCPU's ring counted no page", |vm| {
        let d = vm.dirty_meter().unwrap().dirtied();
        d.len() == 2 && d.iter().all(|&n| n > 0)
    });
    assert!(
        vm.throttled().iter().all(Duration::is_zero),
        "no quota yet, no sleep: {:?}",
        vm.throttled()
    );

    // A quota of one page per 100 ms: far below what the guest dirties.
    let quota = Quota::uniform(4096, 2, Duration::from_millis(100));
    vm.dirty_meter()
        .unwrap()
        .set_dirty_quota(Some(&quota))
        .unwrap();
    harvest_until(&mut vm, "a writer never slept on its quota", |vm| {
        vm.throttled().iter().all(|t| !t.is_zero())
    });
    vm.dirty_meter().unwrap().set_dirty_quota(None).unwrap();
    vm.pause().unwrap();
    drop(vm);
    remove_disks(&disk);
}

#[test]
fn with_the_bitmap_no_vcpu_is_metered_and_a_quota_is_refused_by_name() {
    if !common::kvm("minivmm throttle") {
        return;
    }
    let (mut vm, disk) = boot("bitmap", false);
    assert!(vm.dirty_meter().is_none());
    assert_eq!(converge::choose(None, &mut vm).unwrap(), ConvergeMode::Auto);
    let why = converge::serves(&mut vm, ConvergeMode::Quota).unwrap_err();
    assert!(
        matches!(
            why,
            converge::ConvergeError::Unserved {
                policy: ConvergeMode::Quota,
                ..
            }
        ),
        "{why}"
    );
    assert!(why.to_string().contains("per-vCPU dirty meter"), "{why}");
    drop(vm);
    remove_disks(&disk);
}

#[test]
fn the_time_throttle_sleeps_every_vcpu() {
    if !common::kvm("minivmm throttle") {
        return;
    }
    let (mut vm, disk) = boot("time", true);
    vm.start().unwrap();
    vm.time_throttle().unwrap().set_time_throttle(50).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while vm.throttled().iter().any(Duration::is_zero) {
        assert!(Instant::now() < deadline, "{:?}", vm.throttled());
        std::thread::sleep(Duration::from_millis(20));
    }
    vm.time_throttle().unwrap().set_time_throttle(0).unwrap();
    vm.pause().unwrap();
    drop(vm);
    remove_disks(&disk);
}
