//! The VMM's own transports: a migration over a UNIX socket, and one over
//! connections the caller already holds (socket pairs standing in for the
//! fds an orchestrator passes), each proving itself as every migration
//! does.

mod common;

use common::{check, create_test_vm, probed, quick_receive, running_source, wait_for_passes};
use ferry_engine::transport::{listen_unix, HeldConnections, UnixDialer};
use ferry_engine::ReceiveSummary;
use ferry_engine::{await_migration, migrate, receive, Listen, NoProgress, Outcome};
use ferry_vm::Vm;
use std::os::unix::net::UnixStream;

/// Receives one migration on `listener` in a thread; the guest must run on
/// without a mismatch.
fn receive_on(
    listener: Box<dyn Listen + Send>,
) -> std::thread::JoinHandle<Result<ReceiveSummary, ferry_engine::MigrationError>> {
    std::thread::spawn(move || {
        let incoming = await_migration(&*listener, None)?;
        let mut create = create_test_vm;
        let (vm, summary) = receive(incoming, &*listener, &mut create, &quick_receive())?;
        let at_resume = summary.guest_at_resume.expect("the probe read at resume");
        wait_for_passes(&*vm, at_resume.progress + 1);
        assert_eq!(check(&*vm).since(&at_resume).errors, 0);
        Ok(summary)
    })
}

#[test]
fn a_migration_over_a_unix_socket_proves_itself() {
    let dir = std::env::temp_dir().join(format!("ferry-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("migrate.sock");
    let listener = listen_unix(&path).unwrap();
    let dest = receive_on(Box::new(listener));
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.connections = 2;
        o
    };
    let summary = migrate(&mut src, &UnixDialer(path.clone()), &opts, &NoProgress).unwrap();
    let dsum = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed);
    assert!(summary.digest_match && dsum.digest_match);
    assert_eq!(summary.guest.guest_mismatches, Some(0));
    assert_eq!(dsum.connections, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_migration_over_connections_handed_in_proves_itself() {
    // 1 main channel + 2 data connections, opened by "the orchestrator".
    let (ours, theirs): (Vec<_>, Vec<_>) = (0..3).map(|_| UnixStream::pair().unwrap()).unzip();
    let held = |ends: Vec<UnixStream>| {
        HeldConnections::from_fds(ends.into_iter().map(Into::into).collect()).unwrap()
    };
    let dest = receive_on(Box::new(held(theirs)));
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.connections = 2;
        o
    };
    let summary = migrate(&mut src, &held(ours), &opts, &NoProgress).unwrap();
    let dsum = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed);
    assert!(summary.digest_match && dsum.digest_match);
    assert_eq!(dsum.connections, 2);
}

#[test]
fn too_few_connections_handed_in_is_refused_in_words_and_the_source_runs_on() {
    let (ours, theirs): (Vec<_>, Vec<_>) = (0..2).map(|_| UnixStream::pair().unwrap()).unzip();
    let held = |ends: Vec<UnixStream>| {
        HeldConnections::from_fds(ends.into_iter().map(Into::into).collect()).unwrap()
    };
    let dest = receive_on(Box::new(held(theirs)));
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.connections = 2;
        o
    };
    let err = migrate(&mut src, &held(ours), &opts, &NoProgress).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the migration opens 3 connections (1 main, 2 data), and 2 were handed over"
    );
    assert!(src.is_running());
    // Nothing was sent: the destination sees its connections close.
    drop(src);
    assert!(dest.join().unwrap().is_err());
}
