//! Seed corpora for the fuzz targets (`fuzz/`), taken from real migrations:
//! a precopy and a hybrid of the test guest through a relay that records
//! every byte each way, split into frames. Not part of the test command;
//! run it to refresh `fuzz/seeds/`:
//!
//! ```text
//! cargo test -p ferry-engine --test fuzz_corpus -- --ignored
//! ```

mod common;

use common::record::{frames, recording_relay};
use common::{probed, quick_receive, running_source, spawn_receiver};
use ferry_engine::wire::FrameKind;
use ferry_engine::{migrate_accounted, Mode, NoProgress, TcpDialer};
use std::path::{Path, PathBuf};

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn migrate_recorded(mode: Mode) -> Vec<Vec<u8>> {
    let (to, dest) = spawn_receiver(quick_receive());
    let (addr, recorded) = recording_relay(to.0.clone());
    let mut src = running_source();
    let opts = {
        let mut o = probed();
        o.mode = mode;
        o.batch_pages = 16;
        o
    };
    let (summary, result) = migrate_accounted(&mut src, &TcpDialer(addr), &opts, &NoProgress);
    result.unwrap();
    assert!(summary.digest_match);
    dest.join().unwrap().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let streams = recorded.lock().unwrap();
    streams.iter().map(|s| s.lock().unwrap().clone()).collect()
}

#[test]
#[ignore = "writes fuzz/seeds: run with --ignored to refresh it"]
fn record_seed_corpora_from_real_migrations() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    let pages_of_test_guest = common::config().total_pages();
    let mut per_kind = std::collections::HashMap::<u8, usize>::new();
    let mut n = 0;
    for mode in [Mode::Precopy, Mode::Postcopy, "hybrid".parse().unwrap()] {
        for (i, stream) in migrate_recorded(mode).iter().enumerate() {
            // A stream's opening: preamble, Hello, Header, first frames.
            let head = &stream[..stream.len().min(4096)];
            write(&root.join("frame"), &format!("{mode}-stream-{i}"), head);
            for (kind, payload) in frames(stream) {
                let k = kind as u8;
                let seen = per_kind.entry(k).or_default();
                // A few of each kind, small ones (libFuzzer works best
                // with short inputs).
                if *seen >= 4 || payload.len() > 16 << 10 {
                    continue;
                }
                *seen += 1;
                n += 1;
                let mut framed = vec![k];
                framed.extend_from_slice(&payload);
                write(
                    &root.join("frame"),
                    &format!("{}-{n}", kind.name()),
                    &framed,
                );
                match kind {
                    FrameKind::Header => {
                        write(&root.join("header"), &format!("header-{n}"), &payload)
                    }
                    FrameKind::Pages | FrameKind::Delta => {
                        let mut input = pages_of_test_guest.to_le_bytes().to_vec();
                        input.push(0);
                        input.extend_from_slice(&payload);
                        write(
                            &root.join("page_batch"),
                            &format!("{}-{n}", kind.name()),
                            &input,
                        );
                    }
                    _ => {}
                }
            }
        }
    }
    let control = [
        r#"{"cmd":"status"}"#,
        r#"{"cmd":"set","downtime_ms":120,"max_rounds":7,"converge":"quota","quota_interval_ms":50}"#,
        r#"{"cmd":"migrate","to":"127.0.0.1:7070","connections":2,"mode":"hybrid","on_stall":"postcopy","compress":"lz4"}"#,
        r#"{"cmd":"throttle","percent":40}"#,
        r#"{"cmd":"resume","to":"127.0.0.1:7071"}"#,
        r#"{"execute":"qmp_capabilities","id":1}"#,
        r#"{"execute":"query-migrate"}"#,
        r#"{"execute":"migrate-set-parameters","arguments":{"downtime-limit":100,"max-bandwidth":134217728,"x-converge":"dirty-limit","x-quota-interval":50,"x-max-rounds":9}}"#,
        r#"{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"auto-converge","state":true}]}}"#,
        r#"{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:7070","connections":2,"stall-timeout-s":5},"id":"m"}"#,
        r#"{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:7070","resume":true}}"#,
        r#"{"execute":"migrate_cancel"}"#,
    ];
    for (i, line) in control.iter().enumerate() {
        write(
            &root.join("control"),
            &format!("request-{i}"),
            line.as_bytes(),
        );
    }
    println!(
        "wrote {n} frames and {} control requests under {}",
        control.len(),
        root.display()
    );
    assert!(per_kind.contains_key(&(FrameKind::Pages as u8)));
    assert!(per_kind.contains_key(&(FrameKind::Header as u8)));
}
