//! Snapshots of the engine's test VM: saved live while its guest walks
//! memory checking its own stamps, restored (eagerly, lazily, and lazily
//! with the working set first) into a new VM that walks on from where it
//! stopped. Damaged and truncated files are refused naming the part and
//! its offset, before the VM is built where the damage is outside the
//! pages; damage in a page is refused before a vCPU runs by an eager
//! restore, and stops a lazy one naming the page.

mod common;

use common::{check, churning_source, running_source, wait_for_passes, TestVm};
use ferry_engine::error::SnapshotError;
use ferry_engine::snapshot::{self, ProofAt, RestoreMode, RestoreOptions, SnapshotOptions};
use ferry_engine::vmm::StreamHeader;
use ferry_vm::{Backing, Vm, VmError, PAGE_SIZE};
use std::path::{Path, PathBuf};

/// A file in a directory of its own, removed with it.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("ferry-snapshot-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The factory a destination of the test VM uses.
fn build(h: &StreamHeader) -> Result<TestVm, VmError> {
    TestVm::new(&TestVm::config_from(h, Backing::Anonymous)?)
}

fn stopped() -> SnapshotOptions {
    let mut o = SnapshotOptions::default();
    o.stop = true;
    o
}

fn paused() -> RestoreOptions {
    let mut o = RestoreOptions::default();
    o.paused = true;
    o
}

fn in_mode(mode: RestoreMode, paused: bool) -> RestoreOptions {
    let mut o = RestoreOptions::default();
    o.mode = mode;
    o.paused = paused;
    o
}

const MODES: [RestoreMode; 3] = RestoreMode::ALL;

#[test]
fn a_restore_reads_none_of_the_snapshot_s_zero_pages() {
    let dir = Scratch::new("zeros");
    let path = dir.file("vm.snap");
    let mut vm = running_source();
    let s = snapshot::save(&mut vm, &path, &stopped()).unwrap();
    let total = common::config().total_pages();
    assert!(
        s.data_pages < total,
        "the test guest has free memory: {s:?}"
    );
    for mode in [RestoreMode::Lazy, RestoreMode::LazyWorkingSet] {
        // Paused: no touch races the fill.
        let (mut restored, restoring) =
            snapshot::restore_as(&path, &mut build, &in_mode(mode, true)).unwrap();
        let r = restoring.finish(&mut restored).unwrap();
        assert!(r.digest_match, "{mode:?}: {r:?}");
        // Lazily, one fill reader reads each frame of data once. With the
        // working set first, two readers race over it, and a window both
        // reach is read twice (placed once): at least the data, then.
        match mode {
            RestoreMode::Lazy => assert_eq!(r.pages_read, s.data_pages, "{r:?}"),
            _ => assert!(r.pages_read >= s.data_pages, "{mode:?}: {r:?}"),
        }
        // The zeros are the guest's: it walks on with its checks clean.
        restored.start().unwrap();
        wait_for_passes(&restored, check(&restored).progress + 2);
        assert_eq!(check(&restored).errors, 0, "{mode:?}");
    }
    // Eagerly too: the zeros are the fresh memory's, which the digest of
    // the whole restored memory proves.
    let (mut restored, restoring) =
        snapshot::restore_as(&path, &mut build, &in_mode(RestoreMode::Eager, true)).unwrap();
    let r = restoring.finish(&mut restored).unwrap();
    assert!(r.digest_match, "{r:?}");
    assert_eq!(r.pages_read, s.data_pages, "{r:?}");
}

#[test]
fn a_guest_saved_while_it_runs_restores_and_walks_on_with_its_checks_clean() {
    let dir = Scratch::new("live");
    let path = dir.file("vm.snap");
    let mut vm = running_source();
    // A zero target: the rounds go on to the cap while the guest writes,
    // so the pause has dirty pages to write and the rounds are exercised.
    let mut opts = SnapshotOptions::default();
    opts.max_downtime = std::time::Duration::ZERO;
    opts.max_rounds = 3;
    let s = snapshot::save(&mut vm, &path, &opts).unwrap();
    // At most 3 live rounds (fewer only if the guest wrote nothing in
    // one, as on a host that starves its thread), then the paused one.
    assert!((2..=4).contains(&s.rounds.len()), "{s:?}");
    assert_eq!(s.rounds[0].pages, common::config().total_pages(), "{s:?}");
    assert!(
        !s.stopped && vm.is_running(),
        "the guest runs on after the snapshot"
    );
    // Its proof was made after the pause, its memory frozen meanwhile,
    // while the guest walked on writing.
    assert_eq!(s.proof, expected_live_proof(), "{s:?}");
    // The source's guest keeps walking and checking.
    let at = check(&vm).progress;
    wait_for_passes(&vm, at + 2);
    assert_eq!(check(&vm).errors, 0);

    // A second live round means the first one's harvest found the
    // guest's writes (on a host that starves the guest thread, it may
    // write nothing in a round this short).
    if s.rounds.len() > 2 {
        assert!(
            s.working_set_pages > 0,
            "the guest wrote in its rounds: {s:?}"
        );
    }

    for mode in MODES {
        let (mut restored, restoring) =
            snapshot::restore_as(&path, &mut build, &in_mode(mode, false)).unwrap();
        // Lazily, the guest runs before its memory is in.
        assert!(restored.is_running(), "{mode:?}");
        let r = restoring.finish(&mut restored).unwrap();
        assert!(r.digest_match && r.started, "{mode:?}: {r:?}");
        assert_eq!(r.mode, mode.name());
        assert_eq!(r.working_set_pages, s.working_set_pages, "{mode:?}");
        // Every page of data came from the file (lazily, a page a touch
        // and the fill both read is read twice; the digest says it was
        // placed once).
        assert!(r.pages_read >= s.data_pages, "{mode:?}: {r:?}");
        let from = check(&restored).progress;
        wait_for_passes(&restored, from + 2);
        assert_eq!(
            check(&restored).errors,
            0,
            "{mode:?}: the restored guest's stamps"
        );
    }
}

#[test]
fn a_lazy_restore_serves_the_pages_a_paused_guest_is_read_for_on_demand() {
    let dir = Scratch::new("demand");
    let path = dir.file("vm.snap");
    let mut vm = running_source();
    snapshot::save(&mut vm, &path, &stopped()).unwrap();
    let at_snapshot = check(&vm);
    for mode in [RestoreMode::Lazy, RestoreMode::LazyWorkingSet] {
        let (mut restored, restoring) =
            snapshot::restore_as(&path, &mut build, &in_mode(mode, true)).unwrap();
        // Reading the guest's counters touches pages that may not be in
        // yet: each such touch waits for its page, and sees the saved data.
        assert_eq!(check(&restored), at_snapshot, "{mode:?}");
        restored.start().unwrap();
        let r = restoring.finish(&mut restored).unwrap();
        assert!(r.digest_match, "{mode:?}: {r:?}");
        assert_eq!(r.fault_path, "userfaultfd");
        wait_for_passes(&restored, at_snapshot.progress + 2);
        assert_eq!(check(&restored).errors, 0, "{mode:?}");
    }
}

/// A device that maps guest memory a second time with a userfaultfd of
/// its own (as a vhost-user backend maps it in its process) and touches a
/// page not yet in after a lazy restore is served from the file and woken:
/// it reads the snapshot's data. Its userfaultfd is registered before the
/// restore empties memory, so it never finds the hole; unserved, its touch
/// would wait for ever.
#[test]
fn a_device_that_maps_guest_memory_itself_is_served_by_a_lazy_restore() {
    if !common::uffd_available("a device's faults in a lazy restore") {
        return;
    }
    let dir = Scratch::new("device");
    let path = dir.file("vm.snap");
    // Large enough that the fill, in address order, takes a while to reach
    // the last page the device reads first.
    let config = common::TestConfig {
        data_bytes: 128 << 20,
        hole_bytes: 0,
        backing: Backing::Memfd,
    };
    let mut src = TestVm::new(&config).unwrap();
    src.start().unwrap();
    wait_for_passes(&src, 1);
    snapshot::save(&mut src, &path, &stopped()).unwrap();
    let last = ferry_vm::Gfn(src.ram().pages() - 1);
    let mut saved = vec![0u8; PAGE_SIZE];
    src.ram().read_pages(last, &mut saved).unwrap();
    assert_ne!(
        saved,
        vec![0u8; PAGE_SIZE],
        "the guest stamped its last page"
    );
    drop(src);

    for mode in [RestoreMode::Lazy, RestoreMode::LazyWorkingSet] {
        let mapping = std::sync::Arc::new(std::sync::Mutex::new(None));
        let mut factory = |h: &StreamHeader| {
            let mut vm = TestVm::new(&TestVm::config_from(h, Backing::Memfd)?)?;
            vm.device_mapping = Some(mapping.clone());
            Ok(vm)
        };
        let (mut restored, restoring) =
            snapshot::restore_as(&path, &mut factory, &in_mode(mode, true)).unwrap();
        let device: std::sync::Arc<ferry_vm::GuestRam> = mapping
            .lock()
            .unwrap()
            .clone()
            .expect("the engine asked for it");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut page = vec![0u8; PAGE_SIZE];
            let read = device.read_pages(last, &mut page).map(|()| page);
            let _ = tx.send(read);
        });
        let read = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{mode:?}: the device's touch was never served"))
            .unwrap();
        assert!(
            read == saved,
            "{mode:?}: the device read other data than the snapshot's"
        );
        let r = restoring.finish(&mut restored).unwrap();
        assert!(r.digest_match, "{mode:?}: {r:?}");
        println!("{mode:?}: the device's faults: {}", r.device_faults);
    }
}

#[test]
fn a_stopped_snapshot_holds_the_guest_exactly_where_it_stopped() {
    let dir = Scratch::new("stopped");
    let path = dir.file("vm.snap");
    let mut vm = running_source();
    let s = snapshot::save(&mut vm, &path, &stopped()).unwrap();
    assert!(s.stopped && !vm.is_running(), "{s:?}");
    // A guest left stopped is proved in the pause: nothing runs to wait.
    assert_eq!(s.proof, ProofAt::Pause, "{s:?}");
    // Zero pages take no space: the data slot's pages hold stamps, the
    // system slot is mostly zeros.
    assert!(s.bytes < s.file_bytes, "{s:?}");
    let (mut restored, r) = snapshot::restore_as(&path, &mut build, &paused()).unwrap();
    let r = r.finish(&mut restored).unwrap();
    assert!(!r.started && !restored.is_running());
    // The guest's counters and its walk position are the source's.
    assert_eq!(check(&restored), check(&vm));
    restored.start().unwrap();
    wait_for_passes(&restored, check(&vm).progress + 2);
    assert_eq!(check(&restored).errors, 0);
}

/// Where a running guest's proof is made: after the pause where this
/// kernel can freeze memory (userfaultfd's write-protect), else in it.
fn expected_live_proof() -> ProofAt {
    let ram = ferry_vm::GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap();
    match ferry_vm::uffd::Placer::freeze(&ram) {
        Ok(_) => ProofAt::Frozen,
        Err(e) => {
            eprintln!("SKIP: memory cannot be frozen here ({e}): the proof is made in the pause");
            ProofAt::Pause
        }
    }
}

#[test]
fn a_write_the_dirty_logs_missed_fails_the_snapshot_and_the_guest_runs_on() {
    // Either proof finds it: in the pause, or after it with memory frozen.
    for after_pause in [true, false] {
        let dir = Scratch::new("untracked");
        let path = dir.file("vm.snap");
        std::fs::write(&path, b"the previous snapshot").unwrap();
        let mut vm = running_source();
        vm.untracked_write_on_save = true;
        let mut opts = SnapshotOptions::default();
        opts.proof_after_pause = after_pause;
        let e = snapshot::save(&mut vm, &path, &opts).unwrap_err();
        assert!(matches!(e, SnapshotError::Untracked { .. }), "{e}");
        assert!(
            vm.is_running(),
            "a failed snapshot leaves the guest running"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"the previous snapshot");
        assert!(!dir.file("vm.snap.partial").exists());
    }
}

/// Where each part of a finished snapshot is: (name, offset, length).
/// The snapshot must have a working set: take it of a
/// [`churning_source`], whose device reports frames at every harvest
/// however little the guest thread ran.
fn parts(path: &Path) -> Vec<(&'static str, u64, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let (offset, len) = (u64_at(16), u64_at(24));
    let manifest: serde_json::Value =
        serde_json::from_slice(&bytes[offset as usize..(offset + len) as usize]).unwrap();
    let part = |name: &'static str, key: &str| {
        let p = &manifest[key];
        (
            name,
            p["offset"].as_u64().unwrap(),
            p["len"].as_u64().unwrap(),
        )
    };
    assert!(
        manifest["working_set"].is_object(),
        "a live snapshot records its working set"
    );
    vec![
        ("superblock", 0, 40),
        part("vCPU state", "vcpus"),
        part("sections", "sections"),
        part("page hashes", "page_hashes"),
        part("working set", "working_set"),
        ("manifest", offset, len),
    ]
}

/// Restores `path` (the guest left paused) in `mode`, counting the VMs the
/// factory built; a lazy restore that starts is finished, and must have
/// left its guest stopped.
fn restore_counting(path: &Path, mode: RestoreMode) -> (SnapshotError, u32) {
    let mut built = 0;
    let mut factory = |h: &StreamHeader| {
        built += 1;
        build(h)
    };
    let e = match snapshot::restore_as(path, &mut factory, &in_mode(mode, true)) {
        Ok((mut vm, restoring)) => {
            let e = match restoring.finish(&mut vm) {
                Ok(r) => panic!("{} restored {mode:?}: {r:?}", path.display()),
                Err(e) => e,
            };
            assert!(!vm.is_running(), "{mode:?}: nothing runs on from damage");
            e
        }
        Err(e) => e,
    };
    (e, built)
}

#[test]
fn a_flipped_bit_anywhere_but_the_pages_is_refused_before_the_vm_is_built() {
    let dir = Scratch::new("flips");
    let good = dir.file("good.snap");
    snapshot::save(&mut churning_source(), &good, &stopped()).unwrap();
    for (part, offset, len) in parts(&good) {
        let bad = dir.file("bad.snap");
        let mut bytes = std::fs::read(&good).unwrap();
        bytes[(offset + len / 2) as usize] ^= 0x10;
        std::fs::write(&bad, &bytes).unwrap();
        for mode in MODES {
            let (e, built) = restore_counting(&bad, mode);
            let text = e.to_string();
            assert!(
                matches!(&e, SnapshotError::Damaged { part: p, offset: o, .. } if *p == part && *o == offset),
                "{part}, {mode:?}: {text}"
            );
            assert!(text.contains(&format!("offset {offset}")), "{text}");
            assert_eq!(built, 0, "{part}: no VM is built from a damaged file");
        }
    }
}

#[test]
fn a_flipped_bit_in_a_page_is_refused_naming_the_page_and_nothing_runs_on_it() {
    let dir = Scratch::new("page");
    let good = dir.file("good.snap");
    let mut vm = running_source();
    snapshot::save(&mut vm, &good, &stopped()).unwrap();
    let config = common::config();
    for page in [0, 5, config.pages() - 1] {
        let gfn = config.data_gpa(page).gfn().0;
        let offset = PAGE_SIZE as u64 * (1 + gfn);
        let mut bytes = std::fs::read(&good).unwrap();
        bytes[offset as usize + 100] ^= 1;
        let bad = dir.file("bad.snap");
        std::fs::write(&bad, &bytes).unwrap();
        for mode in MODES {
            let (e, _) = restore_counting(&bad, mode);
            assert!(
                matches!(e, SnapshotError::DamagedPage { gfn: g, offset: o, .. } if g == gfn && o == offset),
                "page {page}, {mode:?}: {e}"
            );
        }
    }
}

#[test]
fn a_truncated_file_is_refused_naming_the_part_that_is_cut() {
    let dir = Scratch::new("cut");
    let good = dir.file("good.snap");
    snapshot::save(&mut churning_source(), &good, &stopped()).unwrap();
    let size = std::fs::metadata(&good).unwrap().len();
    let manifest = *parts(&good).last().unwrap();
    for (cut, part) in [
        (0, "not a snapshot"),
        (12, "superblock"),
        (3 * PAGE_SIZE as u64, "manifest"),
        (manifest.1 + 1, "manifest"),
        (size - 1, "manifest"),
    ] {
        let bad = dir.file("cut.snap");
        let bytes = std::fs::read(&good).unwrap();
        std::fs::write(&bad, &bytes[..cut as usize]).unwrap();
        let (e, built) = restore_counting(&bad, RestoreMode::LazyWorkingSet);
        match (&e, part) {
            (SnapshotError::NotASnapshot { .. }, "not a snapshot") => {}
            (
                SnapshotError::Truncated {
                    part: p, size: s, ..
                },
                _,
            ) if *p == part && *s == cut => {}
            _ => panic!("cut at {cut}: expected {part}, got {e}"),
        }
        assert_eq!(built, 0);
    }
}

#[test]
fn a_snapshot_of_another_vmm_is_refused_by_the_factory() {
    let dir = Scratch::new("other");
    let path = dir.file("vm.snap");
    snapshot::save(&mut running_source(), &path, &stopped()).unwrap();
    let mut other = |h: &StreamHeader| -> Result<TestVm, VmError> {
        Err(VmError::Guest(format!(
            "this VMM does not build {} VMs",
            h.vmm
        )))
    };
    let Err(e) = snapshot::restore_as(&path, &mut other, &RestoreOptions::default()) else {
        panic!("another VMM's snapshot restored");
    };
    assert!(e.to_string().contains("build the VM"), "{e}");
}

/// What a snapshot told its observer.
#[derive(Default)]
struct Seen {
    phases: std::sync::Mutex<Vec<ferry_engine::progress::Phase>>,
    rounds: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
}

impl ferry_engine::progress::Progress for Seen {
    fn phase(&self, phase: ferry_engine::progress::Phase) {
        self.phases.lock().unwrap().push(phase);
    }
    fn round_started(&self, _round: u32, _pages: u64) {
        self.rounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn pages_sent(&self, _pages: u64, bytes: u64) {
        self.bytes
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn a_steered_snapshot_reports_its_rounds_and_a_cancel_keeps_the_old_file() {
    use ferry_engine::progress::Phase;
    use std::sync::atomic::Ordering::Relaxed;
    let dir = Scratch::new("steered");
    let path = dir.file("vm.snap");
    let mut vm = churning_source();
    let mut opts = SnapshotOptions::default();
    opts.max_downtime = std::time::Duration::ZERO;
    opts.max_rounds = 2;
    let seen = Seen::default();
    let steering = snapshot::Steering {
        progress: &seen,
        tunables: ferry_engine::Tunables::shared(),
    };
    let s = snapshot::save_steered(&mut vm, &path, &opts, &steering).unwrap();
    // Every round, the paused one included, and every byte written.
    assert_eq!(seen.rounds.load(Relaxed), s.rounds.len() as u64, "{s:?}");
    let written: u64 = s.rounds.iter().map(|r| r.bytes).sum();
    assert_eq!(seen.bytes.load(Relaxed), written, "{s:?}");
    let phases = seen.phases.lock().unwrap().clone();
    assert_eq!(phases.first(), Some(&Phase::FullPass), "{phases:?}");
    assert!(phases.contains(&Phase::Switchover), "{phases:?}");
    assert!(vm.is_running());

    // A cancel ends the snapshot at its next chunk: the file written before
    // stands, no partial file is left, and the guest runs on.
    let before = std::fs::read(&path).unwrap();
    steering.tunables.cancel();
    let e = snapshot::save_steered(&mut vm, &path, &opts, &steering).unwrap_err();
    assert!(
        matches!(&e, SnapshotError::Cancelled { path: p } if *p == path),
        "{e}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1);
    assert!(
        vm.is_running(),
        "a cancelled snapshot leaves the guest running"
    );
    let at = check(&vm).progress;
    wait_for_passes(&vm, at + 1);
    assert_eq!(check(&vm).errors, 0);
}

#[test]
fn a_device_that_writes_guest_memory_while_saved_is_in_the_file() {
    // Saving the device flushes a word into a page the guest never
    // writes (a virtio device's used ring, a timer's tick count): the
    // pause must write that page after the device was saved.
    let at = ferry_vm::Gpa(0x3000);
    let spec = ferry_vm::SectionSpec::new("serial", 2, 1);
    let dir = Scratch::new("save-writes");
    let path = dir.file("vm.snap");
    let mut vm = running_source();
    vm.devices = common::Devices {
        specs: vec![spec.clone()],
        save_writes: Some((at, 0x5eed_f00d)),
        ..common::Devices::default()
    };
    let s = snapshot::save(&mut vm, &path, &SnapshotOptions::default()).unwrap();
    assert!(vm.is_running(), "{s:?}");
    for mode in MODES {
        let mut build_with_serial = |h: &StreamHeader| {
            let mut vm = build(h)?;
            vm.devices.specs = vec![spec.clone()];
            Ok(vm)
        };
        let (mut restored, restoring) =
            snapshot::restore_as(&path, &mut build_with_serial, &in_mode(mode, true)).unwrap();
        let r = restoring.finish(&mut restored).unwrap();
        assert!(r.digest_match, "{mode:?}: {r:?}");
        assert_eq!(
            restored.ram().load_u64(at).unwrap(),
            0x5eed_f00d,
            "{mode:?}"
        );
    }
}

#[test]
fn a_restore_s_first_touches_lead_the_next_snapshot_s_working_set() {
    let dir = Scratch::new("first-touches");
    let (path, again) = (dir.file("vm.snap"), dir.file("again.snap"));
    let mut vm = running_source();
    snapshot::save(&mut vm, &path, &stopped()).unwrap();
    drop(vm);
    let last = common::config().total_pages() - 1;
    // The fill goes in address order: a read of the last frame right after
    // the restore returns usually beats it, and is a touch to record. A
    // loaded host may let the fill win; then try again.
    let (mut restored, r) = (0..20)
        .find_map(|_| {
            let (mut restored, restoring) =
                snapshot::restore_as(&path, &mut build, &in_mode(RestoreMode::Lazy, true)).unwrap();
            let gpa = ferry_vm::Gfn(last).gpa();
            restored.ram().load_u64(gpa).unwrap();
            let r = restoring.finish(&mut restored).unwrap();
            (!r.first_touches.is_empty()).then_some((restored, r))
        })
        .expect("in 20 restores, a read beat the fill at least once");
    assert!(r.first_touches.contains(&last), "{:?}", r.first_touches);
    assert_eq!(r.first_touch_pages, r.first_touches.len() as u64);
    // The restored VM's next snapshot: its guest never ran, so its working
    // set is exactly what the restore saw it ask for, in that order.
    let mut opts = stopped();
    opts.first_touches = r.first_touches.clone();
    snapshot::save(&mut restored, &again, &opts).unwrap();
    let info = snapshot::inspect(&again).unwrap();
    let mut expected: Vec<u64> = Vec::new();
    for g in &r.first_touches {
        if !expected.contains(g) {
            expected.push(*g);
        }
    }
    let frames: Vec<u64> = info
        .working_set
        .iter()
        .flat_map(|&(g, n)| g..g + n)
        .collect();
    assert_eq!(frames, expected, "{info:?}");
    assert_eq!(info.working_set_pages, expected.len() as u64);
}

/// A stopped snapshot at `parent`, then three data pages changed while the
/// guest stays paused, then a diff of it at `diff`: the changed pages and
/// what they now hold.
fn diff_of_three_pages(
    vm: &mut TestVm,
    parent: &Path,
    diff: &Path,
) -> (snapshot::SnapshotSummary, Vec<(ferry_vm::Gpa, u64)>) {
    snapshot::save(vm, parent, &stopped()).unwrap();
    let cfg = common::config();
    let changed: Vec<_> = [3, 500, cfg.pages() - 1]
        .iter()
        .map(|&p| (cfg.data_gpa(p), 0xd1ff_0000 + p))
        .collect();
    for &(gpa, value) in &changed {
        vm.ram().store_u64(gpa, value).unwrap();
    }
    let mut opts = stopped();
    opts.parent = Some(parent.to_path_buf());
    (snapshot::save(vm, diff, &opts).unwrap(), changed)
}

#[test]
fn a_diff_snapshot_holds_only_what_changed_and_restores_through_its_parent() {
    let dir = Scratch::new("diff");
    let (parent, diff, merged) = (
        dir.file("parent.snap"),
        dir.file("diff.snap"),
        dir.file("merged.snap"),
    );
    let mut vm = running_source();
    let (d, changed) = diff_of_three_pages(&mut vm, &parent, &diff);
    assert_eq!(d.data_pages, 3, "{d:?}");
    let info = snapshot::inspect(&diff).unwrap();
    assert_eq!(info.frames_held, 3, "{info:?}");
    assert_eq!(info.parent.as_deref(), parent.to_str());
    let full = snapshot::inspect(&parent).unwrap();
    assert!(full.parent.is_none() && full.data_pages > 1000, "{full:?}");
    for mode in MODES {
        let (mut r, restoring) =
            snapshot::restore_as(&diff, &mut build, &in_mode(mode, true)).unwrap();
        let s = restoring.finish(&mut r).unwrap();
        assert!(s.digest_match, "{mode:?}: {s:?}");
        for &(gpa, value) in &changed {
            assert_eq!(r.ram().load_u64(gpa).unwrap(), value, "{mode:?}");
        }
        assert_eq!(check(&r), check(&vm), "{mode:?}");
    }
    // Flattened, it is the same memory in one file, its parent not needed.
    let m = snapshot::merge(&diff, &merged).unwrap();
    assert_eq!(m.chain, 2, "{m:?}");
    std::fs::remove_file(&parent).unwrap();
    let info = snapshot::inspect(&merged).unwrap();
    assert!(info.parent.is_none(), "{info:?}");
    assert_eq!(info.digest, d.digest);
    let (mut r, restoring) =
        snapshot::restore_as(&merged, &mut build, &in_mode(RestoreMode::Eager, true)).unwrap();
    assert!(restoring.finish(&mut r).unwrap().digest_match);
    assert_eq!(check(&r), check(&vm));
}

#[test]
fn a_diff_whose_parent_is_gone_damaged_or_another_is_refused() {
    let dir = Scratch::new("diff-damage");
    let (parent, diff) = (dir.file("parent.snap"), dir.file("diff.snap"));
    let mut vm = running_source();
    diff_of_three_pages(&mut vm, &parent, &diff);
    let kept = std::fs::read(&parent).unwrap();

    // Gone: refused naming the parent, before the VM is built.
    std::fs::remove_file(&parent).unwrap();
    for mode in MODES {
        let (e, built) = restore_counting(&diff, mode);
        assert_eq!(built, 0, "{mode:?}: {e}");
        assert!(e.to_string().contains("parent.snap"), "{mode:?}: {e}");
    }

    // Another snapshot in its place: refused, naming both digests.
    vm.ram().store_u64(common::config().data_gpa(7), 7).unwrap();
    snapshot::save(&mut vm, &parent, &stopped()).unwrap();
    let (e, built) = restore_counting(&diff, RestoreMode::Eager);
    assert_eq!(built, 0, "{e}");
    assert!(
        matches!(&e, SnapshotError::Parent { detail, .. } if detail.contains("not its parent")),
        "{e}"
    );

    // A flipped bit in a page the diff takes from its parent: refused
    // naming the parent's file and the page's offset in it.
    std::fs::write(&parent, &kept).unwrap();
    let page = common::config().data_gpa(10).gfn().0;
    let offset = 4096 + page * PAGE_SIZE as u64 + 100;
    let mut bytes = kept.clone();
    bytes[offset as usize] ^= 1;
    std::fs::write(&parent, &bytes).unwrap();
    for mode in MODES {
        let (e, _) = restore_counting(&diff, mode);
        let text = ferry_vm::error_chain(&e);
        assert!(
            text.contains("parent.snap") && text.contains(&format!("{page:#x}")),
            "{mode:?}: {text}"
        );
    }

    // A parent of another VM is refused at the save, naming what differs.
    let mut other = TestVm::new(&common::TestConfig {
        data_bytes: 8 << 20,
        ..common::config()
    })
    .unwrap();
    let mut opts = stopped();
    opts.parent = Some(parent.clone());
    std::fs::write(&parent, &kept).unwrap();
    let e = snapshot::save(&mut other, &dir.file("other.snap"), &opts).unwrap_err();
    assert!(e.to_string().contains("memory layout"), "{e}");
}

#[test]
fn a_live_diff_of_a_running_guest_restores_lazily_and_walks_on() {
    let dir = Scratch::new("diff-live");
    let (parent, diff) = (dir.file("parent.snap"), dir.file("diff.snap"));
    let mut vm = running_source();
    snapshot::save(&mut vm, &parent, &SnapshotOptions::default()).unwrap();
    let at = check(&vm).progress;
    wait_for_passes(&vm, at + 1);
    let mut opts = SnapshotOptions::default();
    opts.parent = Some(parent.clone());
    opts.stop = true;
    let d = snapshot::save(&mut vm, &diff, &opts).unwrap();
    let saved = check(&vm);
    let (mut r, restoring) = snapshot::restore_as(
        &diff,
        &mut build,
        &in_mode(RestoreMode::LazyWorkingSet, false),
    )
    .unwrap();
    let s = restoring.finish(&mut r).unwrap();
    assert!(s.digest_match, "{s:?} {d:?}");
    wait_for_passes(&r, saved.progress + 2);
    assert_eq!(check(&r).errors, 0);
}
