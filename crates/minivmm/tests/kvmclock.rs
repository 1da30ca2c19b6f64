//! A guest whose kvmclock runs on while it is held is told so as minivmm
//! lets it run again (`KVM_KVMCLOCK_CTRL`): KVM sets
//! `PVCLOCK_GUEST_STOPPED` in the guest's kvmclock page as it enters. A
//! Linux guest reads the flag and does not take a long hold (a snapshot
//! restored later, a guest held for an operator) for a soft lockup; the
//! Linux guest's own check is `scripts/svm-ci.sh`'s snapshot restored 25 s
//! later. minivmm's CPL3 guest never reads its kvmclock page, so the flag
//! stays for this test to find.

mod common;

use ferry_engine::vmm::{Backing, Vm};
use ferry_kvm::cpu_state::msrs::KVM_SYSTEM_TIME_NEW;
use ferry_kvm::cpu_state::Snapshot;
use ferry_vm::Gfn;
use kvm_bindings::kvm_msr_entry;
use minivmm::{MiniConfig, MiniVm};
use std::time::{Duration, Instant};

/// A page of region 0 that minivmm's guest never touches (above its
/// lanes, below the hole; `minivmm::layout`).
const CLOCK_PAGE: Gfn = Gfn(0xf00);
/// `struct pvclock_vcpu_time_info`: its `version` (u32) at 0, `flags`
/// (u8) at 29.
const VERSION: usize = 0;
const FLAGS: usize = 29;
/// `PVCLOCK_GUEST_STOPPED`.
const GUEST_STOPPED: u8 = 1 << 1;

/// vCPU 0's kvmclock page, as KVM last wrote it.
fn clock_page(vm: &MiniVm) -> Vec<u8> {
    let mut page = vec![0u8; 4096];
    vm.ram().read_pages(CLOCK_PAGE, &mut page).unwrap();
    page
}

#[test]
fn a_guest_on_kvmclock_is_told_it_was_held_as_it_runs_again() {
    if !ferry_kvm::require_kvm("minivmm kvmclock") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("minivmm-kvmclock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = MiniConfig::new(1, 8, dir.join("disk.img"));
    common::make_disks(&config);
    let mut vm = MiniVm::boot(config, Backing::Anonymous, common::sinks(1)).unwrap();

    // The guest takes up kvmclock, as Linux does as it boots: its state
    // as saved, with vCPU 0's kvmclock MSR pointing at the page.
    let saved = vm.vcpu_state().unwrap().save_vcpus().unwrap();
    let mut snap = Snapshot::decode(&saved).unwrap();
    let msrs = &mut snap.vcpus[0].msrs;
    msrs.retain(|m| m.index != KVM_SYSTEM_TIME_NEW);
    msrs.push(kvm_msr_entry {
        index: KVM_SYSTEM_TIME_NEW,
        data: CLOCK_PAGE.gpa().0 | 1,
        ..Default::default()
    });
    let taken = snap.encode().unwrap();
    vm.vcpu_state().unwrap().restore_vcpus(&taken).unwrap();
    assert_eq!(
        clock_page(&vm)[VERSION],
        0,
        "KVM wrote the page before the guest ran"
    );

    vm.start().unwrap();
    // KVM writes the page as the vCPU enters: wait for it (a loaded host
    // may take a while to run the vCPU's thread).
    let deadline = Instant::now() + Duration::from_secs(30);
    let version = |page: &[u8]| u32::from_le_bytes(page[VERSION..VERSION + 4].try_into().unwrap());
    while version(&clock_page(&vm)) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    vm.pause().unwrap();
    let page = clock_page(&vm);
    assert_ne!(
        version(&page),
        0,
        "KVM never wrote the guest's kvmclock page"
    );
    assert_eq!(
        page[FLAGS] & GUEST_STOPPED,
        GUEST_STOPPED,
        "the guest was not told it was held (flags {:#x})",
        page[FLAGS]
    );
    drop(vm);
    let _ = std::fs::remove_dir_all(dir);
}
