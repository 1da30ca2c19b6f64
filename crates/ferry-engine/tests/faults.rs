//! A cut at any point of a migration: every connection drops when a chosen
//! byte of the first data connection goes through, from its first frames to
//! past the last page. Whatever the phase, nothing panics or hangs, and each
//! end is left as promised:
//!
//! ```text
//!  precopy fails    the source runs on; the destination runs no guest
//!  postcopy fails   (recovery off) the source stays paused with its pages;
//!                   the destination's copy is paused, missing pages named
//!  either completes the digest matches and the guest counted no mismatch
//! ```

mod common;

use common::relay::{Fault, Relay};
use common::{probed, quick_receive, running_source, spawn_receiver};
use ferry_engine::wire::FrameKind;
use ferry_engine::{migrate_accounted, MigrationError, Mode, NoProgress, Outcome, TcpDialer};
use ferry_vm::Vm;
use std::time::Duration;

/// Where the cut lands: bytes into the first data connection (the last is
/// past any test migration, so it never fires).
const CUTS: [u64; 5] = [64, 16 << 10, 512 << 10, 4 << 20, 1 << 40];

fn cut_at(bytes: u64, mode: Mode) {
    fault_at(Fault::CutAfter { bytes, times: 1 }, mode);
}

/// A stall (nothing forwarded, every socket held open) once `bytes` went
/// through: both ends must notice within the stall timeout.
fn stall_at(bytes: u64, mode: Mode) {
    fault_at(Fault::StallAfter(bytes), mode);
}

fn fault_at(fault: Fault, mode: Mode) {
    let stall = Duration::from_secs(2);
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.stall_timeout = stall;
        o.recover_timeout = Duration::ZERO;
        o
    });
    let relay = Relay::start(to.0.clone(), fault);
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.mode = mode;
        o.batch_pages = 16;
        o.stall_timeout = stall;
        o.recover_timeout = Duration::ZERO;
        o
    };
    let dialer = TcpDialer(relay.addr.clone());
    let (summary, result) = migrate_accounted(&mut src, &dialer, &opts, &NoProgress);
    let received = dest.join().expect("the destination does not panic");
    let faulted = relay.cuts() == 1 || relay.has_stalled();
    // Whatever stalled may go now: each end has given up on its own.
    relay.release();
    let context = format!("{mode} {fault:?} (took effect: {faulted})");
    match &result {
        Ok(()) => println!("{context}: completed"),
        Err(e) => println!("{context}: {e}"),
    }
    match result {
        Ok(()) => {
            assert_eq!(summary.status, Outcome::Completed, "{context}");
            assert!(summary.digest_match, "{context}");
            assert_eq!(summary.guest.guest_mismatches, Some(0), "{context}");
            let (dvm, _) = received.unwrap_or_else(|e| panic!("{context}: destination: {e}"));
            assert!(dvm.is_running(), "{context}");
            assert!(!src.is_running(), "{context}: both copies run");
        }
        Err(e) => {
            assert_eq!(summary.status, Outcome::Failed, "{context}");
            assert!(faulted, "{context}: failed without a fault: {e}");
            let dest_err = match received {
                Ok(_) => panic!("{context}: the destination completed, the source failed: {e}"),
                Err(d) => d,
            };
            match mode {
                Mode::Precopy => {
                    assert!(src.is_running(), "{context}: the source must run on: {e}");
                }
                _ if matches!(e, MigrationError::Postcopy { .. }) => {
                    assert!(!src.is_running(), "{context}: resumed after postcopy: {e}");
                    assert!(
                        matches!(dest_err, MigrationError::PostcopyIncomplete { .. }),
                        "{context}: {dest_err}"
                    );
                }
                // Cut before the switchover: a precopy failure.
                _ => assert!(src.is_running(), "{context}: {e}"),
            }
        }
    }
}

#[test]
fn a_cut_anywhere_in_a_precopy_leaves_both_ends_as_promised() {
    for bytes in CUTS {
        cut_at(bytes, Mode::Precopy);
    }
}

#[test]
fn a_stall_anywhere_in_a_precopy_or_postcopy_ends_both_ends_within_the_timeout() {
    let postcopy = {
        let ram = ferry_vm::GuestRam::new(&[2 << 20], ferry_vm::Backing::Anonymous).unwrap();
        ferry_vm::uffd::Placer::register_for_faults(&ram).is_ok()
    };
    for bytes in CUTS {
        let started = std::time::Instant::now();
        stall_at(bytes, Mode::Precopy);
        if postcopy {
            stall_at(bytes, Mode::Postcopy);
        }
        // Each end gives up 2 s into a stall; a hang would never get here.
        println!(
            "stalls at byte {bytes}: {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    if !postcopy {
        ferry_vm::skip!("SKIP: userfaultfd is unavailable here; postcopy stalls not run");
    }
}

#[test]
fn a_cut_anywhere_in_a_postcopy_leaves_both_ends_as_promised() {
    let ram = ferry_vm::GuestRam::new(&[2 << 20], ferry_vm::Backing::Anonymous).unwrap();
    if let Err(e) = ferry_vm::uffd::Placer::register_for_faults(&ram) {
        ferry_vm::skip!("SKIP: userfaultfd is unavailable here ({e}); postcopy cuts not run");
        return;
    }
    for bytes in CUTS {
        cut_at(bytes, Mode::Postcopy);
        cut_at(
            bytes,
            Mode::Hybrid {
                after_rounds: 1,
                on_stall: false,
            },
        );
    }
}

/// Where a cut inside the switchover or the digest exchange leaves a
/// precopy: who runs the guest afterwards.
#[derive(Debug, PartialEq)]
enum After {
    /// The migration failed; only the source runs.
    SourceRuns,
    /// The migration completed; only the destination runs.
    DestinationRuns,
    /// The Commit was lost: both copies paused and verified, none runs.
    BothPaused,
}

fn cut_at_frame(kind: FrameKind, to_source: bool, strict: bool) -> After {
    let stall = Duration::from_secs(2);
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.stall_timeout = stall;
        o.verify_before_resume = strict;
        o
    });
    let fault = Fault::CutAtFrame {
        kind: kind as u8,
        to_source,
    };
    let relay = Relay::start(to.0.clone(), fault);
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.batch_pages = 16;
        o.stall_timeout = stall;
        o.verify_before_resume = strict;
        o
    };
    let dialer = TcpDialer(relay.addr.clone());
    let (summary, result) = migrate_accounted(&mut src, &dialer, &opts, &NoProgress);
    let received = dest.join().expect("the destination does not panic");
    let way = if to_source {
        "destination's"
    } else {
        "source's"
    };
    let context = format!("cut before the {way} {}", kind.name());
    assert_eq!(relay.cuts(), 1, "{context}: the frame never went by");
    let dest_runs = match &received {
        Ok((dvm, _)) => dvm.is_running(),
        Err(e) => {
            println!("{context}: destination: {e}");
            false
        }
    };
    if let Err(e) = &result {
        println!("{context}: source: {e}");
    }
    let after = match (src.is_running(), dest_runs) {
        (true, false) => After::SourceRuns,
        (false, true) => After::DestinationRuns,
        (false, false) => After::BothPaused,
        (true, true) => panic!("{context}: two copies of the guest run"),
    };
    match after {
        After::SourceRuns => {
            assert!(result.is_err(), "{context}");
            assert_eq!(summary.status, Outcome::Failed, "{context}");
        }
        After::DestinationRuns => {
            assert_eq!(summary.status, Outcome::Completed, "{context}");
            assert!(summary.digest_match, "{context}");
        }
        After::BothPaused => {
            // The source committed; it must say that it could not tell.
            assert!(summary.error.is_some(), "{context}: {summary:?}");
            // The destination holds its paused, verified copy for an
            // operator, and says why.
            let Ok((_, dsum)) = &received else {
                panic!("{context}: the destination dropped its copy");
            };
            assert_eq!(dsum.status, Outcome::Held, "{context}");
            assert!(dsum.digest_match, "{context}");
            assert!(
                dsum.held
                    .as_deref()
                    .is_some_and(|h| h.contains("did not confirm the commit")),
                "{context}: {dsum:?}"
            );
        }
    }
    after
}

#[test]
fn a_cut_in_the_switchover_or_the_digest_exchange_never_leaves_two_copies_running() {
    use FrameKind::*;
    let cases = [
        // (frame, from the destination, strict, who runs after)
        (VcpuState, false, false, After::SourceRuns),
        (Switchover, false, false, After::SourceRuns),
        (Resumed, true, false, After::SourceRuns),
        (Digest, false, false, After::SourceRuns),
        // The verdict lost on its way back: the source resumes, and the
        // destination, which never gets the Commit, pauses its copy.
        (Verified, true, false, After::SourceRuns),
        (Verified, true, true, After::SourceRuns),
        // The Commit lost: the source keeps its promise to stay paused.
        (Commit, false, false, After::BothPaused),
        (Report, true, false, After::DestinationRuns),
    ];
    for (kind, to_source, strict, want) in cases {
        let got = cut_at_frame(kind, to_source, strict);
        assert_eq!(got, want, "cut before {} (strict {strict})", kind.name());
    }
}
