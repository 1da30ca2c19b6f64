//! Dirty quota vs time-based throttling on running soft vCPUs.

use ferry_memstress::VmConfig;
use ferry_memstress::{read_progress, Workload};
use ferry_soft::quota::{DirtyQuota, QuotaExit, QuotaRefill, Throttle, TimeThrottle};
use ferry_soft::{Mechanisms, SoftVm};
use ferry_vm::capability::{DirtyLog as _, DirtyMeter as _, TimeThrottle as _};
use ferry_vm::{Backing, Vm};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config(write_percent: u8) -> VmConfig {
    VmConfig {
        workload: Workload {
            vcpus: 2,
            bytes_per_vcpu: 4 << 20,
            write_percent,
            readers: 0,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    }
}

/// Polls `done` until it holds; fails after 30 s (a guest that makes no
/// progress at all), never on a slow host.
fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "no progress in 30 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn run_with_quota(write_percent: u8) -> (u64, u64) {
    let exits = Arc::new(AtomicU64::new(0));
    let e = Arc::clone(&exits);
    let quota = Arc::new(DirtyQuota::new(
        2,
        64 * 4096,
        Arc::new(move |exit: QuotaExit| {
            assert!(exit.dirtied_bytes >= 64 * 4096);
            e.fetch_add(1, Ordering::Relaxed);
            QuotaRefill {
                sleep: Duration::from_micros(200),
                quota_bytes: 64 * 4096,
            }
        }),
    ));
    let mut vm = SoftVm::new_source(config(write_percent), Mechanisms::default()).unwrap();
    vm.set_throttle(Throttle::Quota(Arc::clone(&quota)));
    vm.start().unwrap();
    vm.start_dirty_log().unwrap();
    // Writers: until the first exhaustion, however slowly the host runs the
    // vCPUs. Readers: two whole passes each, every page read at least once.
    if write_percent > 0 {
        wait_until(|| exits.load(Ordering::Relaxed) > 0);
    } else {
        let start = read_progress(vm.ram(), 2).unwrap();
        wait_until(|| {
            let p = read_progress(vm.ram(), 2).unwrap();
            p.iter().zip(&start).all(|(n, s)| n.passes >= s.passes + 2)
        });
    }
    vm.pause().unwrap();
    vm.check_health().unwrap();
    let p = read_progress(vm.ram(), 2).unwrap();
    assert!(p.iter().all(|p| p.mismatches == 0));
    (exits.load(Ordering::Relaxed), quota.exits())
}

#[test]
fn dirty_quota_throttles_writers_only() {
    let (handler_exits, exits) = run_with_quota(100);
    assert!(
        handler_exits > 0 && handler_exits == exits,
        "writers exhaust their quota"
    );
    let (readers, _) = run_with_quota(0);
    assert_eq!(readers, 0, "readers are never charged");
}

#[test]
fn time_throttle_sleeps_every_vcpu() {
    let t = Arc::new(TimeThrottle::new(2, 50));
    let mut vm = SoftVm::new_source(config(0), Mechanisms::default()).unwrap();
    vm.set_throttle(Throttle::Time(Arc::clone(&t)));
    vm.start().unwrap();
    wait_until(|| t.sleeps() >= 2);
    vm.pause().unwrap();
    assert!(
        t.sleeps() >= 2,
        "readers are throttled too: {} sleeps",
        t.sleeps()
    );
}

#[test]
fn the_live_quota_sleeps_the_writer_and_never_the_reader() {
    let mut vm = SoftVm::new_source(config(100), Mechanisms::default()).unwrap();
    // vCPU 1 only reads.
    ferry_memstress::set_vcpu_write_percent(vm.ram(), 1, 0).unwrap();
    vm.start().unwrap();
    vm.start_dirty_log().unwrap();
    // 256 pages per vCPU per interval: the writer sweeps its 1024 pages
    // far faster. The reader writes only its progress record, at most once
    // per harvest (every 5 ms here): 20 pages an interval, under its quota.
    vm.set_dirty_quota(Some(&ferry_vm::Quota::uniform(
        256 * 4096,
        2,
        ferry_vm::QUOTA_INTERVAL,
    )))
    .unwrap();
    let live = Arc::clone(vm.live_throttle().expect("a SoftVm runs the live throttle"));
    let mut dirty = ferry_vm::DirtyPages::new(vm.ram().pages());
    // Harvests re-protect the pages, so each new write is charged again;
    // run until the writer has slept on its quota twice over an interval.
    wait_until(|| {
        std::thread::sleep(Duration::from_millis(4));
        vm.harvest_dirty(&mut dirty).unwrap();
        dirty.clear();
        live.quota_slept_ns(0) >= 2 * ferry_vm::QUOTA_INTERVAL.as_nanos() as u64
    });
    assert_eq!(
        live.quota_slept_ns(1),
        0,
        "the reader must never sleep on a quota"
    );
    let before = read_progress(vm.ram(), 2).unwrap();
    wait_until(|| read_progress(vm.ram(), 2).unwrap()[1].passes >= before[1].passes + 2);
    assert_eq!(live.quota_slept_ns(1), 0);
    // Lifting the quota stops the sleeps.
    vm.set_dirty_quota(None).unwrap();
    let slept = live.quota_slept_ns(0);
    let p = read_progress(vm.ram(), 2).unwrap()[0].passes;
    wait_until(|| {
        std::thread::sleep(Duration::from_millis(4));
        vm.harvest_dirty(&mut dirty).unwrap();
        dirty.clear();
        read_progress(vm.ram(), 2).unwrap()[0].passes >= p + 2
    });
    assert_eq!(live.quota_slept_ns(0), slept, "no quota sleep once lifted");
    vm.pause().unwrap();
}

#[test]
fn a_pause_does_not_wait_out_a_throttle_sleep() {
    let mut vm = SoftVm::new_source(config(100), Mechanisms::default()).unwrap();
    vm.start().unwrap();
    // At 99% each sleep is 990 ms.
    vm.set_time_throttle(99).unwrap();
    let live = Arc::clone(vm.live_throttle().unwrap());
    let before = live.time.sleeps();
    wait_until(|| live.time.sleeps() >= before + 2);
    // Both vCPUs are (or are about to be) in a 990 ms sleep, and each runs
    // only 10 ms between two: the pause must wake a sleeper, not wait its
    // sleep out. A pause that waited would return with every sleep over.
    vm.pause().unwrap();
    assert!(
        (0..2).any(|v| live.time.sleep_unfinished(v)),
        "the pause returned only after the vCPUs' throttle sleeps had ended"
    );
}

#[test]
fn the_dirty_limit_slows_a_writer_and_never_a_reader() {
    let mut vm = SoftVm::new_source(
        VmConfig {
            workload: Workload {
                readers: 1,
                bytes_per_vcpu: 32 << 20,
                ..config(100).workload
            },
            ..config(100)
        },
        Mechanisms::default(),
    )
    .unwrap();
    vm.start().unwrap();
    vm.start_dirty_log().unwrap();
    vm.set_dirty_limit(Some(1 << 20)).unwrap();
    let mut scratch = ferry_vm::DirtyPages::new(vm.ram().pages());
    // Rounds of 100 ms (each harvest write-protects the pages again), until
    // the writer has slept on its limit, however slowly the host runs it;
    // then a few more rounds for the reader to show it never does.
    wait_until(|| {
        std::thread::sleep(Duration::from_millis(100));
        vm.harvest_dirty(&mut scratch).unwrap();
        vm.throttled()[0] > Duration::ZERO
    });
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        vm.harvest_dirty(&mut scratch).unwrap();
    }
    let throttled = vm.throttled();
    vm.pause().unwrap();
    assert_eq!(throttled[1], Duration::ZERO, "the reader slept");
    let p = read_progress(vm.ram(), 2).unwrap();
    assert!(p.iter().all(|p| p.mismatches == 0));
}
