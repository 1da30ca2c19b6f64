//! End-to-end precopy between two test VMs in one process, over TCP
//! loopback. No assertion depends on how long anything takes.

mod common;

use common::{probed, quick_receive, running_source, spawn_receiver, spawn_receiver_with};
use ferry_engine::choices::ConvergeMode;
use ferry_engine::transport::{accept_channel, Channel};
use ferry_engine::wire::{FrameKind, Message};
use ferry_engine::{
    listen, migrate, ExpectedVm, MigrationError, NoProgress, Outcome, RoundKind, TcpDialer,
};
use ferry_vm::{Backing, Vm};
use std::time::Duration;

#[test]
fn precopy_over_tcp_moves_a_running_guest_with_matching_digest() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let summary = migrate(&mut src, &to, &probed(), &NoProgress).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();

    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match);
    assert!(summary.digest_checked);
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    assert_eq!(dsum.mismatches_after, Some(0));
    assert_eq!(summary.memory.rounds.first().unwrap().kind, RoundKind::Full);
    assert_eq!(summary.memory.rounds.last().unwrap().kind, RoundKind::Final);
    assert_eq!(summary.memory.rounds[0].pages, src.ram().pages());
    assert!(summary.memory.rounds[0].zero_pages > 0);
    assert!(
        summary.link.bytes_sent > dsum.bytes_received,
        "data and control"
    );
    assert_eq!((summary.link.connections, dsum.connections), (1, 1));
    assert_eq!(summary.link.wire_version, ferry_engine::wire::VERSION);
    assert!(!src.is_running(), "a committed source stays paused");
    assert!(!src.logging);
    assert!(dvm.is_running());
    serde_json::to_string(&summary).unwrap();
}

#[test]
fn tight_target_runs_dirty_rounds_and_strict_mode_verifies_first() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.verify_before_resume = true;
        o.batch_pages = 7;
        o
    };
    opts.tunables.set_downtime_target(Duration::ZERO);
    opts.tunables.set_max_rounds(4);
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (_dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.switchover.verify_before_resume);
    assert!(summary.digest_match);
    // The guest stayed paused until the verdict: no guest ran to yield to.
    assert_eq!(summary.switchover.digest_yield_ms, 0.0);
    assert_eq!(summary.guest.guest_mismatches, Some(0));
    assert!(summary.memory.rounds.len() >= 2 && summary.memory.rounds.len() <= 5);
    let sent: u64 = summary.memory.rounds.iter().map(|r| r.pages).sum();
    assert_eq!(sent, dsum.pages_received);
}

/// A strict migration to a destination that can hold its guest's outputs
/// (and what it did with them), with a source that writes an untracked
/// page at the pause when `untracked`. Returns the source's summary, and
/// the destination's result and events.
fn strict_to_a_gate(
    untracked: bool,
) -> (
    ferry_engine::MigrationSummary,
    bool,
    Option<Option<f64>>,
    Vec<String>,
) {
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let theirs = events.clone();
    let (to, dest) = spawn_receiver_with(quick_receive(), Backing::Anonymous, move |vm| {
        vm.output_gate = true;
        vm.events = theirs.clone();
    });
    let mut src = running_source();
    src.untracked_write_on_save = untracked;
    let opts = {
        let mut o = probed();
        o.verify_before_resume = true;
        o
    };
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let received = dest.join().unwrap();
    let held = received.as_ref().ok().map(|(_, s)| s.outputs_held_ms);
    let running = received.as_ref().is_ok_and(|(vm, _)| vm.is_running());
    let events = events.lock().unwrap().clone();
    (summary, running, held, events)
}

#[test]
fn a_strict_destination_that_holds_its_outputs_runs_the_guest_before_the_verdict() {
    let (summary, running, held, events) = strict_to_a_gate(false);
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.switchover.verify_before_resume && summary.digest_match);
    assert!(running);
    // Held, then started (before the verdict: a strict destination without
    // a gate starts only after it), then released at the Commit.
    assert_eq!(events, ["started", "hold", "start", "release", "completed"]);
    assert!(held.flatten().is_some(), "{held:?}");
    // Resumed before the verdict, on this host (loopback): the source let
    // the guest run before it hashed.
    assert!(summary.switchover.digest_yield_ms > 0.0, "{summary:?}");
    // The downtime ended at the early Resumed: the source did not wait for
    // a second one after its Commit.
    assert!(
        summary.downtime_ms > 0.0 && summary.error.is_none(),
        "{summary:?}"
    );
}

#[test]
fn a_held_guest_whose_digest_fails_never_releases_its_outputs() {
    let (summary, running, held, events) = strict_to_a_gate(true);
    assert_eq!(summary.status, Outcome::Failed);
    assert!(!summary.digest_match && summary.digest_checked);
    assert!(!running);
    assert_eq!(held, None, "the destination failed");
    assert!(events.contains(&"start".to_string()), "{events:?}");
    assert!(!events.contains(&"release".to_string()), "{events:?}");
}

#[test]
fn digest_mismatch_rolls_the_source_back() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    src.untracked_write_on_save = true;
    let summary = migrate(&mut src, &to, &probed(), &NoProgress).unwrap();
    assert_eq!(summary.status, Outcome::Failed);
    assert!(!summary.digest_match && summary.digest_checked);
    assert!(summary
        .error
        .as_deref()
        .unwrap()
        .contains("digest mismatch"));
    assert!(src.is_running(), "the source must run again");
    assert!(!src.logging);
    let err = dest.join().unwrap().err().unwrap();
    assert!(
        matches!(err, MigrationError::DigestMismatch { .. }),
        "{err}"
    );
}

#[test]
fn header_mismatch_is_reported_on_both_sides_and_the_source_keeps_running() {
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.expect = Some(ExpectedVm {
            memory_bytes: Some(1 << 30),
            ..ExpectedVm::default()
        });
        o
    });
    let mut src = running_source();
    let err = migrate(&mut src, &to, &probed(), &NoProgress).unwrap_err();
    let want = "destination has 1.0 GiB of guest memory, stream carries 6.0 MiB";
    assert_eq!(
        err.to_string(),
        format!("destination refused the stream: {want}")
    );
    assert!(src.is_running());
    let derr = dest.join().unwrap().err().unwrap();
    assert_eq!(derr.to_string(), want);
}

#[test]
fn cancel_keeps_the_source_running_and_tells_the_destination() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let opts = probed();
    opts.tunables.cancel();
    let err = migrate(&mut src, &to, &opts, &NoProgress).unwrap_err();
    assert!(matches!(err, MigrationError::Cancelled), "{err}");
    assert!(src.is_running() && !src.logging);
    let derr = dest.join().unwrap().err().unwrap().to_string();
    assert_eq!(derr, "source gave up the migration: migration cancelled");
}

/// A hand-made destination: takes the main channel and the header,
/// accepts, and takes one data connection. Returns both, framed.
fn fake_destination(listener: &std::net::TcpListener) -> (Channel, Channel) {
    let (mut ctl, _) = accept_channel(listener, None, &|_| Ok(())).unwrap();
    while ctl.read_frame().unwrap().0 != FrameKind::Header {}
    // It speaks the newest wire version, so it answers the capabilities
    // asked (none, for these sources).
    let accept = Message::Accept {
        verify_before_resume: false,
        answer: Some(Default::default()),
    };
    ctl.write_frame(accept.kind(), &[&accept.encode()]).unwrap();
    ctl.flush().unwrap();
    let (data, _) = accept_channel(listener, None, &|_| Ok(())).unwrap();
    (ctl, data)
}

#[test]
fn destination_vanishing_mid_stream_keeps_the_source_running() {
    let listener = listen("127.0.0.1:0").unwrap();
    let to = TcpDialer(listener.local_addr().unwrap().to_string());
    // A destination that accepts, reads a little, and dies.
    let dest = std::thread::spawn(move || {
        let (_ctl, mut data) = fake_destination(&listener);
        data.read_frame().unwrap();
    });
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.batch_pages = 16;
        o
    };
    let err = migrate(&mut src, &to, &opts, &NoProgress).unwrap_err();
    assert!(
        matches!(
            err,
            MigrationError::Stream(_) | MigrationError::Closed { .. }
        ),
        "{err}"
    );
    assert!(src.is_running() && !src.logging);
    dest.join().unwrap();
}

#[test]
fn garbage_is_not_a_migration_stream() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut raw = ferry_engine::connect(to.0.as_str()).unwrap();
    std::io::Write::write_all(&mut raw, b"SSH-2.0-OpenSSH_9.6\r\n").unwrap();
    let err = dest.join().unwrap().err().unwrap();
    assert!(
        err.to_string().starts_with("not a ferry migration stream"),
        "{err}"
    );
}

#[test]
fn losing_the_destination_before_its_verdict_resumes_the_source() {
    let listener = listen("127.0.0.1:0").unwrap();
    let to = TcpDialer(listener.local_addr().unwrap().to_string());
    // Takes everything, says Resumed, reads the digest, and vanishes.
    let dest = std::thread::spawn(move || {
        let (mut ctl, mut data) = fake_destination(&listener);
        let drain = std::thread::spawn(move || while let Ok(Some(_)) = data.read_frame_or_end() {});
        loop {
            match ctl.read_frame().unwrap().0 {
                FrameKind::Switchover => break,
                FrameKind::Heartbeat | FrameKind::VcpuState | FrameKind::Sections => {}
                k => panic!("unexpected {k}"),
            }
        }
        let resumed = Message::Resumed { resume_ns: 1 };
        ctl.write_frame(resumed.kind(), &[&resumed.encode()])
            .unwrap();
        ctl.flush().unwrap();
        while ctl.read_frame().unwrap().0 != FrameKind::Digest {}
        ctl.get_ref().shutdown_link(std::net::Shutdown::Both);
        drain.join().unwrap();
    });
    let mut src = running_source();
    let err = migrate(&mut src, &to, &probed(), &NoProgress).unwrap_err();
    assert!(matches!(err, MigrationError::Unconfirmed(_)), "{err}");
    assert!(src.is_running() && !src.logging);
    dest.join().unwrap();
}

#[test]
fn progress_observer_sees_every_page_and_phase() {
    use ferry_engine::{Phase, Progress, RoundStats};
    use std::sync::Mutex;
    #[derive(Default)]
    struct Seen {
        phases: Mutex<Vec<Phase>>,
        pages: Mutex<u64>,
        rounds: Mutex<u32>,
    }
    impl Progress for Seen {
        fn phase(&self, p: Phase) {
            self.phases.lock().unwrap().push(p);
        }
        fn pages_sent(&self, pages: u64, _bytes: u64) {
            *self.pages.lock().unwrap() += pages;
        }
        fn round_finished(&self, _: &RoundStats) {
            *self.rounds.lock().unwrap() += 1;
        }
    }
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let opts = probed();
    // A cap far above what this test sends exercises the token bucket only.
    opts.tunables.set_bandwidth_bytes_per_sec(1 << 40);
    let seen = Seen::default();
    let summary = migrate(&mut src, &to, &opts, &seen).unwrap();
    dest.join().unwrap().unwrap();
    let sent: u64 = summary.memory.rounds.iter().map(|r| r.pages).sum();
    assert_eq!(*seen.pages.lock().unwrap(), sent);
    assert_eq!(
        *seen.rounds.lock().unwrap() as usize,
        summary.memory.rounds.len()
    );
    let phases = seen.phases.lock().unwrap();
    assert_eq!(phases.first(), Some(&Phase::Handshake));
    assert!(phases.contains(&Phase::Switchover) && phases.contains(&Phase::Verifying));
    assert_eq!(phases.last(), Some(&Phase::Done));
}

#[test]
fn harvests_within_rounds_send_pages_dirtied_ahead_once() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    // A slow guest (a pass of its 1024 pages takes about 160 ms) that writes
    // three more passes, then stops: a page the engine wrongly took for
    // sent would never be written again, and the digest would disagree.
    src.throttle_handle()
        .store(99, std::sync::atomic::Ordering::Relaxed);
    src.stop_writing_after(3);
    let opts = {
        let mut o = probed();
        o.harvest_within_rounds = true;
        o.converge = Some(ConvergeMode::None);
        o.batch_pages = 16;
        o
    };
    // The 4 MiB full pass takes about a second: about ten policy
    // intervals, each with a harvest, while the guest writes.
    opts.tunables.set_bandwidth_bytes_per_sec(4 << 20);
    opts.tunables.set_max_rounds(3);
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (_dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match, "{summary:?}");
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    // The full pass left what it found ahead for round 1 (a page it
    // wrongly skipped for good would fail the digest), later rounds sent
    // theirs at once.
    let m = &summary.memory;
    assert!(m.deferred_pages > 0, "{summary:?}");
    assert!(m.rounds[0].pages < 1024, "{:?}", m.rounds[0]);
    let sent: u64 = summary.memory.rounds.iter().map(|r| r.pages).sum();
    assert_eq!(sent, dsum.pages_received);
}

#[test]
fn a_destination_with_other_regions_is_refused_naming_both() {
    let layout = common::TestConfig {
        hole_bytes: 2 << 20,
        ..common::config()
    };
    let (to, dest) = common::spawn_receiver_with(quick_receive(), Backing::Anonymous, move |vm| {
        // Same sizes, but its data region starts elsewhere.
        *vm = common::TestVm::new(&layout).unwrap();
    });
    let mut src = running_source();
    let err = migrate(&mut src, &to, &probed(), &NoProgress)
        .unwrap_err()
        .chain();
    assert!(
        err.contains("destination memory regions [0x0+2.0 MiB, 0x400000+4.0 MiB] differ from the stream's [0x0+2.0 MiB, 0x200000+4.0 MiB]"),
        "{err}"
    );
    assert!(dest.join().unwrap().is_err());
    assert!(src.is_running());
}

#[test]
fn a_vmm_gets_qmp_status_and_events_from_the_engines_monitor() {
    use ferry_engine::monitor::{EventSink, MigStatus, Monitor};
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let monitor = Monitor::start(src.ram().size()).unwrap();
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    monitor.subscribe(events.clone() as std::sync::Arc<dyn EventSink>);
    assert!(monitor.begin());
    let (summary, result) = ferry_engine::migrate_accounted(&mut src, &to, &probed(), &*monitor);
    result.unwrap();
    dest.join().unwrap().unwrap();
    let json = serde_json::to_value(&summary).unwrap();
    monitor.finish(&summary, json, false, false);
    monitor.drain();
    assert_eq!(monitor.status(), MigStatus::Completed);
    let q = monitor.query();
    assert_eq!(q["status"], "completed", "{q}");
    assert_eq!(q["x-ferry-summary"]["digest_match"], true, "{q}");
    let text = String::from_utf8(events.lock().unwrap().clone()).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let statuses: Vec<&str> = lines
        .iter()
        .filter(|e| e["event"] == "MIGRATION")
        .map(|e| e["data"]["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses.first(), Some(&"setup"), "{statuses:?}");
    assert_eq!(statuses.last(), Some(&"completed"), "{statuses:?}");
    assert!(
        statuses.contains(&"active") && statuses.contains(&"device"),
        "{statuses:?}"
    );
    assert!(lines.iter().any(|e| e["event"] == "MIGRATION_PASS"));
    assert!(lines
        .iter()
        .any(|e| e["event"] == "FERRY_MIGRATION_SUMMARY"));
}
