//! The memstress guest on real vCPUs: it runs at CPL3, makes progress, its
//! stamp checks pass, every dirty-tracking mode reports what it wrote, and its
//! vCPU state moves into another VM and resumes there.
//!
//! Needs /dev/kvm; prints a skip line where it is absent.

mod common;
use common::wait_for_passes;
use ferry_vm::capability::{DirtyLog as _, TimeThrottle as _, VcpuState as _};

use ferry_kvm::require_kvm;
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::{KvmVm, Role};
use ferry_memstress::read_progress;
use ferry_memstress::{VmConfig, Workload};
use ferry_vm::{Backing, DirtyPages, Gfn, Vm, PAGE_SIZE};
use std::time::{Duration, Instant};

fn config(write_percent: u8, mib_per_vcpu: u64) -> VmConfig {
    VmConfig {
        workload: Workload {
            vcpus: 2,
            bytes_per_vcpu: mib_per_vcpu << 20,
            write_percent,
            readers: 0,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    }
}

/// Waits until every vCPU has completed two more passes than it had now: at
/// least one whole pass of each starts after this call.
fn wait_for_a_whole_pass_each(vm: &KvmVm) {
    let vcpus = vm.config().workload.vcpus;
    let start = read_progress(vm.ram(), vcpus).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        vm.check_health().expect("vCPUs healthy");
        let p = read_progress(vm.ram(), vcpus).unwrap();
        if p.iter()
            .zip(&start)
            .all(|(now, then)| now.passes >= then.passes + 2)
        {
            return;
        }
        assert!(Instant::now() < deadline, "guest made no progress: {p:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn guest_runs_and_checks_its_stamps() {
    if !require_kvm("kvm guest") {
        return;
    }
    let mut vm = KvmVm::new(config(100, 8), DirtyTracking::Bitmap, Role::Source).unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 3);
    vm.pause().unwrap();
    let p = read_progress(vm.ram(), 2).unwrap();
    for v in &p {
        assert_eq!(v.mismatches, 0, "{p:?}");
        assert!(v.writes >= 2 * 2048, "{p:?}");
    }
    // The stamp of page 5 of vCPU 1 is where the contract says it is.
    let layout = vm.config().layout();
    let page5 = layout.region_gpa(1).add(5 * PAGE_SIZE as u64);
    let stamp = vm.ram().load_u64(page5).unwrap();
    assert_eq!(stamp >> 56, 2, "vCPU 1 stamps carry vcpu+1 = 2: {stamp:#x}");
    assert_eq!((stamp >> 32) & 0xff_ffff, 5);
}

#[test]
fn the_guest_touches_its_hot_set_only() {
    if !require_kvm("kvm guest") {
        return;
    }
    let mut c = config(100, 8);
    c.workload.hot_percent = 25;
    c.workload.fill = ferry_memstress::Fill::Text;
    let mut vm = KvmVm::new(c, DirtyTracking::Bitmap, Role::Source).unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 3);
    vm.pause().unwrap();
    let p = read_progress(vm.ram(), 2).unwrap();
    let (pages, hot) = (2048, 512);
    let layout = vm.config().layout();
    for (v, progress) in p.iter().enumerate() {
        assert_eq!(progress.mismatches, 0, "{p:?}");
        // Every access is to the hot set: whole passes of 512 pages.
        assert!(progress.accesses >= 3 * hot, "{p:?}");
        assert!(progress.accesses < (progress.passes + 1) * hot, "{p:?}");
        let first = layout.region_gpa(v as u32).0 / PAGE_SIZE as u64;
        let mut page = vec![0u8; PAGE_SIZE];
        let mut want = vec![0u8; PAGE_SIZE];
        for i in 0..pages {
            vm.ram().read_pages(Gfn(first + i), &mut page).unwrap();
            let stamp = u64::from_le_bytes(page[..8].try_into().unwrap());
            if i < hot {
                assert_eq!(stamp >> 56, v as u64 + 1, "vCPU {v} page {i} is stamped");
            } else {
                assert_eq!(
                    stamp, 0,
                    "vCPU {v} page {i}, outside the hot set, was written"
                );
            }
            // The boot fill is there, in and out of the hot set.
            ferry_memstress::Fill::Text.fill_page(first + i, &mut want);
            assert_eq!(page[8..], want[8..], "vCPU {v} page {i} keeps its fill");
        }
    }
}

#[test]
fn a_corrupted_page_is_caught_by_the_guest() {
    if !require_kvm("kvm guest") {
        return;
    }
    let mut vm = KvmVm::new(config(100, 4), DirtyTracking::Bitmap, Role::Source).unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    vm.pause().unwrap();
    let page = vm.config().layout().region_gpa(0).add(7 * PAGE_SIZE as u64);
    vm.ram().store_u64(page, 0xdead_beef).unwrap();
    vm.start().unwrap();
    let before = read_progress(vm.ram(), 2).unwrap()[0].passes;
    wait_for_passes(&vm, before + 2);
    vm.pause().unwrap();
    let p = read_progress(vm.ram(), 2).unwrap();
    assert_eq!(p[0].mismatches, 1, "{p:?}");
    assert_eq!(p[1].mismatches, 0, "{p:?}");
}

fn dirty_tracking_reports_writes(mode: DirtyTracking) {
    let mut vm = KvmVm::new(config(100, 8), mode, Role::Source).unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    vm.start_dirty_log().unwrap();
    let mut first = DirtyPages::new(vm.ram().pages());
    vm.harvest_dirty(&mut first).unwrap();
    wait_for_a_whole_pass_each(&vm);
    vm.pause().unwrap();
    let mut dirty = DirtyPages::new(vm.ram().pages());
    vm.harvest_dirty(&mut dirty).unwrap();
    dirty.merge(&first);
    let layout = vm.config().layout();
    // Every page of both regions was written after logging started.
    for v in 0..2 {
        let first_gfn = layout.region_gpa(v).gfn().0;
        for g in first_gfn..first_gfn + 2048 {
            assert!(dirty.contains(Gfn(g)), "{} missed page {g:#x}", mode.name());
        }
    }
    // A harvest with the guest stopped is empty afterwards.
    let mut after = DirtyPages::new(vm.ram().pages());
    vm.harvest_dirty(&mut after).unwrap();
    assert!(
        after.is_empty(),
        "{}: {} stale pages",
        mode.name(),
        after.count()
    );
    vm.stop_dirty_log().unwrap();
}

#[test]
fn bitmap_mode_reports_every_write() {
    if require_kvm("kvm guest") {
        dirty_tracking_reports_writes(DirtyTracking::Bitmap);
    }
}

#[test]
fn clear_mode_reports_every_write() {
    if require_kvm("kvm guest") {
        dirty_tracking_reports_writes(DirtyTracking::Clear {
            chunk_pages: 4096,
            pace_us: 0,
        });
    }
}

#[test]
fn ring_mode_reports_every_write() {
    if require_kvm("kvm guest") {
        // A small ring, so ring-full exits happen and are drained by the vCPUs.
        dirty_tracking_reports_writes(DirtyTracking::Ring { entries: 1024 });
    }
}

#[test]
fn vcpu_state_and_ram_resume_in_another_vm() {
    if !require_kvm("kvm guest") {
        return;
    }
    let cfg = config(50, 4);
    let mut src = KvmVm::new(cfg.clone(), DirtyTracking::Bitmap, Role::Source).unwrap();
    src.start().unwrap();
    wait_for_passes(&src, 2);
    src.pause().unwrap();
    let state = src.save_vcpus().unwrap();
    let mut dst = KvmVm::new(cfg, DirtyTracking::Bitmap, Role::Destination).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    for g in 0..src.ram().pages() {
        src.ram().read_pages(Gfn(g), &mut buf).unwrap();
        dst.ram().write_pages(Gfn(g), &buf).unwrap();
    }
    dst.restore_vcpus(&state).unwrap();
    let at_switch = read_progress(dst.ram(), 2).unwrap();
    dst.start().unwrap();
    wait_for_passes(&dst, at_switch[0].passes.max(at_switch[1].passes) + 2);
    dst.pause().unwrap();
    let p = read_progress(dst.ram(), 2).unwrap();
    assert!(p.iter().all(|v| v.mismatches == 0), "{p:?}");
}

/// Free 2 MiB huge pages in the host's hugetlb pool.
fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn every_backing_runs_the_guest_and_logs_its_writes() {
    if !require_kvm("kvm guest") {
        return;
    }
    for backing in [
        Backing::Anonymous,
        Backing::Thp,
        Backing::Memfd,
        Backing::Hugetlb,
    ] {
        let mut cfg = config(100, 4);
        cfg.backing = backing;
        let pages_needed = cfg.layout().total_bytes() / (2 << 20);
        if backing == Backing::Hugetlb && free_huge_pages() < pages_needed {
            ferry_vm::skip!(
                "SKIP hugetlb backing: {pages_needed} free 2 MiB huge pages needed, {} reserved",
                free_huge_pages()
            );
            continue;
        }
        let mut vm = KvmVm::new(cfg, DirtyTracking::Bitmap, Role::Source).unwrap();
        vm.start().unwrap();
        wait_for_passes(&vm, 1);
        vm.start_dirty_log().unwrap();
        wait_for_a_whole_pass_each(&vm);
        vm.pause().unwrap();
        let mut dirty = DirtyPages::new(vm.ram().pages());
        vm.harvest_dirty(&mut dirty).unwrap();
        assert!(
            dirty.count() >= 2 * 1024,
            "{backing:?}: {} pages",
            dirty.count()
        );
        let p = read_progress(vm.ram(), 2).unwrap();
        assert!(p.iter().all(|v| v.mismatches == 0), "{backing:?}: {p:?}");
    }
}

#[test]
fn rate_limit_caps_passes_and_write_percent_changes_live() {
    if !require_kvm("kvm guest") {
        return;
    }
    // 4 MiB regions at 64 MiB/s: at most 16 passes a second per vCPU.
    let mut cfg = config(100, 4);
    cfg.workload.rate_limit_mib_s = Some(64);
    let mut vm = KvmVm::new(cfg, DirtyTracking::Bitmap, Role::Source).unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    let before = read_progress(vm.ram(), 2).unwrap();
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let after = read_progress(vm.ram(), 2).unwrap();
    let secs = t.elapsed().as_secs_f64();
    for (b, a) in before.iter().zip(&after) {
        let passes = (a.passes - b.passes) as f64;
        // An upper bound only: a slow host may run fewer passes, never more.
        assert!(passes <= 16.0 * secs + 2.0, "{passes} passes in {secs:.2}s");
    }
    // Stop writing while the guest runs: the write counters freeze, the
    // guest keeps reading and checking.
    ferry_memstress::set_write_percent(vm.ram(), 2, 0).unwrap();
    wait_for_a_whole_pass_each(&vm);
    let frozen = read_progress(vm.ram(), 2).unwrap();
    wait_for_a_whole_pass_each(&vm);
    vm.pause().unwrap();
    let last = read_progress(vm.ram(), 2).unwrap();
    for (f, l) in frozen.iter().zip(&last) {
        assert_eq!(f.writes, l.writes, "writes went on at 0%");
        assert!(l.passes > f.passes);
        assert_eq!(l.mismatches, 0);
    }
}

#[test]
fn time_throttle_puts_running_vcpus_to_sleep_live() {
    if !require_kvm("kvm guest") {
        return;
    }
    let mut vm = KvmVm::new(config(100, 4), DirtyTracking::Bitmap, Role::Source).unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    assert_eq!(vm.throttle_sleeps(), vec![0, 0], "no throttle, no sleeps");
    vm.set_time_throttle(50).unwrap();
    wait_for_a_whole_pass_each(&vm);
    let deadline = Instant::now() + Duration::from_secs(30);
    while vm.throttle_sleeps().iter().any(|&n| n < 3) {
        assert!(Instant::now() < deadline, "{:?}", vm.throttle_sleeps());
        std::thread::sleep(Duration::from_millis(10));
    }
    // Off again: the count stops growing once in-flight sleeps end (however
    // long the host takes to run them), and the throttled guest kept running
    // correctly throughout.
    vm.set_time_throttle(0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let before = vm.throttle_sleeps();
        wait_for_a_whole_pass_each(&vm);
        if vm.throttle_sleeps() == before {
            break;
        }
        assert!(Instant::now() < deadline, "sleeps go on at 0%: {before:?}");
    }
    vm.pause().unwrap();
    let p = read_progress(vm.ram(), 2).unwrap();
    assert!(p.iter().all(|v| v.mismatches == 0), "{p:?}");
}
