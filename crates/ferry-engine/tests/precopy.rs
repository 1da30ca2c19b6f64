//! End-to-end precopy between two test VMs in one process, over TCP loopback
//! and Unix socket pairs. No assertion depends on how long anything takes.

mod common;

use common::{config, TestVm};
use ferry_backend::{BackendError, Vm, VmConfig};
use ferry_engine::{
    connect, listen, migrate, receive, ExpectedVm, MigrationError, NoProgress, PrecopyOptions,
    ReceiveOptions, ReceiveSummary, RoundKind, Status,
};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::Duration;

type Received = Result<(Box<dyn Vm>, ReceiveSummary), MigrationError>;

fn running_source() -> TestVm {
    let mut vm = TestVm::new(&config()).unwrap();
    vm.start().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    vm
}

fn spawn_receiver(stream: UnixStream, opts: ReceiveOptions) -> JoinHandle<Received> {
    std::thread::spawn(move || {
        let mut create = |c: &VmConfig| -> Result<Box<dyn Vm>, BackendError> { TestVm::boxed(c) };
        receive(stream, &mut create, &opts)
    })
}

fn quick_receive() -> ReceiveOptions {
    ReceiveOptions {
        run_after: Duration::from_millis(50),
        ..ReceiveOptions::default()
    }
}

#[test]
fn precopy_over_tcp_moves_a_running_guest_with_matching_digest() {
    let listener = listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dest = std::thread::spawn(move || {
        let (stream, _) = ferry_engine::accept(&listener).unwrap();
        let mut create = |c: &VmConfig| -> Result<Box<dyn Vm>, BackendError> { TestVm::boxed(c) };
        receive(stream, &mut create, &quick_receive())
    });
    let mut src = running_source();
    let stream = connect(addr).unwrap();
    let summary = migrate(&mut src, stream, &PrecopyOptions::default(), &NoProgress).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();

    assert_eq!(summary.status, Status::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match);
    assert_eq!(summary.guest_mismatches, 0, "{summary:?}");
    assert_eq!(dsum.mismatches_after, 0);
    assert_eq!(summary.dest_passes_after, dsum.passes_after);
    assert_eq!(summary.rounds.first().unwrap().kind, RoundKind::Full);
    assert_eq!(summary.rounds.last().unwrap().kind, RoundKind::Final);
    assert_eq!(summary.rounds[0].pages, src.ram().pages());
    assert!(summary.rounds[0].zero_pages > 0);
    assert_eq!(summary.bytes_sent, dsum.bytes_received);
    assert!(!src.is_running(), "a committed source stays paused");
    assert!(!src.logging);
    assert!(dvm.is_running());
    serde_json::to_string(&summary).unwrap();
}

#[test]
fn tight_target_runs_dirty_rounds_and_strict_mode_verifies_first() {
    let (a, b) = UnixStream::pair().unwrap();
    let dest = spawn_receiver(b, quick_receive());
    let mut src = running_source();
    let opts = PrecopyOptions {
        verify_before_resume: true,
        batch_pages: 7,
        ..PrecopyOptions::default()
    };
    opts.tunables.set_downtime_target(Duration::ZERO);
    opts.tunables.set_max_rounds(4);
    let summary = migrate(&mut src, a, &opts, &NoProgress).unwrap();
    let (_dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Status::Completed, "{summary:?}");
    assert!(summary.verify_before_resume);
    assert!(summary.digest_match);
    assert_eq!(summary.guest_mismatches, 0);
    assert!(summary.rounds.len() >= 2 && summary.rounds.len() <= 5);
    let sent: u64 = summary.rounds.iter().map(|r| r.pages).sum();
    assert_eq!(sent, dsum.pages_received);
}

#[test]
fn digest_mismatch_rolls_the_source_back() {
    let (a, b) = UnixStream::pair().unwrap();
    let dest = spawn_receiver(b, quick_receive());
    let mut src = running_source();
    src.untracked_write_on_save = true;
    let summary = migrate(&mut src, a, &PrecopyOptions::default(), &NoProgress).unwrap();
    assert_eq!(summary.status, Status::Failed);
    assert!(!summary.digest_match);
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
    let (a, b) = UnixStream::pair().unwrap();
    let dest = spawn_receiver(
        b,
        ReceiveOptions {
            expect: Some(ExpectedVm {
                memory_bytes: Some(1 << 30),
                ..ExpectedVm::default()
            }),
            ..quick_receive()
        },
    );
    let mut src = running_source();
    let err = migrate(&mut src, a, &PrecopyOptions::default(), &NoProgress).unwrap_err();
    let want = "destination has 1.0 GiB of guest memory, stream carries 6.0 MiB";
    assert!(err.to_string().contains(want), "{err}");
    assert!(src.is_running());
    let derr = dest.join().unwrap().err().unwrap();
    assert_eq!(derr.to_string(), want);
}

#[test]
fn cancel_keeps_the_source_running_and_tells_the_destination() {
    let (a, b) = UnixStream::pair().unwrap();
    let dest = spawn_receiver(b, quick_receive());
    let mut src = running_source();
    let opts = PrecopyOptions::default();
    opts.tunables.cancel();
    let err = migrate(&mut src, a, &opts, &NoProgress).unwrap_err();
    assert!(matches!(err, MigrationError::Cancelled), "{err}");
    assert!(src.is_running() && !src.logging);
    let derr = dest.join().unwrap().err().unwrap().to_string();
    assert_eq!(derr, "the source reported: migration cancelled");
}

#[test]
fn destination_vanishing_mid_stream_keeps_the_source_running() {
    let (a, b) = UnixStream::pair().unwrap();
    // A destination that accepts, reads a little, and dies.
    let dest = std::thread::spawn(move || {
        let mut io = ferry_engine::stream::FrameStream::new(b);
        io.read_preamble().unwrap();
        io.read_frame().unwrap();
        let accept = ferry_engine::stream::Message::Accept {
            verify_before_resume: false,
        };
        io.write_frame(accept.kind(), &[&accept.encode()]).unwrap();
        io.flush().unwrap();
        io.read_frame().unwrap();
    });
    let mut src = running_source();
    let opts = PrecopyOptions {
        batch_pages: 16,
        ..PrecopyOptions::default()
    };
    let err = migrate(&mut src, a, &opts, &NoProgress).unwrap_err();
    assert!(matches!(err, MigrationError::Stream(_)), "{err}");
    assert!(src.is_running() && !src.logging);
    dest.join().unwrap();
}

#[test]
fn garbage_is_not_a_migration_stream() {
    let (mut a, b) = UnixStream::pair().unwrap();
    let dest = spawn_receiver(b, quick_receive());
    std::io::Write::write_all(&mut a, b"SSH-2.0-OpenSSH_9.6\r\n").unwrap();
    let err = dest.join().unwrap().err().unwrap();
    assert!(
        err.to_string().starts_with("not a ferry migration stream"),
        "{err}"
    );
}

#[test]
fn losing_the_destination_before_its_verdict_resumes_the_source() {
    use ferry_engine::stream::{FrameKind, FrameStream, Message};
    let (a, b) = UnixStream::pair().unwrap();
    // Takes everything, says Resumed, reads the digest, and vanishes.
    let dest = std::thread::spawn(move || {
        let mut io = FrameStream::new(b);
        io.read_preamble().unwrap();
        io.read_frame().unwrap();
        let reply = |io: &mut FrameStream<UnixStream>, m: Message| {
            io.write_frame(m.kind(), &[&m.encode()]).unwrap();
            io.flush().unwrap();
        };
        reply(
            &mut io,
            Message::Accept {
                verify_before_resume: false,
            },
        );
        while io.read_frame().unwrap().0 != FrameKind::Switchover {}
        reply(&mut io, Message::Resumed { resume_ns: 1 });
        assert_eq!(io.read_frame().unwrap().0, FrameKind::Digest);
    });
    let mut src = running_source();
    let err = migrate(&mut src, a, &PrecopyOptions::default(), &NoProgress).unwrap_err();
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
    let (a, b) = UnixStream::pair().unwrap();
    let dest = spawn_receiver(b, quick_receive());
    let mut src = running_source();
    let opts = PrecopyOptions::default();
    // A cap far above what this test sends exercises the token bucket only.
    opts.tunables.set_bandwidth_bytes_per_sec(1 << 40);
    let seen = Seen::default();
    let summary = migrate(&mut src, a, &opts, &seen).unwrap();
    dest.join().unwrap().unwrap();
    let sent: u64 = summary.rounds.iter().map(|r| r.pages).sum();
    assert_eq!(*seen.pages.lock().unwrap(), sent);
    assert_eq!(*seen.rounds.lock().unwrap() as usize, summary.rounds.len());
    let phases = seen.phases.lock().unwrap();
    assert_eq!(phases.first(), Some(&Phase::Handshake));
    assert!(phases.contains(&Phase::Switchover) && phases.contains(&Phase::Verifying));
    assert_eq!(phases.last(), Some(&Phase::Done));
}
