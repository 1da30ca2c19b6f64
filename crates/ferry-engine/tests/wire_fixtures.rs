//! Streams recorded from earlier releases, which this destination must keep
//! loading: the safety net under any change that moves code and claims to
//! leave the wire alone, and the start of old-to-new interoperation.
//!
//! `tests/fixtures/wire-N/<case>/` holds what a source of a release speaking
//! wire version N sent on each connection of one real migration of the test
//! VM, in the order the connections opened (`conn-0.zst` is the control
//! connection), zstd-compressed. The test plays each connection's bytes
//! into a fresh destination, reading and dropping its answers, and checks
//! that the destination loads the guest, matches the digest and runs the
//! guest on with its own checks clean. Each `README.md` says which commit
//! recorded it. Record a new release's streams with
//!
//! ```text
//! cargo test -p ferry-engine --test wire_fixtures -- --ignored
//! ```
//!
//! and keep the old ones for as long as a release must load them
//! (`docs/design.md`).

mod common;

use common::record::{frames, recording_relay};
use common::{probed, quick_receive, running_source, spawn_receiver};
use ferry_engine::choices::Compression;
use ferry_engine::wire::{compress::Codec, MIN_VERSION, VERSION};
use ferry_engine::{migrate_accounted, NoProgress, PrecopyOptions, TcpDialer};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The recorded cases: (directory name, source options).
fn cases() -> Vec<(&'static str, PrecopyOptions)> {
    vec![
        ("precopy-1-connection", probed()),
        ("precopy-2-connections-lz4-delta", dirty_rounds()),
    ]
}

/// Two data connections, lz4, deltas, and a zero downtime target capped at
/// four rounds, so that dirty rounds re-send pages as deltas and the
/// destination verifies before it resumes.
fn dirty_rounds() -> PrecopyOptions {
    let opts = {
        let mut o = probed();
        o.connections = 2;
        o.compression = Compression::Fixed(Codec::Lz4);
        o.delta_cache_bytes = 8 << 20;
        o.verify_before_resume = true;
        o
    };
    opts.tunables.set_downtime_target(Duration::ZERO);
    opts.tunables.set_max_rounds(4);
    opts
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
#[ignore = "writes tests/fixtures/wire-VERSION: run with --ignored to record a release's streams"]
fn record_this_releases_streams() {
    let release = fixtures().join(format!("wire-{VERSION}"));
    // A release's streams are recorded once, when its version is new: an
    // ignored test run by a wide `--ignored` must not rewrite them.
    assert!(
        !release.exists(),
        "{release:?} exists: wire-{VERSION}'s streams were recorded already; remove the directory to record them again"
    );
    for (name, opts) in cases() {
        let (to, dest) = spawn_receiver(quick_receive());
        let (addr, recorded) = recording_relay(to.0.clone());
        let mut src = running_source();
        let (summary, result) = migrate_accounted(&mut src, &TcpDialer(addr), &opts, &NoProgress);
        result.unwrap();
        assert!(summary.digest_match);
        dest.join().unwrap().unwrap();
        // The relay's last bytes reach its log after the destination returns.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let dir = release.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut kinds = std::collections::BTreeSet::new();
        // What the source sent: the first of each connection's two streams.
        for (i, stream) in recorded.lock().unwrap().iter().step_by(2).enumerate() {
            let bytes = stream.lock().unwrap();
            kinds.extend(frames(&bytes).iter().map(|(k, _)| k.name()));
            let packed = zstd::bulk::compress(&bytes, 19).unwrap();
            std::fs::write(dir.join(format!("conn-{i}.zst")), packed).unwrap();
        }
        println!(
            "recorded {name}: {} rounds, frames {kinds:?}",
            summary.memory.rounds.len()
        );
        if opts.delta_cache_bytes > 0 {
            assert!(kinds.contains("Delta"), "no delta frame was recorded");
        }
    }
}

/// The recorded connections of one case, unpacked, in order.
fn load_case(dir: &Path) -> Vec<Vec<u8>> {
    let mut streams = Vec::new();
    while let Ok(packed) = std::fs::read(dir.join(format!("conn-{}.zst", streams.len()))) {
        streams.push(zstd::stream::decode_all(&packed[..]).expect("a zstd fixture"));
    }
    streams
}

/// Plays `streams` into a fresh destination, one connection each, opened in
/// order; answers are read and dropped so the destination never blocks.
/// Each connection stays open until the destination returns, as a source's
/// does: an early end of stream is a source that went away.
fn replay(streams: Vec<Vec<u8>>) -> common::Received {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    for bytes in streams {
        let mut conn = TcpStream::connect(&to.0).expect("the destination listens");
        let mut answers = conn.try_clone().unwrap();
        readers.push(std::thread::spawn(move || {
            let mut sink = vec![0u8; 64 << 10];
            while matches!(answers.read(&mut sink), Ok(n) if n > 0) {}
        }));
        writers.push(std::thread::spawn(move || {
            // The destination may close before the source's last heartbeat.
            let _ = conn.write_all(&bytes);
            conn
        }));
    }
    let received = dest.join().expect("the destination thread");
    for w in writers {
        drop(w.join().unwrap());
    }
    for r in readers {
        r.join().unwrap();
    }
    received
}

#[test]
fn streams_of_earlier_releases_still_load() {
    let mut loaded = 0;
    let mut versions: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("tests/fixtures")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    versions.sort();
    for version in versions {
        let spoken: u32 = version
            .file_name()
            .and_then(|n| n.to_str()?.strip_prefix("wire-")?.parse().ok())
            .unwrap_or_else(|| panic!("{version:?}: fixture directories are wire-N"));
        for (name, _) in cases() {
            let dir = version.join(name);
            let streams = load_case(&dir);
            assert!(streams.len() >= 2, "{dir:?}: no recorded connections");
            if spoken < MIN_VERSION {
                assert_refused(streams, spoken, &dir);
                continue;
            }
            let (vm, summary) =
                replay(streams).unwrap_or_else(|e| panic!("{dir:?} no longer loads: {e}"));
            assert_eq!(summary.wire_version, spoken, "{dir:?}: version spoken");
            assert!(summary.digest_match, "{dir:?}: digest mismatch");
            assert!(vm.is_running(), "{dir:?}: the guest did not resume");
            assert_eq!(
                summary.mismatches_after,
                Some(0),
                "{dir:?}: the guest's checks failed after the switchover"
            );
            loaded += 1;
        }
    }
    assert!(loaded >= 4, "found only {loaded} recorded streams");
}

/// Past the compatibility window: the destination refuses the stream,
/// naming both ends' versions, and builds no VM.
fn assert_refused(streams: Vec<Vec<u8>>, spoken: u32, what: &Path) {
    let err = replay(streams).err().expect("an old stream is refused");
    let text = err.to_string();
    let names =
        format!("speaks stream version {spoken}, this ferry speaks {MIN_VERSION} to {VERSION}");
    assert!(text.contains(&names), "{what:?}: {text}");
}

/// A release older than the window: the oldest recorded streams, with each
/// connection's preamble saying it speaks only `MIN_VERSION - 1`. No real
/// recording that old exists (streams were first recorded at 5), and the
/// preamble is all a destination reads before it refuses; when
/// `MIN_VERSION` moves past a recorded release, the loop above refuses
/// that release's real streams too.
#[test]
fn a_stream_older_than_the_window_is_refused() {
    let oldest = fixtures()
        .join(format!("wire-{MIN_VERSION}"))
        .join("precopy-1-connection");
    let mut streams = load_case(&oldest);
    assert!(streams.len() >= 2, "{oldest:?}: no recorded connections");
    let old = (MIN_VERSION - 1).to_le_bytes();
    for s in &mut streams {
        assert_eq!(
            &s[..8],
            b"FERRYMIG",
            "{oldest:?}: a connection without a preamble"
        );
        s[8..12].copy_from_slice(&old);
        s[12..16].copy_from_slice(&old);
    }
    assert_refused(streams, MIN_VERSION - 1, &oldest);
}
