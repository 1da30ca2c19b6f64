//! Ring-mode dirty tracking loses no write while another thread reads the
//! rings. The dirty quota's meter collects every vCPU's ring every few
//! milliseconds, concurrently with the engine's harvests; a page it collects
//! must not reach a harvest before KVM has write-protected it again, or a
//! write that lands between the copy and the protection is never logged.
//!
//! The test copies memory the way precopy does (everything once, then each
//! harvest's pages, then the last harvest with the vCPUs paused) and checks
//! the copy against the source's memory, page by page.
//!
//! Needs /dev/kvm; prints a skip line where it is absent.

mod common;
use common::wait_for_passes;
use ferry_kvm::require_kvm;
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::{KvmVm, Role};
use ferry_memstress::{VmConfig, Workload};
use ferry_vm::capability::{DirtyLog as _, DirtyMeter as _};
use ferry_vm::{Backing, DirtyPages, Gfn, Quota, Vm, PAGE_SIZE};
use std::time::{Duration, Instant};

/// How long to harvest while the guest writes; each harvest races the
/// meter's collections.
const RACE_FOR: Duration = Duration::from_secs(2);

#[test]
fn harvests_racing_the_quota_meter_lose_no_write() {
    if !require_kvm("kvm ring race") {
        return;
    }
    let config = VmConfig {
        workload: Workload {
            vcpus: 2,
            bytes_per_vcpu: 2 << 20,
            write_percent: 100,
            readers: 0,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    };
    let mut vm = KvmVm::new(config, DirtyTracking::Ring { entries: 65536 }, Role::Source).unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    vm.start_dirty_log().unwrap();
    // A quota no vCPU can exhaust: the meter reads the rings every tick and
    // never puts a vCPU to sleep.
    let unlimited = Quota::uniform(1 << 40, 2, Duration::from_millis(100));
    vm.set_dirty_quota(Some(&unlimited)).unwrap();

    let pages = vm.ram().pages();
    let mut copy = vec![0u8; pages as usize * PAGE_SIZE];
    vm.ram().read_pages(Gfn(0), &mut copy).unwrap();
    let mut sent = 0u64;
    let until = Instant::now() + RACE_FOR;
    while Instant::now() < until {
        sent += copy_dirty(&mut vm, &mut copy);
    }
    vm.pause().unwrap();
    sent += copy_dirty(&mut vm, &mut copy);
    vm.set_dirty_quota(None).unwrap();

    let mut now = vec![0u8; PAGE_SIZE];
    let lost: Vec<u64> = (0..pages)
        .filter(|&g| {
            vm.ram().read_pages(Gfn(g), &mut now).unwrap();
            let at = g as usize * PAGE_SIZE;
            copy[at..at + PAGE_SIZE] != now[..]
        })
        .collect();
    assert!(sent > 0, "the guest dirtied nothing while logged");
    assert!(
        lost.is_empty(),
        "{} pages differ from the copy after {sent} pages were re-sent (first: {:#x?})",
        lost.len(),
        &lost[..lost.len().min(8)]
    );
}

/// One harvest, and a copy of every page it names. Returns the page count.
fn copy_dirty(vm: &mut KvmVm, copy: &mut [u8]) -> u64 {
    let mut dirty = DirtyPages::new(vm.ram().pages());
    vm.harvest_dirty(&mut dirty).unwrap();
    for gfn in dirty.iter() {
        let at = gfn.0 as usize * PAGE_SIZE;
        vm.ram()
            .read_pages(gfn, &mut copy[at..at + PAGE_SIZE])
            .unwrap();
    }
    dirty.count()
}
