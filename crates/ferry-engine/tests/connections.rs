//! The connection set: several data connections, refusals that reach the
//! source with the destination's reason, version negotiation, and a link
//! that stops moving.

mod common;

use common::relay::{Fault, Relay};
use common::{check, churning_source, probed, quick_receive, running_source, spawn_receiver};
use ferry_engine::choices::Compression;
use ferry_engine::precopy::Placement;
use ferry_engine::wire::compress::Codec;
use ferry_engine::wire::{FrameKind, FrameStream, Message, MAGIC};
use ferry_engine::{migrate, ExpectedVm, NoProgress, Outcome, TcpDialer};
use ferry_vm::Vm;
use std::io::Write;
use std::time::{Duration, Instant};

#[test]
fn four_connections_carry_every_round_and_verify() {
    for compression in ["none", "lz4", "zstd", "auto"] {
        four_connections(compression.parse().unwrap(), false);
    }
}

#[test]
fn four_connections_with_delta_resends_verify() {
    for compression in ["none", "zstd"] {
        four_connections(compression.parse().unwrap(), true);
    }
}

fn four_connections(compression: Compression, delta: bool) {
    let (to, dest) = spawn_receiver(quick_receive());
    // Its device dirties pages every round, so there are dirty rounds to
    // spread even when the guest thread gets no CPU.
    let mut src = churning_source();
    let opts = {
        let mut o = probed();
        o.connections = 4;
        o.batch_pages = 16;
        o.compression = compression;
        // A cache the size of the guest: every page re-sent hits.
        o.delta_cache_bytes = if delta { 8 << 20 } else { 0 };
        o
    };
    // Dirty rounds: every round's batches spread over the four connections.
    opts.tunables.set_downtime_target(Duration::ZERO);
    opts.tunables.set_max_rounds(if delta { 6 } else { 5 });
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed, "{summary:?}");
    assert!(summary.digest_match && dsum.digest_match);
    assert_eq!(summary.guest.guest_mismatches, Some(0), "{summary:?}");
    assert_eq!((summary.link.connections, dsum.connections), (4, 4));
    assert!(
        summary.memory.rounds.len() >= 3,
        "{:?}",
        summary.memory.rounds
    );
    let sent: u64 = summary.memory.rounds.iter().map(|r| r.pages).sum();
    assert_eq!(sent, dsum.pages_received);
    let data: u64 = summary.memory.rounds.iter().map(|r| r.bytes).sum();
    assert_eq!(data, dsum.bytes_received, "every page byte arrived");
    match &summary.link.delta {
        // The guest rewrites an 8-byte stamp per page: re-sent pages become
        // deltas.
        Some(d) => assert!(d.pages > 0 && d.bytes < d.pages * 64, "{d:?}"),
        None => assert!(!delta),
    }
    assert!(dvm.is_running());
    let [raw, lz4, zstd] = summary.link.batches_by_codec;
    match compression {
        Compression::None => assert_eq!((lz4, zstd), (0, 0)),
        Compression::Fixed(Codec::Lz4) => assert!(lz4 > 0 && zstd == 0),
        Compression::Fixed(Codec::Zstd) => assert!(zstd > 0 && lz4 == 0),
        Compression::Auto => assert!(raw + lz4 + zstd > 0),
        other => panic!("no check for compression {other}"),
    }
}

#[test]
fn a_v1_peer_is_refused_naming_both_versions() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut raw = ferry_engine::connect(to.0.as_str()).unwrap();
    let mut v1 = MAGIC.to_vec();
    v1.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    raw.write_all(&v1).unwrap();
    let want = format!(
        "the peer speaks stream version 1, this ferry speaks {} to {}",
        ferry_engine::wire::MIN_VERSION,
        ferry_engine::wire::VERSION
    );
    let err = dest.join().unwrap().err().unwrap();
    assert_eq!(err.to_string(), want);
    // The v1 peer is told why, in a frame it can read.
    let mut io = FrameStream::new(raw);
    let (kind, offset) = io.read_frame().unwrap();
    assert_eq!(kind, FrameKind::Error);
    let msg = Message::decode(kind, io.payload(), offset).unwrap();
    assert_eq!(msg, Message::Error(want));
}

#[test]
fn a_vcpu_count_refusal_reaches_the_source_and_it_keeps_running() {
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.expect = Some(ExpectedVm {
            vcpus: Some(4),
            ..ExpectedVm::default()
        });
        o
    });
    let mut src = running_source();
    let err = migrate(&mut src, &to, &probed(), &NoProgress).unwrap_err();
    assert_eq!(
        err.to_string(),
        "destination refused the stream: destination has 4 vCPUs, stream carries 1"
    );
    assert!(src.is_running() && !src.logging);
    assert!(dest.join().unwrap().is_err());
}

#[test]
fn a_corrupt_page_batch_is_refused_and_the_source_says_why() {
    let (to, dest) = spawn_receiver(quick_receive());
    // Byte 50 000 of the first data connection is inside the first batch's
    // page data (the batch is 1 MiB).
    let relay = Relay::start(to.0.clone(), Fault::FlipAt(50_000));
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.connections = 2;
        o
    };
    let err = migrate(&mut src, &TcpDialer(relay.addr.clone()), &opts, &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("destination refused the stream: checksum mismatch in Pages frame"),
        "{err}"
    );
    assert!(src.is_running() && !src.logging);
    let derr = dest.join().unwrap().err().unwrap().to_string();
    assert!(
        derr.starts_with("checksum mismatch in Pages frame"),
        "{derr}"
    );
}

#[test]
fn a_stalled_link_fails_both_ends_and_the_source_runs_on() {
    let stall = Duration::from_secs(2);
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.stall_timeout = stall;
        o
    });
    let relay = Relay::start(to.0.clone(), Fault::StallAfter(300_000));
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.stall_timeout = stall;
        o
    };
    let started = Instant::now();
    let err = migrate(&mut src, &TcpDialer(relay.addr.clone()), &opts, &NoProgress).unwrap_err();
    let source_took = started.elapsed();
    assert!(relay.has_stalled());
    assert_eq!(err.to_string(), "no progress from destination for 2 s");
    let derr = dest.join().unwrap().err().unwrap();
    let dest_took = started.elapsed();
    assert_eq!(derr.to_string(), "no progress from source for 2 s");
    // Nothing hangs: each end gives up within the stall timeout plus 5 s.
    let bound = stall + Duration::from_secs(5);
    assert!(
        source_took < bound && dest_took < bound,
        "{source_took:?} {dest_took:?}"
    );
    // The source guest ran on throughout, and keeps running correctly.
    assert!(src.is_running() && !src.logging);
    let before = check(&src);
    let deadline = Instant::now() + Duration::from_secs(30);
    while check(&src).progress < before.progress + 2 {
        assert!(Instant::now() < deadline, "source guest stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    src.pause().unwrap();
    assert_eq!(check(&src).errors, 0);
}

#[test]
fn placement_by_plain_write_verifies_as_well() {
    let (to, dest) = spawn_receiver({
        let mut o = quick_receive();
        o.placement = Placement::Write;
        o
    });
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.connections = 2;
        o
    };
    opts.tunables.set_downtime_target(Duration::ZERO);
    opts.tunables.set_max_rounds(3);
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (_dvm, dsum) = dest.join().unwrap().unwrap();
    assert!(summary.digest_match && dsum.digest_match, "{summary:?}");
    assert_eq!(summary.guest.guest_mismatches, Some(0));
}

/// A hand-driven source: the main channel's header is accepted, then
/// one data connection introduces itself as `channel`.
fn data_connection_as(channel: u16) -> (String, ferry_engine::MigrationError) {
    use ferry_engine::transport::open_channel;
    use ferry_engine::vmm::StreamHeader;
    use ferry_engine::wire::messages::Hello;
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = running_source();
    let hello = |channel| Hello {
        session: 7,
        channel,
        data_channels: 1,
        priority: false,
        recover: false,
    };
    let timeout = Duration::from_secs(10);
    let mut ctl = open_channel(&to, hello(0), timeout).unwrap();
    let header = StreamHeader::for_vm(&mut src).encode();
    ctl.write_frame(FrameKind::Header, &[&header]).unwrap();
    ctl.flush().unwrap();
    // Heartbeats may come first.
    loop {
        match ctl.read_frame().unwrap().0 {
            FrameKind::Heartbeat => continue,
            kind => break assert_eq!(kind, FrameKind::Accept),
        }
    }
    let Err(answer) = open_channel(&to, hello(channel), timeout) else {
        panic!("channel {channel} was welcomed");
    };
    let dest_err = dest
        .join()
        .unwrap()
        .err()
        .expect("the destination must refuse");
    (answer.to_string(), dest_err)
}

#[test]
fn a_data_channel_out_of_range_or_the_priority_one_is_refused_not_a_panic() {
    let (answer, dest) = data_connection_as(70);
    assert!(
        answer.contains("channel 70 of 1 data connections"),
        "{answer}"
    );
    assert!(dest.to_string().contains("channel 70"), "{dest}");
    let (answer, _) = data_connection_as(ferry_engine::wire::messages::PRIORITY_CHANNEL);
    assert!(
        answer.contains("a priority connection for a migration that announced none"),
        "{answer}"
    );
}
