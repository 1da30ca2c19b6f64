//! Convergence: a guest that dirties its memory faster than the link is
//! throttled under `auto` and not under `none`; a stall escalates; a failed
//! migration leaves the source unthrottled. The test guest rewrites all of
//! its 4 MiB every few milliseconds, so with a 1 ms downtime target precopy
//! never fits on its own and every round is a full one.

mod common;
use common::*;

use ferry_engine::choices::ConvergeMode;
use ferry_engine::EscalationKind;
use ferry_engine::{migrate, MigrationError, NoProgress, Outcome, PrecopyOptions};
use ferry_vm::Vm;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn busy(converge: ConvergeMode, max_rounds: u32) -> PrecopyOptions {
    let opts = {
        let mut o = probed();
        o.converge = Some(converge);
        o
    };
    opts.tunables.set_downtime_target(Duration::from_millis(1));
    opts.tunables.set_max_rounds(max_rounds);
    opts.tunables.set_bandwidth_bytes_per_sec(64 << 20);
    opts
}

#[test]
fn auto_throttles_every_vcpu_in_steps_and_the_migration_verifies() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    // QEMU's period is at least a second: rounds of half a second (4 MiB
    // at 8 MiB/s), 12 of them, make at least four periods, two steps.
    let opts = busy(ConvergeMode::Auto, 12);
    opts.tunables.set_bandwidth_bytes_per_sec(8 << 20);
    let s = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    dest.join().unwrap().unwrap();
    assert_eq!(s.status, Outcome::Completed, "{s:?}");
    assert!(
        s.digest_match && s.guest.guest_mismatches == Some(0),
        "{s:?}"
    );
    assert_eq!(
        s.convergence.converge,
        Some(ferry_engine::choices::ConvergeMode::Auto)
    );
    let steps: Vec<u8> = s
        .convergence
        .throttle_timeline
        .iter()
        .map(|t| t.percent)
        .collect();
    assert!(steps.len() >= 2, "{steps:?}");
    assert_eq!(steps[0], 20, "{steps:?}");
    assert!(steps.windows(2).all(|w| w[1] == w[0] + 10), "{steps:?}");
}

#[test]
fn none_never_throttles_and_a_stall_raises_the_downtime_target_up_to_the_cap() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let mut opts = busy(ConvergeMode::None, 24);
    opts.max_downtime = Some(Duration::from_millis(2));
    let s = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    dest.join().unwrap().unwrap();
    assert!(
        s.digest_match && s.guest.guest_mismatches == Some(0),
        "{s:?}"
    );
    assert!(s.convergence.throttle_timeline.is_empty(), "{s:?}");
    assert!(
        !s.convergence.escalations.is_empty(),
        "no escalation: {s:?}"
    );
    for e in &s.convergence.escalations {
        assert!(
            matches!(e.what, EscalationKind::DowntimeRaised { .. }),
            "{e:?}"
        );
    }
    // 1 → 1.5 → 2 (the cap): never further.
    assert!(
        s.convergence.escalations.len() <= 2,
        "{:?}",
        s.convergence.escalations
    );
    let target = opts.tunables.downtime_target();
    assert!(target > Duration::from_millis(1) && target <= Duration::from_millis(2));
}

#[test]
fn a_cancelled_migration_lifts_the_throttle_it_set() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let opts = busy(ConvergeMode::Auto, 10_000);
    let tunables = std::sync::Arc::clone(&opts.tunables);
    let throttle = src.throttle_handle();
    let cancel = std::thread::spawn(move || {
        // Cancel as soon as auto has engaged (round 2, well before the
        // guest converges at 99%); bounded so nothing hangs.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while throttle.load(Ordering::Relaxed) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        tunables.cancel();
    });
    let err = migrate(&mut src, &to, &opts, &NoProgress).unwrap_err();
    cancel.join().unwrap();
    assert!(matches!(err, MigrationError::Cancelled), "{err}");
    let _ = dest.join().unwrap();
    assert!(src.is_running(), "the source must keep running");
    let after = src.throttle_handle().load(Ordering::Relaxed);
    assert_eq!(after, 0, "the source must be left unthrottled");
}

#[test]
fn a_migration_that_cannot_switch_over_in_time_gives_up_and_the_source_runs_on() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    // Never converges: no policy, a 1 ms target, a round cap it never hits.
    let opts = {
        let mut o = busy(ConvergeMode::None, 1_000_000);
        o.give_up_after = Some(Duration::from_millis(300));
        o
    };
    let err = migrate(&mut src, &to, &opts, &NoProgress).unwrap_err();
    assert!(
        matches!(err, MigrationError::GaveUp { .. }),
        "{}",
        err.chain()
    );
    assert!(
        err.chain()
            .starts_with("gave up after 0.3 s: migration cancelled"),
        "{}",
        err.chain()
    );
    assert!(dest.join().unwrap().is_err());
    assert!(src.is_running(), "the source VM keeps running");
    let before = check(&src);
    wait_for_passes(&src, before.progress + 1);
    assert_eq!(check(&src).errors, 0);
}

#[test]
fn no_policy_named_is_the_best_the_vm_serves() {
    // The test VM has no per-vCPU dirty meter: the default is auto.
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let s = migrate(&mut src, &to, &probed(), &NoProgress).unwrap();
    dest.join().unwrap().unwrap();
    assert_eq!(
        s.convergence.converge,
        Some(ferry_engine::choices::ConvergeMode::Auto)
    );
    // A policy it cannot serve is refused before anything starts: no
    // destination is even dialled.
    let mut src = running_source();
    let nowhere = ferry_engine::TcpDialer("127.0.0.1:1".into());
    let opts = {
        let mut o = probed();
        o.converge = Some(ConvergeMode::Quota);
        o
    };
    let err = migrate(&mut src, &nowhere, &opts, &NoProgress)
        .unwrap_err()
        .chain();
    assert!(
        err.contains("the quota policy needs a per-vCPU dirty meter"),
        "{err}"
    );
    assert!(src.is_running());
}

#[test]
fn a_vm_is_predicted_from_its_own_dirty_logs() {
    use ferry_engine::converge::{predict_vm, sample_dirtying, PredictSettings};
    let mut src = running_source();
    let ram = src.ram().size();
    let busy = sample_dirtying(&mut src, Duration::from_millis(300)).unwrap();
    assert_eq!(busy.dirty_bytes_per_sec.len(), 1);
    assert!(busy.dirty_bytes_per_sec[0] > 0.0, "{busy:?}");
    assert!(
        busy.working_set_bytes[0] > 0 && busy.working_set_bytes[0] <= ram,
        "{busy:?}"
    );
    assert!(!src.logging, "the sample stops the logs it started");
    let settings = PredictSettings {
        link_bytes_per_sec: Some(64.0 * 1024.0 * 1024.0),
        downtime_target: Duration::from_millis(300),
        max_rounds: 30,
        harvest_within_rounds: false,
    };
    let p = predict_vm(&mut src, &busy, &settings).unwrap();
    let names: Vec<ConvergeMode> = p.policies.iter().map(|f| f.policy).collect();
    assert_eq!(
        names,
        [ConvergeMode::None, ConvergeMode::Auto],
        "the policies this VM serves"
    );
    assert!(names.contains(&p.recommended) && p.link_known);
    // A guest that stops writing dirties nothing in its sample.
    src.stop_writing_after(0);
    std::thread::sleep(Duration::from_millis(20));
    let idle = sample_dirtying(&mut src, Duration::from_millis(200)).unwrap();
    assert_eq!(idle.dirty_bytes_per_sec, [0.0], "{idle:?}");
    assert!(src.is_running());
}

/// The test VM with only what the contract requires: no throttle, no
/// meter, no log of its own (every write goes through GuestRam).
struct Bare(TestVm);

impl Vm for Bare {
    fn vmm_id(&self) -> &str {
        self.0.vmm_id()
    }
    fn ram(&self) -> &std::sync::Arc<ferry_vm::GuestRam> {
        self.0.ram()
    }
    fn start(&mut self) -> Result<(), ferry_vm::VmError> {
        self.0.start()
    }
    fn pause(&mut self) -> Result<(), ferry_vm::VmError> {
        self.0.pause()
    }
    fn is_running(&self) -> bool {
        self.0.is_running()
    }
    /// What the destination's test factory builds from.
    fn vmm_config(&self) -> serde_json::Value {
        self.0.vmm_config()
    }
}

#[test]
fn a_policy_the_vm_does_not_declare_is_refused_and_the_default_is_none() {
    // Its guest writes everything through GuestRam: it has no log of its
    // own to report a vCPU's writes.
    let mut vm = TestVm::new(&config()).unwrap();
    vm.hardware_log = false;
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    let mut src = Bare(vm);
    for mode in [
        ConvergeMode::Auto,
        ConvergeMode::Quota,
        ConvergeMode::DirtyLimit,
    ] {
        let opts = {
            let mut o = probed();
            o.converge = Some(mode);
            o
        };
        // Refused before it dials: no receiver is needed.
        let to = ferry_engine::TcpDialer("127.0.0.1:9".into());
        match migrate(&mut src, &to, &opts, &NoProgress) {
            Err(MigrationError::Refused(why)) => {
                assert!(why.contains("declares none"), "{mode}: {why}");
                let needs = match mode {
                    ConvergeMode::Auto => "a time throttle",
                    _ => "a per-vCPU dirty meter",
                };
                assert!(why.contains(needs), "{mode}: {why}");
            }
            other => panic!("{mode}: {other:?}"),
        }
        assert!(src.is_running(), "the source runs on");
    }
    assert_eq!(
        ferry_engine::converge::choose(None, &mut src).unwrap(),
        ConvergeMode::None
    );
    // A destination that keeps vCPU state refuses a VM that keeps none,
    // before any memory moves, and the source runs on.
    let (to, dest) = spawn_receiver(quick_receive());
    let e = migrate(&mut src, &to, &probed(), &NoProgress).unwrap_err();
    assert!(e.to_string().contains("keeps no vCPU state"), "{e}");
    assert!(dest.join().unwrap().is_err());
    assert!(src.is_running(), "the source runs on");
    // Between two bare VMs it migrates with no policy: every write went
    // through GuestRam.
    let listener = ferry_engine::listen("127.0.0.1:0").unwrap();
    let to = ferry_engine::TcpDialer(listener.local_addr().unwrap().to_string());
    let dest = std::thread::spawn(move || {
        let incoming = ferry_engine::await_migration(&listener, None).unwrap();
        let mut create = |h: &ferry_engine::vmm::StreamHeader| {
            let vm = TestVm::new(&TestVm::config_from(h, ferry_vm::Backing::Anonymous)?)?;
            Ok(Box::new(Bare(vm)) as Box<dyn Vm>)
        };
        ferry_engine::receive(incoming, &listener, &mut create, &quick_receive()).unwrap()
    });
    let s = migrate(&mut src, &to, &probed(), &NoProgress).unwrap();
    let (moved, received) = dest.join().unwrap();
    assert!(s.digest_match && received.digest_match, "{s:?}");
    assert_eq!(s.guest.guest_mismatches, Some(0), "{s:?}");
    assert_eq!(s.convergence.converge, Some(ConvergeMode::None));
    assert!(moved.is_running() && !src.is_running());
}
