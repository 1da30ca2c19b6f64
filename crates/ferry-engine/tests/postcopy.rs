//! Postcopy and hybrid migrations between two test VMs in one process, over
//! TCP loopback. The test guest reads and writes through `GuestRam`, so on
//! the destination every touch of a page that has not arrived blocks in the
//! kernel (userfaultfd) until the pager fetches it: the same path a kvm vCPU
//! takes. No assertion depends on how long anything takes.

mod common;

use common::{
    churning_source, probed, quick_receive, running_source, spawn_receiver, uffd_available,
};
use ferry_engine::{
    migrate, migrate_accounted, EscalationKind, MigrationError, Mode, NoProgress, Outcome,
    PrecopyOptions, RoundKind,
};
use ferry_vm::Vm;
use std::time::Duration;

fn postcopy_opts(mode: Mode) -> PrecopyOptions {
    {
        let mut o = probed();
        o.mode = mode;
        o.batch_pages = 16;
        o
    }
}

#[test]
fn postcopy_moves_a_running_guest_at_once_and_fetches_its_pages() {
    if !uffd_available("postcopy") {
        return;
    }
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.prefetch = 1;
        o
    });
    let mut src = running_source();
    let summary = migrate(&mut src, &to, &postcopy_opts(Mode::Postcopy), &NoProgress).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();

    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && summary.digest_checked && dsum.digest_match);
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    assert_eq!(summary.mode, Mode::Postcopy);
    let kinds: Vec<_> = summary.memory.rounds.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [RoundKind::Postcopy], "no precopy round");
    let ours = summary
        .postcopy
        .as_ref()
        .expect("the source's postcopy report");
    assert_eq!(ours.missing_pages, src.ram().pages());
    let report = dsum.postcopy.as_ref().expect("postcopy report");
    assert!(
        report.page_requests > 0,
        "the guest touched pages first: {report:?}"
    );
    assert_eq!(ours.page_requests, report.page_requests);
    assert!(report.block_ms > 0.0 && ours.postcopy_ms > 0.0);
    assert!(!src.is_running(), "the source never resumes after postcopy");
    assert!(dvm.is_running());
    assert!(dsum.passes_after > Some(0));
}

#[test]
fn hybrid_switches_after_its_rounds() {
    if !uffd_available("hybrid") {
        return;
    }
    // A zero downtime target and a device that dirties pages every round:
    // precopy cannot converge, however the guest thread is scheduled.
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = churning_source();
    let opts = postcopy_opts(Mode::Hybrid {
        after_rounds: 2,
        on_stall: false,
    });
    opts.tunables.set_downtime_target(Duration::ZERO);
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (_dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match);
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    assert!(!summary.converged, "{summary:?}");
    let kinds: Vec<_> = summary.memory.rounds.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        [RoundKind::Full, RoundKind::Dirty, RoundKind::Postcopy]
    );
    let missing = summary.postcopy.as_ref().expect("a switch").missing_pages;
    assert!(missing > 0 && missing < src.ram().pages(), "{missing}");
    assert_eq!(dsum.postcopy.unwrap().missing_pages, missing);
}

#[test]
fn a_hybrid_on_stall_switches_when_precopy_stops_shrinking() {
    if !uffd_available("hybrid on stall") {
        return;
    }
    // As above, precopy cannot converge.
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = churning_source();
    let opts = {
        let mut o = postcopy_opts(Mode::Hybrid {
            after_rounds: u32::MAX,
            on_stall: true,
        });
        o.converge = Some(ferry_engine::choices::ConvergeMode::None);
        o
    };
    opts.tunables.set_downtime_target(Duration::ZERO);
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (_dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match);
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    assert!(!summary.converged, "{summary:?}");
    let kinds: Vec<_> = summary.memory.rounds.iter().map(|r| r.kind).collect();
    assert_eq!(kinds.last(), Some(&RoundKind::Postcopy), "{kinds:?}");
    let switched = summary
        .convergence
        .escalations
        .iter()
        .find(|e| e.what == EscalationKind::StallPostcopy)
        .expect("the stall is recorded");
    // The stall, not the round cap, switched.
    assert!(
        switched.round + 2 < opts.tunables.max_rounds(),
        "{switched:?}"
    );
    assert!(dsum.postcopy.is_some());
}

#[test]
fn a_hybrid_that_converges_finishes_as_precopy() {
    if !uffd_available("hybrid converging") {
        return;
    }
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let opts = postcopy_opts(Mode::Hybrid {
        after_rounds: 5,
        on_stall: false,
    });
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (_dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert_eq!(summary.memory.rounds.last().unwrap().kind, RoundKind::Final);
    assert!(dsum.postcopy.is_none());
    assert_eq!(summary.guest.guest_mismatches, Some(0));
}

#[test]
fn postcopy_refuses_verify_before_resume_and_the_source_runs_on() {
    if !uffd_available("postcopy refusal") {
        return;
    }
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let opts = {
        let mut o = postcopy_opts(Mode::Postcopy);
        o.verify_before_resume = true;
        o
    };
    let err = migrate(&mut src, &to, &opts, &NoProgress).unwrap_err();
    assert!(
        err.to_string().contains("cannot verify the digest before"),
        "{err}"
    );
    assert!(src.is_running());
    assert!(dest.join().unwrap().is_err());
}

/// A destination that waits `recover` for a reconnection, behind a relay
/// that cuts every connection `cuts` times, each 64 KiB into the push; the
/// dialer to use (through the relay) and a running source.
fn behind_cuts(
    recover: Duration,
    cuts: u32,
) -> (
    std::thread::JoinHandle<common::Received>,
    common::relay::Relay,
    ferry_engine::TcpDialer,
    common::TestVm,
) {
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.stall_timeout = Duration::from_secs(5);
        o.recover_timeout = recover;
        o
    });
    let relay = common::relay::Relay::start(
        to.0.clone(),
        common::relay::Fault::CutAfter {
            bytes: 64 << 10,
            times: cuts,
        },
    );
    let dialer = ferry_engine::TcpDialer(relay.addr.clone());
    (dest, relay, dialer, running_source())
}

/// A postcopy through a relay that cuts every connection `cuts` times,
/// each 64 KiB into the push: both sides must recover each time.
fn postcopy_through_cuts(cuts: u32) {
    let (dest, relay, dialer, mut src) = behind_cuts(Duration::from_secs(30), cuts);
    let opts = {
        let mut o = postcopy_opts(Mode::Postcopy);
        o.stall_timeout = Duration::from_secs(5);
        o.recover_timeout = Duration::from_secs(30);
        o
    };
    let summary = migrate(&mut src, &dialer, &opts, &NoProgress).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(relay.cuts(), cuts);
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match, "{summary:?}");
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    let ours = summary
        .postcopy
        .as_ref()
        .expect("the source's postcopy report");
    assert_eq!(ours.recoveries, cuts, "{summary:?}");
    let report = dsum.postcopy.expect("postcopy report");
    assert_eq!(report.recoveries, cuts, "{report:?}");
    assert!(dvm.is_running());
    assert!(!src.is_running());
}

#[test]
fn a_cut_mid_postcopy_is_recovered() {
    if uffd_available("postcopy recovery") {
        postcopy_through_cuts(1);
    }
}

#[test]
fn a_second_cut_is_recovered_the_same_way() {
    if uffd_available("postcopy double failure") {
        postcopy_through_cuts(2);
    }
}

#[test]
fn a_postcopy_whose_retries_ran_out_is_resumed_later() {
    if !uffd_available("postcopy resume") {
        return;
    }
    let (dest, _relay, dialer, mut src) = behind_cuts(Duration::from_secs(30), 1);
    // The source's own retries run out at once.
    let opts = {
        let mut o = postcopy_opts(Mode::Postcopy);
        o.stall_timeout = Duration::from_secs(5);
        o.recover_timeout = Duration::ZERO;
        o
    };
    let token = match migrate(&mut src, &dialer, &opts, &NoProgress).unwrap_err() {
        MigrationError::Postcopy { resume, .. } => resume,
        e => panic!("expected a postcopy failure, got {e}"),
    };
    assert!(!src.is_running(), "paused, with every page");
    // Later, an operator resumes it with the token.
    let opts = {
        let mut o = opts;
        o.recover_timeout = Duration::from_secs(10);
        o
    };
    let (summary, result) =
        ferry_engine::resume_postcopy(&mut src, &dialer, &opts, &token, &NoProgress);
    result.unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match);
    // The resumed source never paused in this attempt: the destination's
    // guest says whether anything was lost.
    assert_eq!(dsum.guest_at_resume.map(|c| c.errors), Some(0), "{dsum:?}");
    assert_eq!(dsum.mismatches_after, Some(0), "{dsum:?}");
    assert_eq!(dsum.postcopy.unwrap().recoveries, 1);
    assert!(dvm.is_running());
    // A running VM has nothing to resume.
    let mut other = running_source();
    let (_, refused) =
        ferry_engine::resume_postcopy(&mut other, &dialer, &opts, &token, &NoProgress);
    assert!(refused
        .unwrap_err()
        .to_string()
        .contains("only the paused source"));
}

#[test]
fn a_source_that_never_returns_leaves_ranges_the_destination_names() {
    if !uffd_available("postcopy source death") {
        return;
    }
    // The source gives up at once (as a source that died would never come
    // back); the destination waits its recovery timeout, then says which
    // pages only the source had.
    let (dest, _relay, dialer, mut src) = behind_cuts(Duration::from_secs(1), 1);
    let opts = {
        let mut o = postcopy_opts(Mode::Postcopy);
        o.recover_timeout = Duration::ZERO;
        o
    };
    let err = migrate(&mut src, &dialer, &opts, &NoProgress).unwrap_err();
    assert!(matches!(err, MigrationError::Postcopy { .. }), "{err}");
    assert!(!src.is_running());
    let dest_err = dest.join().unwrap().err().expect("the destination fails");
    match &dest_err {
        MigrationError::PostcopyIncomplete {
            missing, ranges, ..
        } => {
            assert!(*missing > 0);
            assert!(ranges.starts_with("frames 0x"), "{ranges}");
        }
        e => panic!("expected the missing ranges, got {e}"),
    }
    let chain = dest_err.chain();
    assert!(chain.contains("did not reconnect within 1 s"), "{chain}");
}

#[test]
fn a_cut_mid_postcopy_keeps_the_source_paused_with_its_pages() {
    if !uffd_available("postcopy cut") {
        return;
    }
    // The destination dies (its stall timeout) once the relay stops
    // forwarding partway through the push.
    // Recovery off on both sides: the failure itself is what is tested.
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.stall_timeout = Duration::from_secs(2);
        o.recover_timeout = Duration::ZERO;
        o
    });
    let relay =
        common::relay::Relay::start(to.0.clone(), common::relay::Fault::StallAfter(64 << 10));
    let mut src = running_source();
    let opts = {
        let mut o = postcopy_opts(Mode::Postcopy);
        o.stall_timeout = Duration::from_secs(2);
        o.recover_timeout = Duration::ZERO;
        o
    };
    let dialer = ferry_engine::TcpDialer(relay.addr.clone());
    let (summary, result) = migrate_accounted(&mut src, &dialer, &opts, &NoProgress);
    let err = result.unwrap_err();
    match &err {
        MigrationError::Postcopy {
            missing, unsent, ..
        } => {
            assert_eq!(*missing, src.ram().pages());
            assert!(unsent <= missing, "{unsent}");
        }
        e => panic!("expected a postcopy failure, got {e}"),
    }
    assert!(err.to_string().contains("stays paused"), "{err}");
    assert_eq!(summary.status, Outcome::Failed);
    assert!(
        !src.is_running(),
        "the source must not resume after postcopy began"
    );
    relay.release();
    let dest_err = dest
        .join()
        .unwrap()
        .err()
        .expect("the destination fails too");
    assert!(
        matches!(dest_err, MigrationError::PostcopyIncomplete { missing, .. } if missing > 0),
        "{dest_err}"
    );
}

/// QMP's `migrate-start-postcopy`: a hybrid that would run its rounds out
/// switches at the end of the round under way when asked, and says so.
#[test]
fn a_hybrid_switches_when_an_operator_asks() {
    if !uffd_available("hybrid on request") {
        return;
    }
    let (to, dest) = spawn_receiver(quick_receive());
    // A guest with a device that dirties pages between any two harvests:
    // with a zero downtime target precopy never finishes on its own, so
    // only the operator's request can end it.
    let mut src = churning_source();
    let opts = postcopy_opts(Mode::Hybrid {
        after_rounds: u32::MAX,
        on_stall: false,
    });
    opts.tunables.set_downtime_target(Duration::ZERO);
    // Asked before the full pass ends: the switch follows it.
    opts.tunables.request_postcopy();
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (_dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match);
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    let kinds: Vec<_> = summary.memory.rounds.iter().map(|r| r.kind).collect();
    assert!(!summary.converged, "{summary:?}");
    assert_eq!(kinds, [RoundKind::Full, RoundKind::Postcopy], "{kinds:?}");
    assert!(
        summary
            .convergence
            .operator_changes
            .iter()
            .any(|c| c.what == EscalationKind::OperatorPostcopy),
        "{:?}",
        summary.convergence.operator_changes
    );
}

/// A precopy ignores the request: it has no priority connection to serve
/// pages on, and finishes as precopy.
#[test]
fn a_precopy_ignores_a_postcopy_request() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let opts = postcopy_opts(Mode::Precopy);
    opts.tunables.request_postcopy();
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let _ = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert_eq!(summary.mode, Mode::Precopy);
    assert!(summary
        .memory
        .rounds
        .iter()
        .all(|r| r.kind != RoundKind::Postcopy));
}

/// A destination whose guest RAM is hugetlb: postcopy places whole 2 MiB
/// pages. SKIP where the host has no free huge pages or no userfaultfd.
fn huge_destination(test: &str) -> bool {
    if !uffd_available(test) {
        return false;
    }
    match ferry_vm::GuestRam::new(&[8 << 20], ferry_vm::Backing::Hugetlb) {
        Ok(_) => true,
        Err(e) => {
            ferry_vm::skip!("SKIP {test}: no free 2 MiB huge pages here ({e})");
            false
        }
    }
}

fn into_hugetlb(mode: Mode, handlers: usize) -> ferry_engine::MigrationSummary {
    let (to, dest) = common::spawn_receiver_on(
        {
            let mut o = quick_receive();
            o.fault_handlers = handlers;
            o
        },
        ferry_vm::Backing::Hugetlb,
    );
    let mut src = common::churning_source();
    let opts = postcopy_opts(mode);
    opts.tunables.set_downtime_target(Duration::ZERO);
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match, "{summary:?}");
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    assert!(dvm.is_running());
    assert!(dsum.passes_after > Some(0));
    let kinds: Vec<_> = summary.memory.rounds.iter().map(|r| r.kind).collect();
    println!(
        "{kinds:?}: source {:?}; destination {:?}",
        summary.postcopy, dsum.postcopy
    );
    if kinds.contains(&RoundKind::Postcopy) {
        let report = dsum.postcopy.as_ref().expect("postcopy report");
        assert_eq!(report.fault_path, "userfaultfd");
    }
    summary
}

#[test]
fn postcopy_places_whole_huge_pages_on_hugetlb() {
    if !huge_destination("postcopy onto hugetlb") {
        return;
    }
    let summary = into_hugetlb(Mode::Postcopy, 2);
    let requests = summary.postcopy.as_ref().map_or(0, |p| p.page_requests);
    assert!(requests > 0, "the guest touched pages first");
}

/// A hybrid's precopy leaves huge pages partly stale: the switchover
/// drops each whole and asks again for its current pages.
#[test]
fn a_hybrid_onto_hugetlb_drops_and_refills_whole_huge_pages() {
    if !huge_destination("hybrid onto hugetlb") {
        return;
    }
    let summary = into_hugetlb(
        Mode::Hybrid {
            after_rounds: 2,
            on_stall: false,
        },
        1,
    );
    assert!(!summary.converged, "{summary:?}");
    let kinds: Vec<_> = summary.memory.rounds.iter().map(|r| r.kind).collect();
    assert_eq!(kinds.last(), Some(&RoundKind::Postcopy), "{kinds:?}");
}

/// Two handler threads spinning on the userfaultfd serve the faults as
/// one sleeping handler does: every page placed once, nothing lost.
#[test]
fn busy_polling_handlers_serve_a_postcopy() {
    if !uffd_available("busy-polling handlers") {
        return;
    }
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.prefetch = 1;
        o.fault_handlers = 2;
        o.fault_busy_poll = true;
        o.vcpu_fault_exits = false;
        o
    });
    let mut src = running_source();
    let summary = migrate(&mut src, &to, &postcopy_opts(Mode::Postcopy), &NoProgress).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match);
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    let report = dsum.postcopy.as_ref().expect("postcopy report");
    assert_eq!(report.fault_path, "userfaultfd");
    assert!(report.page_requests > 0, "{report:?}");
    assert!(dvm.is_running());
}

/// A source whose memory has a hole between its regions.
fn source_with_a_hole() -> common::TestVm {
    let config = common::TestConfig {
        hole_bytes: 6 << 20,
        ..common::config()
    };
    let mut vm = common::TestVm::new(&config).unwrap();
    vm.start().unwrap();
    common::wait_for_passes(&vm, 1);
    vm
}

#[test]
fn memory_with_a_hole_moves_in_every_mode_and_the_hole_never_travels() {
    let uffd = uffd_available("postcopy with a hole");
    for mode in [Mode::Precopy, Mode::Postcopy, "hybrid".parse().unwrap()] {
        if mode != Mode::Precopy && !uffd {
            continue;
        }
        let (to, dest) = spawn_receiver({
            let mut o = quick_receive();
            o.prefetch = 8;
            o
        });
        let mut src = source_with_a_hole();
        let ram_pages = src.ram().frames().count();
        assert!(ram_pages < src.ram().pages(), "the layout has a hole");
        let opts = {
            let mut o = postcopy_opts(mode);
            o.max_downtime = None;
            o
        };
        let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
        let (dvm, dsum) = dest.join().unwrap().unwrap();
        assert_eq!(summary.status, Outcome::Completed, "{mode}: {summary:?}");
        assert!(summary.digest_match && dsum.digest_match, "{mode}");
        assert_eq!(dvm.ram().slots(), src.ram().slots(), "{mode}");
        assert_eq!(dvm.ram().holes(), vec![(ferry_vm::Gfn(512), 1536)]);
        // Every page sent lies in a region: the full pass sends each RAM
        // page once, and no round sends more than there is RAM.
        let first = &summary.memory.rounds[0];
        assert!(first.pages <= ram_pages, "{mode}: {first:?}");
        assert!(dsum.passes_after > Some(0), "{mode}");
    }
}

#[test]
fn delta_resends_with_a_mode_that_may_switch_are_refused_before_anything_starts() {
    let mut src = running_source();
    let nowhere = ferry_engine::TcpDialer("127.0.0.1:1".into());
    let opts = {
        let mut o = postcopy_opts("hybrid".parse().unwrap());
        o.delta_cache_bytes = 1 << 20;
        o
    };
    let err = migrate(&mut src, &nowhere, &opts, &NoProgress)
        .unwrap_err()
        .chain();
    assert!(
        err.contains("delta re-sends cannot be used with a hybrid migration"),
        "{err}"
    );
    assert!(src.is_running());
}
