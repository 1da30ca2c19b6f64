//! Releases that interoperate: the newest wire version between two new
//! ends, the previous one when a peer offers only that (a relay rewrites
//! the preamble, so that each end meets a wire-5 peer), the version
//! actually spoken in both summaries, and capabilities and blockers that
//! stop a migration before any memory moves, with the reason.
//!
//! A real binary of the previous release is checked against this one by
//! `scripts/interop.sh`; a stream recorded from it loads here in
//! `wire_fixtures.rs`.

mod common;

use common::relay::{Fault, Relay};
use common::{probed, quick_receive, running_source, spawn_receiver, spawn_receiver_with};
use ferry_engine::wire::{MIN_VERSION, VERSION};
use ferry_engine::{migrate, migrate_accounted, Mode, NoProgress, Outcome, TcpDialer};
use ferry_engine::{PrecopyOptions, ReceiveOptions};
use ferry_vm::{Backing, Blocker, Vm};

#[test]
fn two_new_ends_speak_the_newest_version_and_say_so() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let summary = migrate(&mut src, &to, &probed(), &NoProgress).unwrap();
    let (_vm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed);
    assert!(summary.digest_match && dsum.digest_match);
    assert_eq!(
        (summary.link.wire_version, dsum.wire_version),
        (VERSION, VERSION)
    );
}

#[test]
fn a_peer_of_the_previous_version_migrates_at_that_version_both_ways() {
    assert_eq!(
        MIN_VERSION,
        VERSION - 1,
        "a release speaks the one before it"
    );
    let (to, dest) = spawn_receiver(quick_receive());
    let relay = Relay::start(to.0.clone(), Fault::OfferVersion(MIN_VERSION));
    let mut src = running_source();
    // Compression and delta: capabilities a wire-5 peer has without saying.
    let opts = {
        let mut o = probed();
        o.connections = 2;
        o.compression = ferry_engine::choices::Compression::Auto;
        o.delta_cache_bytes = 1 << 20;
        o
    };
    let summary = migrate(&mut src, &TcpDialer(relay.addr.clone()), &opts, &NoProgress).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match);
    assert_eq!(summary.guest.guest_mismatches, Some(0));
    assert_eq!(dsum.mismatches_after, Some(0));
    assert!(dvm.is_running());
    assert_eq!(
        (summary.link.wire_version, dsum.wire_version),
        (MIN_VERSION, MIN_VERSION)
    );
}

/// A destination whose operator refuses postcopy.
fn no_postcopy() -> ReceiveOptions {
    {
        let mut o = quick_receive();
        o.blockers = vec![Blocker::postcopy("the operator said no postcopy here")];
        o
    }
}

fn hybrid() -> PrecopyOptions {
    {
        let mut o = probed();
        o.mode = Mode::Hybrid {
            after_rounds: 2,
            on_stall: false,
        };
        o
    }
}

#[test]
fn a_destination_that_refuses_postcopy_stops_a_hybrid_source_before_memory_moves() {
    let (to, dest) = spawn_receiver(no_postcopy());
    let mut src = running_source();
    let (summary, result) = migrate_accounted(&mut src, &to, &hybrid(), &NoProgress);
    let err = result.unwrap_err().to_string();
    assert_eq!(
        err,
        "the destination does not take postcopy: the operator said no postcopy here"
    );
    assert!(
        summary.memory.rounds.is_empty(),
        "no page was sent: {summary:?}"
    );
    assert!(src.is_running() && !src.logging, "the source runs on");
    let derr = dest
        .join()
        .unwrap()
        .err()
        .expect("the destination gives up");
    assert!(
        derr.to_string().contains("does not take postcopy"),
        "{derr}"
    );
}

#[test]
fn a_wire_5_source_that_may_switch_to_postcopy_is_told_why_it_is_refused() {
    let (to, dest) = spawn_receiver(no_postcopy());
    let relay = Relay::start(to.0.clone(), Fault::OfferVersion(MIN_VERSION));
    let mut src = running_source();
    let to = TcpDialer(relay.addr.clone());
    let (summary, result) = migrate_accounted(&mut src, &to, &hybrid(), &NoProgress);
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("does not take postcopy (the operator said no postcopy here)")
            && err.contains("(wire 5) may switch to it: migrate with --mode precopy"),
        "{err}"
    );
    assert!(summary.memory.rounds.is_empty(), "{summary:?}");
    assert!(src.is_running());
    assert!(dest.join().unwrap().is_err());
}

#[test]
fn a_destination_that_refuses_postcopy_still_takes_precopy() {
    let (to, dest) = spawn_receiver(no_postcopy());
    let mut src = running_source();
    let summary = migrate(&mut src, &to, &probed(), &NoProgress).unwrap();
    let (_vm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed);
    assert!(dsum.digest_match);
}

#[test]
fn a_blocked_source_vm_is_refused_before_it_connects() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let to = TcpDialer(listener.local_addr().unwrap().to_string());
    let mut src = running_source();
    src.blockers = vec![Blocker::migration("device vfio0 has no migration support")];
    let err = migrate(&mut src, &to, &probed(), &NoProgress).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the VM cannot migrate: device vfio0 has no migration support"
    );
    assert!(listener.accept().is_err(), "nothing connected");
    assert!(src.is_running());

    // A postcopy blocker stops only a mode that may switch to postcopy.
    src.blockers = vec![Blocker::postcopy("its disk is served by a slow host")];
    let err = migrate(&mut src, &to, &hybrid(), &NoProgress).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the VM cannot use postcopy (its disk is served by a slow host)"),
        "{err}"
    );
    assert!(listener.accept().is_err(), "nothing connected");
}

#[test]
fn a_blocked_destination_vm_refuses_with_its_reason() {
    let (to, dest) = spawn_receiver_with(quick_receive(), Backing::Anonymous, |vm| {
        vm.blockers = vec![Blocker::migration("its disk is not shared")];
    });
    let mut src = running_source();
    let (summary, result) = migrate_accounted(&mut src, &to, &probed(), &NoProgress);
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("the destination VM cannot take a migration: its disk is not shared"),
        "{err}"
    );
    assert!(summary.memory.rounds.is_empty());
    assert!(src.is_running());
    assert!(dest.join().unwrap().is_err());
}
