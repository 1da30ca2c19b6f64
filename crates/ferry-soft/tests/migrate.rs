//! A whole migration between two soft VMs in one process: full copy, dirty
//! rounds under running vCPUs, stop-and-copy, vCPU state transfer, and the
//! guest's own stamp checks on both sides. Run for the seed mechanisms and for
//! every baseline.

use ferry_memstress::VmConfig;
use ferry_memstress::{read_progress, AccessOrder, Workload};
use ferry_soft::{Mechanisms, SoftVm, SplitMode};
use ferry_vm::capability::{DirtyLog as _, VcpuState as _};
use ferry_vm::{Backing, DirtyPages, GuestRam, Vm, PAGE_SIZE};
use std::time::{Duration, Instant};

fn config(order: AccessOrder, write_percent: u8) -> VmConfig {
    VmConfig {
        workload: Workload {
            vcpus: 3,
            bytes_per_vcpu: 4 << 20,
            write_percent,
            readers: 0,
            order,
            stride_pages: 1,
            rate_limit_mib_s: None,
            seed: 7,
            fill: ferry_memstress::Fill::Zero,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    }
}

fn copy(src: &GuestRam, dst: &GuestRam, pages: &DirtyPages) {
    let mut buf = vec![0u8; PAGE_SIZE];
    for gfn in pages.iter() {
        src.read_pages(gfn, &mut buf).unwrap();
        dst.write_pages(gfn, &buf).unwrap();
    }
}

fn digest(ram: &GuestRam) -> Vec<u8> {
    let mut all = vec![0u8; ram.size() as usize];
    ram.read_pages(ferry_vm::Gfn(0), &mut all).unwrap();
    all
}

fn migrate(mech: Mechanisms, order: AccessOrder, write_percent: u8) {
    let cfg = config(order, write_percent);
    let mut src = SoftVm::new_source(cfg.clone(), mech).unwrap();
    src.start().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mut dst = SoftVm::new_destination(cfg.clone(), mech).unwrap();
    let pages = src.ram().pages();

    src.start_dirty_log().unwrap();
    // Round 0: everything (the VMM's own writes included).
    let mut vmm = DirtyPages::new(pages);
    src.ram().take_vmm_dirty(&mut vmm);
    copy(src.ram(), dst.ram(), &DirtyPages::all(pages));
    // Dirty rounds: at least six, and on until every vCPU finished a pass,
    // however slowly the host runs them.
    let deadline = Instant::now() + Duration::from_secs(60);
    for round in 0.. {
        let mut dirty = DirtyPages::new(pages);
        src.harvest_dirty(&mut dirty).unwrap();
        src.ram().take_vmm_dirty(&mut dirty);
        copy(src.ram(), dst.ram(), &dirty);
        let progress = read_progress(src.ram(), cfg.workload.vcpus).unwrap();
        if round >= 6 && progress.iter().all(|p| p.passes >= 1) {
            break;
        }
        assert!(Instant::now() < deadline, "source made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    src.pause().unwrap();
    let mut last = DirtyPages::new(pages);
    src.harvest_dirty(&mut last).unwrap();
    src.ram().take_vmm_dirty(&mut last);
    copy(src.ram(), dst.ram(), &last);
    src.check_health().unwrap();
    assert!(
        digest(src.ram()) == digest(dst.ram()),
        "{mech:?}: RAM differs at switchover"
    );
    let progress = read_progress(src.ram(), cfg.workload.vcpus).unwrap();
    assert!(progress.iter().all(|p| p.mismatches == 0), "{progress:?}");
    assert!(
        progress.iter().all(|p| p.passes >= 1),
        "vCPUs ran: {progress:?}"
    );

    let state = src.save_vcpus().unwrap();
    dst.restore_vcpus(&state).unwrap();
    drop(src);
    dst.start().unwrap();
    let before = read_progress(dst.ram(), cfg.workload.vcpus).unwrap();
    // Run until every vCPU finished at least two more passes on the destination.
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let now = read_progress(dst.ram(), cfg.workload.vcpus).unwrap();
        if now
            .iter()
            .zip(&before)
            .all(|(n, b)| n.passes >= b.passes + 2)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    dst.pause().unwrap();
    dst.check_health().unwrap();
    let after = read_progress(dst.ram(), cfg.workload.vcpus).unwrap();
    assert!(
        after
            .iter()
            .zip(&before)
            .all(|(n, b)| n.passes >= b.passes + 2),
        "destination made progress: {before:?} -> {after:?}"
    );
    assert!(
        after.iter().all(|p| p.mismatches == 0),
        "{mech:?}: guest saw lost or stale pages after migration: {after:?}"
    );
}

#[test]
fn migration_keeps_every_write_with_seed_mechanisms() {
    migrate(Mechanisms::default(), AccessOrder::Sequential, 50);
    migrate(Mechanisms::default(), AccessOrder::Random, 100);
}

#[test]
fn migration_keeps_every_write_with_baselines() {
    migrate(Mechanisms::baseline(), AccessOrder::Random, 30);
    let chunked = Mechanisms {
        split: SplitMode::Chunked {
            chunk_pages: 1024,
            pace_us: 10,
        },
        ..Mechanisms::default()
    };
    migrate(chunked, AccessOrder::Sequential, 100);
}

#[test]
fn saved_state_of_another_shape_is_refused() {
    let cfg = config(AccessOrder::Sequential, 10);
    let mut vm = SoftVm::new_destination(cfg, Mechanisms::default()).unwrap();
    assert!(vm.restore_vcpus(b"{}").is_err());
    assert!(vm.restore_vcpus(b"garbage").is_err());
    let other = VmConfig {
        workload: Workload {
            vcpus: 1,
            ..config(AccessOrder::Sequential, 10).workload
        },
        ..config(AccessOrder::Sequential, 10)
    };
    let mut one = SoftVm::new_source(other, Mechanisms::default()).unwrap();
    let state = one.save_vcpus().unwrap();
    assert!(vm.restore_vcpus(&state).is_err());
    one.start().unwrap();
    assert!(one.save_vcpus().is_err(), "save needs a paused VM");
}

#[test]
fn a_failing_vcpu_is_reported_and_pause_still_returns() {
    let cfg = config(AccessOrder::Sequential, 50);
    let mut vm = SoftVm::new_source(cfg, Mechanisms::default()).unwrap();
    // Point vCPU 1's region past the end of guest RAM.
    let params = ferry_memstress::MemoryLayout::params_gpa(1);
    vm.ram()
        .store_u64(params.add(ferry_memstress::param::REGION), 1 << 40)
        .unwrap();
    vm.start().unwrap();
    let mut failed = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Err(e) = vm.check_health() {
            failed = Some(e);
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    match failed {
        Some(ferry_vm::VmError::VcpuFailed { vcpu, .. }) => assert_eq!(vcpu, 1),
        other => panic!("expected vCPU 1 to fail, got {other:?}"),
    }
    vm.pause().unwrap();
    assert!(!vm.is_running());
}
