//! A snapshot of real vCPUs: memstress writing on two vCPUs is saved to a
//! file while it runs (KVM's dirty log feeds the rounds), restored into a
//! fresh VM, and walks on there with its own stamp checks clean, while the
//! source's guest runs on too. The bitmap and the ring each feed one.
//! Restored lazily, the vCPUs run before memory is in, their touches of
//! missing pages held in KVM until the page comes from the file; a damaged
//! page stops them, named.
//!
//! Needs /dev/kvm; prints a skip line where it is absent.

mod common;
use common::wait_for_passes;

use ferry_engine::error::SnapshotError;
use ferry_engine::progress::{Phase, Progress};
use ferry_engine::snapshot::{
    self, ProofAt, RestoreMode, RestoreOptions, SnapshotOptions, Steering,
};
use ferry_engine::vmm::StreamHeader;
use ferry_kvm::require_kvm;
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::{KvmVm, Role};
use ferry_memstress::{read_progress, MemstressProbe, VmConfig, Workload};
use ferry_vm::{Backing, GuestProbe, GuestRam, Vm, VmError};
use std::sync::{Arc, Mutex};

fn config() -> VmConfig {
    VmConfig {
        workload: Workload {
            vcpus: 2,
            bytes_per_vcpu: 16 << 20,
            write_percent: 100,
            readers: 0,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    }
}

/// The fewest passes any vCPU has walked.
fn passes(vm: &KvmVm) -> u64 {
    vcpu_passes(vm).into_iter().min().unwrap_or(0)
}

#[test]
fn a_writing_kvm_guest_saved_live_restores_and_runs_on_with_its_stamps_clean() {
    if !require_kvm("kvm snapshot") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferry-kvm-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in [DirtyTracking::Bitmap, DirtyTracking::Ring { entries: 4096 }] {
        let path = dir.join(format!("{}.snap", mode.name()));
        let mut src = KvmVm::new(config(), mode, Role::Source).unwrap();
        src.start().unwrap();
        wait_for_passes(&src, 1);
        let s = snapshot::save(&mut src, &path, &SnapshotOptions::default()).unwrap();
        assert!(src.is_running(), "{mode:?}: the source runs on");
        assert!(s.rounds.len() >= 2, "{mode:?}: {s:?}");
        // Proved after the pause, memory frozen while both vCPUs wrote on:
        // a write KVM made past the freeze would have failed the save.
        if freezes() {
            assert_eq!(s.proof, ProofAt::Frozen, "{mode:?}: {s:?}");
        }

        let mut build = |h: &StreamHeader| -> Result<KvmVm, VmError> {
            assert_eq!(h.vcpus, 2);
            KvmVm::new(config(), mode, Role::Destination).map_err(|e| VmError::Guest(e.to_string()))
        };
        let (mut dst, r) =
            snapshot::restore_as(&path, &mut build, &RestoreOptions::default()).unwrap();
        let r = r.finish(&mut dst).unwrap();
        assert!(r.digest_match && dst.is_running(), "{mode:?}: {r:?}");
        let from = passes(&dst);
        wait_for_passes(&dst, from + 2);
        wait_for_passes(&src, passes(&src) + 1);
        for (side, vm) in [("restored", &dst), ("source", &src)] {
            let check = MemstressProbe.read(vm).unwrap();
            assert_eq!(check.errors, 0, "{mode:?}: the {side} guest's stamps");
        }
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether this kernel freezes memory for a proof after the pause.
fn freezes() -> bool {
    let ram = GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap();
    let frozen = ferry_vm::uffd::Placer::freeze(&ram);
    if let Err(e) = &frozen {
        eprintln!("SKIP: memory cannot be frozen here ({e}); the proof's place not checked");
    }
    frozen.is_ok()
}

fn build(h: &StreamHeader) -> Result<KvmVm, VmError> {
    assert_eq!(h.vcpus, 2);
    KvmVm::new(config(), DirtyTracking::Bitmap, Role::Destination)
        .map_err(|e| VmError::Guest(e.to_string()))
}

fn lazily(mode: RestoreMode) -> RestoreOptions {
    let mut o = RestoreOptions::default();
    o.mode = mode;
    o
}

/// A live snapshot of a writing guest, in `dir`.
fn saved(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("vm.snap");
    let mut src = KvmVm::new(config(), DirtyTracking::Bitmap, Role::Source).unwrap();
    src.start().unwrap();
    wait_for_passes(&src, 1);
    let s = snapshot::save(&mut src, &path, &SnapshotOptions::default()).unwrap();
    assert!(s.working_set_pages > 0, "{s:?}");
    path
}

#[test]
fn a_kvm_guest_restored_lazily_runs_before_its_memory_is_in_with_its_stamps_clean() {
    if !require_kvm("kvm lazy restore") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferry-kvm-lazy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = saved(&dir);
    for mode in [RestoreMode::Lazy, RestoreMode::LazyWorkingSet] {
        let (mut dst, restoring) = snapshot::restore_as(&path, &mut build, &lazily(mode)).unwrap();
        assert!(dst.is_running(), "{mode:?}");
        let r = restoring.finish(&mut dst).unwrap();
        assert!(r.digest_match, "{mode:?}: {r:?}");
        assert_eq!(r.fault_path, "userfaultfd", "{mode:?}");
        let from = passes(&dst);
        wait_for_passes(&dst, from + 2);
        let check = MemstressProbe.read(&dst).unwrap();
        assert_eq!(check.errors, 0, "{mode:?}: the restored guest's stamps");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_page_stops_a_lazily_restored_kvm_guest_naming_the_page() {
    if !require_kvm("kvm lazy restore of a damaged file") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferry-kvm-lazy-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = saved(&dir);
    // A page of the guest's data, half-way through memory: the vCPUs
    // write every one of them, so they touch this one too.
    let mut bytes = std::fs::read(&path).unwrap();
    let page = 4096;
    let frames = (config().workload.vcpus as u64 * config().workload.bytes_per_vcpu) / page;
    let gfn = (frames / 2..)
        .find(|g| {
            let at = (page * (1 + g)) as usize;
            bytes[at..at + page as usize].iter().any(|&b| b != 0)
        })
        .unwrap();
    let offset = page * (1 + gfn);
    bytes[offset as usize + 8] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    for mode in [RestoreMode::Lazy, RestoreMode::LazyWorkingSet] {
        let (mut dst, restoring) = snapshot::restore_as(&path, &mut build, &lazily(mode)).unwrap();
        let e = restoring.finish(&mut dst).unwrap_err();
        assert!(
            matches!(e, SnapshotError::DamagedPage { gfn: g, offset: o, .. } if g == gfn && o == offset),
            "{mode:?}: {e}"
        );
        assert!(!dst.is_running(), "{mode:?}: the guest is stopped");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The working set a snapshot records is what the guest wrote, not what
/// the VMM wrote at boot (the fill in every page): a guest that writes a
/// hot set of a twentieth of its memory records that twentieth (and the
/// few pages of its own records), one that only reads records almost
/// nothing.
///
/// The snapshot sees what the guest wrote while it ran, so the whole hot
/// set is owed only when every vCPU walked all of it inside the save (a
/// loaded host may run a vCPU for less than a pass in a short save: CI
/// once saw 926 of 2048 pages). The hot set is small, so that a pass is
/// short beside the save. The passes are counted from when the dirty log
/// came on (the save's progress tells of its full pass then; counted
/// from before the save, a guest whose pages are already dirty walks
/// many passes before the log is on, which once passed for a walk and
/// failed with 312 of 408) up to the pause (each save stops the guest).
/// A save in which some vCPU did not end a pass begun with the log on
/// checks only that nothing outside the hot set was recorded, and the
/// guest runs on for another save.
#[test]
fn the_working_set_is_the_guest_s_writes_not_the_boot_s() {
    if !require_kvm("kvm snapshot") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferry-kvm-ws-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = config();
    c.workload.hot_percent = 5;
    c.workload.fill = ferry_memstress::Fill::Text;
    let hot = 2 * c.workload.hot_pages_per_vcpu();
    let all = 2 * c.workload.pages_per_vcpu();
    let mut stop = SnapshotOptions::default();
    stop.stop = true;
    for writing in [true, false] {
        let path = dir.join(format!("{writing}.snap"));
        let mut src = KvmVm::new(c.clone(), DirtyTracking::Bitmap, Role::Source).unwrap();
        src.start().unwrap();
        wait_for_passes(&src, 1);
        if !writing {
            ferry_memstress::set_write_percent(src.ram(), 2, 0).unwrap();
            // Every vCPU's pass that began with writes on is over.
            wait_for_passes(&src, passes(&src) + 2);
        }
        let mut checked_whole = false;
        for attempt in 0..20 {
            if attempt > 0 {
                src.start().unwrap();
            }
            let at_log_start = PassesAtLogStart {
                ram: Arc::clone(src.ram()),
                vcpus: src.vcpus(),
                passes: Mutex::new(None),
            };
            let steering = Steering {
                progress: &at_log_start,
                tunables: ferry_engine::Tunables::shared(),
            };
            let began = std::time::Instant::now();
            let s = snapshot::save_steered(&mut src, &path, &stop, &steering).unwrap();
            let took = began.elapsed();
            assert!(!src.is_running(), "the save stopped the guest");
            let ws = s.working_set_pages;
            // Its records, shadow arrays and page tables are written too.
            let extra = 64;
            if !writing {
                assert!(ws < extra, "a guest that only reads recorded {ws} pages");
                checked_whole = true;
                break;
            }
            assert!(
                ws < hot + extra,
                "{ws} pages for a hot set of {hot} of {all}"
            );
            // The pass after the one under way when the log came on began
            // with the log on: once it has ended, every hot page was
            // written with the log on.
            let before = at_log_start.passes.lock().unwrap().take();
            let before = before.expect("the save told of its full pass");
            let walked = before
                .iter()
                .zip(vcpu_passes(&src))
                .all(|(b, a)| a >= b + 2);
            // Rounds older than the window before the pause do not count.
            if walked && took < snapshot::WORKING_SET_WINDOW {
                assert!(
                    ws >= hot,
                    "{ws} pages for a hot set of {hot} of {all}, every vCPU having walked it"
                );
                checked_whole = true;
                break;
            }
        }
        assert!(
            checked_whole,
            "in 20 saves the guest never walked its hot set inside one"
        );
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn vcpu_passes(vm: &KvmVm) -> Vec<u64> {
    passes_of(vm.ram(), vm.vcpus())
}

fn passes_of(ram: &GuestRam, vcpus: u32) -> Vec<u64> {
    read_progress(ram, vcpus)
        .unwrap()
        .iter()
        .map(|p| p.passes)
        .collect()
}

/// Each vCPU's passes when a save's dirty log came on (its full pass
/// began).
struct PassesAtLogStart {
    ram: Arc<GuestRam>,
    vcpus: u32,
    passes: Mutex<Option<Vec<u64>>>,
}

impl Progress for PassesAtLogStart {
    fn phase(&self, phase: Phase) {
        let mut passes = self.passes.lock().unwrap();
        if phase == Phase::FullPass && passes.is_none() {
            *passes = Some(passes_of(&self.ram, self.vcpus));
        }
    }
}

#[test]
fn the_quota_holds_a_kvm_guest_that_outruns_the_file_until_the_pause_fits() {
    if !require_kvm("kvm snapshot under the quota") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferry-kvm-snap-quota-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("quota.snap");
    // 2 x 4 MiB rewritten at 32 MiB/s each, against a file capped at 16
    // MiB/s: the guest dirties faster than the file takes it. (Flat out,
    // a vCPU rewrites its 4 MiB in a burst between two of the quota
    // meter's ticks, which no meter that polls the ring can hold.)
    let small = || {
        let mut c = config();
        c.workload.bytes_per_vcpu = 4 << 20;
        c.workload.rate_limit_mib_s = Some(32);
        c
    };
    // The ring: the kvm VM meters each vCPU's writes only through it.
    let ring = DirtyTracking::Ring { entries: 4096 };
    let mut src = KvmVm::new(small(), ring, Role::Source).unwrap();
    src.start().unwrap();
    wait_for_passes(&src, 1);
    let tunables = ferry_engine::Tunables::shared();
    tunables.set_bandwidth_bytes_per_sec(16 << 20);
    let steering = Steering {
        progress: &ferry_engine::NoProgress,
        tunables,
    };
    let mut opts = SnapshotOptions::default();
    opts.converge = Some(ferry_engine::choices::ConvergeMode::Quota);
    let s = snapshot::save_steered(&mut src, &path, &opts, &steering).unwrap();
    let timeline = &s.convergence.throttle_timeline;
    assert!(
        timeline.iter().any(|t| t.quota_bytes.is_some()),
        "the quota never engaged: {s:?}"
    );
    assert!(s.converged, "the pause never fitted: {s:?}");
    // Held to the end, the guest ran free a moment before the pause.
    assert!(s.settle_ms > 0.0, "{s:?}");

    // The quota is lifted: the vCPUs' sleeps stop growing (one in flight
    // at the lift may still end) while the guest walks on.
    assert!(src.is_running());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let before = src.throttle_sleeps();
        wait_for_passes(&src, passes(&src) + 2);
        if src.throttle_sleeps() == before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the vCPUs still sleep: {before:?}"
        );
    }
    assert_eq!(MemstressProbe.read(&src).unwrap().errors, 0);

    // What the held guest left is a snapshot like any other.
    let mut build = |_: &StreamHeader| {
        KvmVm::new(small(), DirtyTracking::Bitmap, Role::Destination)
            .map_err(|e| VmError::Guest(e.to_string()))
    };
    let (mut restored, restoring) =
        snapshot::restore_as(&path, &mut build, &RestoreOptions::default()).unwrap();
    let r = restoring.finish(&mut restored).unwrap();
    assert!(r.digest_match && r.started, "{r:?}");
    wait_for_passes(&restored, passes(&restored) + 1);
    assert_eq!(MemstressProbe.read(&restored).unwrap().errors, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
