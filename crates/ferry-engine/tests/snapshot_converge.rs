//! Convergence during a live snapshot: the test guest rewrites all of its
//! 4 MiB every few milliseconds, and the file is capped at 8 MiB/s (the
//! bandwidth cap paces a snapshot's writes), so with a 1 ms target the
//! rounds never fit on their own. Under `auto` the snapshot throttles the
//! guest as a migration would, and lifts the throttle when it ends (done,
//! failed or cancelled); under `none` it leaves the guest alone; a policy
//! the VM does not serve is refused before a file is written.

mod common;

use common::{check, running_source, wait_for_passes, TestVm};
use ferry_engine::choices::ConvergeMode;
use ferry_engine::error::SnapshotError;
use ferry_engine::snapshot::{self, RestoreOptions, SnapshotOptions, Steering};
use ferry_engine::{NoProgress, Tunables};
use ferry_vm::{Backing, Vm};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A directory of its own, removed with it.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "ferry-snapshot-converge-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Tunables whose cap makes the file slower than the guest writes.
fn slow_file() -> Arc<Tunables> {
    let t = Tunables::shared();
    t.set_bandwidth_bytes_per_sec(8 << 20);
    t
}

fn busy(converge: ConvergeMode, max_rounds: u32) -> SnapshotOptions {
    let mut o = SnapshotOptions::default();
    o.converge = Some(converge);
    o.max_downtime = Duration::from_millis(1);
    o.max_rounds = max_rounds;
    o
}

fn save(
    vm: &mut TestVm,
    path: &std::path::Path,
    opts: &SnapshotOptions,
    tunables: &Arc<Tunables>,
) -> Result<snapshot::SnapshotSummary, SnapshotError> {
    let steering = Steering {
        progress: &NoProgress,
        tunables: Arc::clone(tunables),
    };
    snapshot::save_steered(vm, path, opts, &steering)
}

/// The guest's checks go on clean: it runs, and nothing holds it.
fn runs_on_clean(vm: &TestVm) {
    assert!(vm.is_running(), "the guest must run on");
    assert_eq!(
        vm.throttle_handle().load(Ordering::Relaxed),
        0,
        "the guest must be left unthrottled"
    );
    let at = check(vm).progress;
    wait_for_passes(vm, at + 2);
    assert_eq!(check(vm).errors, 0);
}

#[test]
fn auto_throttles_a_guest_that_outruns_the_file_and_lifts_it_at_the_end() {
    let dir = Scratch::new("auto");
    let path = dir.0.join("vm.snap");
    let mut vm = running_source();
    let tunables = slow_file();
    // Rounds of half a second (4 MiB at 8 MiB/s): 12 of them hold at
    // least four of auto-converge's periods of a second, so two steps.
    let s = save(&mut vm, &path, &busy(ConvergeMode::Auto, 12), &tunables).unwrap();
    assert_eq!(s.convergence.converge, Some(ConvergeMode::Auto), "{s:?}");
    let steps: Vec<u8> = s
        .convergence
        .throttle_timeline
        .iter()
        .map(|t| t.percent)
        .collect();
    assert!(steps.len() >= 2, "{steps:?}");
    assert_eq!(steps[0], 20, "{steps:?}");
    assert!(steps.windows(2).all(|w| w[1] == w[0] + 10), "{steps:?}");
    // The settle counts what the guest dirties as it runs free, and the
    // test VM meters no vCPU: its guest is paused as it stands.
    assert_eq!(s.settle_ms, 0.0, "{s:?}");
    runs_on_clean(&vm);

    // What the throttled guest left is a snapshot like any other.
    let mut build = |h: &ferry_engine::vmm::StreamHeader| {
        TestVm::new(&TestVm::config_from(h, Backing::Anonymous)?)
    };
    let (mut restored, restoring) =
        snapshot::restore_as(&path, &mut build, &RestoreOptions::default()).unwrap();
    let r = restoring.finish(&mut restored).unwrap();
    assert!(r.digest_match && r.started, "{r:?}");
    wait_for_passes(&restored, check(&restored).progress + 1);
    assert_eq!(check(&restored).errors, 0);
}

#[test]
fn none_leaves_the_guest_alone_and_never_raises_the_vm_s_downtime_target() {
    let dir = Scratch::new("none");
    let path = dir.0.join("vm.snap");
    let mut vm = running_source();
    let tunables = slow_file();
    let target = tunables.downtime_target();
    let s = save(&mut vm, &path, &busy(ConvergeMode::None, 4), &tunables).unwrap();
    assert_eq!(s.convergence.converge, Some(ConvergeMode::None));
    assert!(s.convergence.throttle_timeline.is_empty(), "{s:?}");
    // A migration's stall raises the downtime target; a snapshot's stall
    // has nothing to engage, and the VM's target is not the snapshot's.
    assert!(s.convergence.escalations.is_empty(), "{s:?}");
    assert_eq!(tunables.downtime_target(), target);
    assert_eq!(s.settle_ms, 0.0);
    // Nothing fitted: it ran to the round cap, then paused.
    assert!(!s.converged, "{s:?}");
    assert_eq!(s.rounds.len(), 5, "{s:?}");
    runs_on_clean(&vm);
}

#[test]
fn a_policy_the_vm_does_not_serve_is_refused_before_a_file_is_written() {
    let dir = Scratch::new("refused");
    let path = dir.0.join("vm.snap");
    let mut vm = running_source();
    let err = save(&mut vm, &path, &busy(ConvergeMode::Quota, 4), &slow_file()).unwrap_err();
    assert!(matches!(err, SnapshotError::Converge(_)), "{err:?}");
    let why = ferry_vm::error_chain(&err);
    assert!(
        why.contains("the quota policy needs a per-vCPU dirty meter"),
        "{why}"
    );
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        0,
        "no file, partial or whole"
    );
    runs_on_clean(&vm);
}

#[test]
fn a_cancelled_snapshot_lifts_the_throttle_it_set() {
    let dir = Scratch::new("cancel");
    let path = dir.0.join("vm.snap");
    let mut vm = running_source();
    let tunables = slow_file();
    let throttle = vm.throttle_handle();
    let canceller = Arc::clone(&tunables);
    let cancel = std::thread::spawn(move || {
        // Cancel as soon as auto has engaged; bounded so nothing hangs.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while throttle.load(Ordering::Relaxed) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        canceller.cancel();
    });
    let opts = busy(ConvergeMode::Auto, 1000);
    let err = save(&mut vm, &path, &opts, &tunables).unwrap_err();
    cancel.join().unwrap();
    assert!(matches!(err, SnapshotError::Cancelled { .. }), "{err:?}");
    assert!(!path.exists());
    runs_on_clean(&vm);
}
