//! A peer process killed (SIGKILL), or the link stalled, at an exact point
//! of a migration. A relay between the two `ferry` processes holds the
//! main channel just before one frame; the test kills a peer while
//! the other waits for that frame (the frame is then dropped with the
//! connection, as if never sent), or never lets it through (a stall).
//!
//! ```text
//!  held frame                    the point              kill the destination       kill the source
//!  Accept    (dest -> source)    the handshake          source fails, guest runs   destination exits, no guest
//!  VcpuState (source -> dest)    stop-and-copy          source resumes, runs       destination exits, no guest
//!  Verified  (dest -> source)    the digest's verdict   source resumes, runs       destination holds a paused,
//!                                                                                  verified copy; `cont` runs it
//! ```
//!
//! A stall at each of those frames ends as the destination's kill does on
//! the source's side, within the stall timeout. A postcopy cut and kept
//! from reconnecting is in recovery; a kill there leaves the source paused
//! with every page (destination killed), or the destination naming the
//! pages only the source held (source killed).
//!
//! Whatever the point, the source's guest ends with zero mismatches where
//! it runs, every surviving process ends or answers within the stall
//! timeout, and errors name what happened.

mod common;
#[path = "../../ferry-engine/tests/common/relay.rs"]
#[allow(dead_code)] // the engine's tests use the other faults
mod relay;

use common::*;
use ferry_engine::wire::FrameKind;
use relay::{Fault, Relay};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Polls `query` on `sock` until `done` (60 s at most).
fn until(sock: &Path, query: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let q = ask(sock, query)["return"].clone();
        if done(&q) {
            return q;
        }
        assert!(Instant::now() < deadline, "never reached {what}: {q}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A soft source (2 x 32 MiB) and destination, with the relay between
/// them holding `kind`, and a migration started; returns once the frame
/// is held.
struct Scene {
    source: Child,
    sock: PathBuf,
    dest: Receiver,
    relay: Relay,
}

fn hold_at(kind: FrameKind, to_source: bool, dest_args: &[&str]) -> Scene {
    let (source, sock) = run_with_control(Ferry::new("run").on("soft").mem("32M"));
    let mut args = vec!["--backend", "soft", "--stall-timeout", "2"];
    args.extend_from_slice(dest_args);
    let dest = Receiver::serving(&args);
    let relay = Relay::start(
        dest.addr.clone(),
        Fault::HoldAtFrame {
            kind: kind as u8,
            to_source,
        },
    );
    let req = format!(
        r#"{{"execute":"migrate","arguments":{{"uri":"tcp:{}","stall-timeout-s":2}}}}"#,
        relay.addr
    );
    let started = ask(&sock, &req);
    assert!(started.get("return").is_some(), "{started}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !relay.is_holding() {
        assert!(
            Instant::now() < deadline,
            "the {} frame never came",
            kind.name()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Scene {
        source,
        sock,
        dest,
        relay,
    }
}

fn kill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The guest mismatches the source's guest counted.
fn source_mismatches(sock: &Path) -> u64 {
    let status = ask(sock, r#"{"cmd":"status"}"#);
    assert_eq!(status["ok"], true, "{status}");
    status["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["mismatches"].as_u64().unwrap())
        .sum()
}

fn stop(mut vm: Child, sock: &Path) {
    let _ = ask(sock, r#"{"cmd":"stop"}"#);
    let _ = vm.wait();
    let _ = std::fs::remove_file(sock);
}

/// Kills the destination while `kind` is held: the source fails, names
/// the destination, and its guest runs on intact.
fn destination_killed_at(kind: FrameKind, to_source: bool) {
    let mut s = hold_at(kind, to_source, &["--exit-after-report"]);
    kill(&mut s.dest.child);
    s.relay.discard();
    let end = until(
        &s.sock,
        r#"{"execute":"query-migrate"}"#,
        "the source's failure",
        |q| q["status"] == "failed",
    );
    let error = end["error-desc"].as_str().unwrap_or_default().to_string();
    println!("destination killed before {}: source: {error}", kind.name());
    assert!(!error.is_empty(), "{end}");
    let run = until(&s.sock, r#"{"execute":"query-status"}"#, "running", |q| {
        q["running"] == true
    });
    assert_eq!(run["status"], "running");
    assert_eq!(source_mismatches(&s.sock), 0);
    stop(s.source, &s.sock);
}

/// Kills the source while `kind` is held; returns the destination's exit
/// status and stderr once it ended (within 30 s).
fn source_killed_at(kind: FrameKind, to_source: bool) -> (bool, String) {
    let mut s = hold_at(kind, to_source, &["--exit-after-report"]);
    kill(&mut s.source);
    let _ = std::fs::remove_file(&s.sock);
    s.relay.discard();
    let (ok, stderr) = s.dest.finish_within(30, "its source was killed");
    println!(
        "source killed before {}: destination: {stderr}",
        kind.name()
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    (ok, stderr)
}

#[test]
fn a_destination_killed_in_the_handshake_leaves_the_source_running() {
    destination_killed_at(FrameKind::Accept, true);
}

#[test]
fn a_destination_killed_in_stop_and_copy_leaves_the_source_running() {
    destination_killed_at(FrameKind::VcpuState, false);
}

#[test]
fn a_destination_killed_before_its_verdict_leaves_the_source_running() {
    destination_killed_at(FrameKind::Verified, true);
}

#[test]
fn a_source_killed_in_the_handshake_ends_the_destination() {
    let (ok, stderr) = source_killed_at(FrameKind::Accept, true);
    assert!(!ok && stderr.contains("error"), "{stderr}");
}

#[test]
fn a_source_killed_in_stop_and_copy_ends_the_destination_with_no_guest() {
    let (ok, stderr) = source_killed_at(FrameKind::VcpuState, false);
    assert!(!ok && stderr.contains("error"), "{stderr}");
    assert!(!stderr.contains("guest running here"), "{stderr}");
}

/// Without a control socket the destination cannot hold its verified copy
/// for an operator: it says so and exits non-zero.
#[test]
fn a_source_killed_after_the_verdict_is_named_by_a_destination_without_control() {
    let (ok, stderr) = source_killed_at(FrameKind::Verified, true);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("did not confirm the commit") && stderr.contains("--control"),
        "{stderr}"
    );
}

/// The source dies after the digest matched but before its Commit: the
/// destination holds its paused, verified copy; `query-status` says
/// paused, a migration onward is refused, and `cont` runs the guest, which
/// then makes progress with zero mismatches.
#[test]
fn a_held_copy_runs_again_on_cont() {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dsock = std::env::temp_dir().join(format!(
        "ferry-test-held-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let dsock_arg = dsock.to_str().unwrap().to_string();
    let mut s = hold_at(FrameKind::Verified, true, &["--control", &dsock_arg]);
    kill(&mut s.source);
    let _ = std::fs::remove_file(&s.sock);
    s.relay.discard();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&dsock).is_err() {
        assert!(
            Instant::now() < deadline,
            "the destination never served its control socket"
        );
        assert!(
            s.dest.child.try_wait().unwrap().is_none(),
            "the destination exited: {}",
            s.dest.finish().1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The monitor is up from the start (inmigrate): wait for the verdict.
    let status = loop {
        let status = ask(&dsock, r#"{"execute":"query-status"}"#);
        if status["return"]["status"] != "inmigrate" {
            break status;
        }
        assert!(Instant::now() < deadline, "still inmigrate: {status}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status["return"]["status"], "paused", "{status}");
    assert_eq!(status["return"]["running"], false, "{status}");
    let onward = ask(
        &dsock,
        r#"{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:1"}}"#,
    );
    assert!(
        onward["error"]["desc"]
            .as_str()
            .is_some_and(|d| d.contains("held")),
        "{onward}"
    );
    let before = ask(&dsock, r#"{"cmd":"status"}"#);
    let cont = ask(&dsock, r#"{"execute":"cont","id":7}"#);
    assert_eq!(cont, serde_json::json!({"return": {}, "id": 7}));
    let status = ask(&dsock, r#"{"execute":"query-status"}"#);
    assert_eq!(status["return"]["running"], true, "{status}");
    // The guest runs here now: its passes advance, with no mismatch.
    let passes = |v: &Value| -> u64 {
        v["progress"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["passes"].as_u64().unwrap())
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let now = ask(&dsock, r#"{"cmd":"status"}"#);
        if passes(&now) > passes(&before) {
            break now;
        }
        assert!(Instant::now() < deadline, "the guest made no progress");
    };
    let mismatches: u64 = after["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["mismatches"].as_u64().unwrap())
        .sum();
    assert_eq!(mismatches, 0);
    // A second cont has nothing to do.
    let again = ask(&dsock, r#"{"execute":"cont"}"#);
    assert_eq!(again["return"], serde_json::json!({}), "{again}");
    let _ = ask(&dsock, r#"{"cmd":"stop"}"#);
    let _ = s.dest.child.wait();
    let _ = std::fs::remove_file(&dsock);
}

/// The link stalls at `kind` and never recovers: the source fails within
/// its stall timeout and runs on; the destination exits without a guest.
fn stalled_at(kind: FrameKind, to_source: bool) {
    let mut s = hold_at(kind, to_source, &["--exit-after-report"]);
    let end = until(
        &s.sock,
        r#"{"execute":"query-migrate"}"#,
        "the source's failure",
        |q| q["status"] == "failed",
    );
    println!(
        "stalled before {}: source: {}",
        kind.name(),
        end["error-desc"]
    );
    assert!(end["error-desc"].is_string(), "{end}");
    let run = until(&s.sock, r#"{"execute":"query-status"}"#, "running", |q| {
        q["running"] == true
    });
    assert_eq!(run["status"], "running");
    assert_eq!(source_mismatches(&s.sock), 0);
    let (ok, stderr) = s.dest.finish_within(30, "a stall");
    assert!(!ok && !stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("guest running here"), "{stderr}");
    s.relay.discard();
    stop(s.source, &s.sock);
}

#[test]
fn a_stall_in_the_handshake_ends_both_sides_in_time() {
    stalled_at(FrameKind::Accept, true);
}

#[test]
fn a_stall_in_stop_and_copy_ends_both_sides_in_time() {
    stalled_at(FrameKind::VcpuState, false);
}

#[test]
fn a_stall_before_the_verdict_ends_both_sides_in_time() {
    stalled_at(FrameKind::Verified, true);
}

/// Postcopy needs userfaultfd here; without it these tests print SKIP.
fn postcopy_possible() -> bool {
    let ram = ferry_vm::GuestRam::new(&[2 << 20], ferry_vm::Backing::Anonymous).unwrap();
    if let Err(e) = ferry_vm::uffd::Placer::register_for_faults(&ram) {
        ferry_vm::skip!("SKIP: userfaultfd is unavailable here ({e})");
        return false;
    }
    true
}

/// A postcopy at 16 MiB/s whose connections are cut 1 MiB into the first
/// data connection and then kept from reconnecting: returns once the
/// source is in postcopy-recover.
fn in_recovery(source_recover_s: u32) -> Scene {
    let (source, sock) = run_with_control(Ferry::new("run").on("soft").mem("32M"));
    let set = ask(
        &sock,
        r#"{"execute":"migrate-set-parameters","arguments":{"max-bandwidth":16777216}}"#,
    );
    assert!(set.get("return").is_some(), "{set}");
    let dest = Receiver::start(&[
        "--backend",
        "soft",
        "--stall-timeout",
        "2",
        "--recover-timeout",
        "3",
    ]);
    let relay = Relay::start(dest.addr.clone(), Fault::CutThenRefuse(1 << 20));
    let req = format!(
        r#"{{"execute":"migrate","arguments":{{"uri":"tcp:{}","mode":"postcopy","stall-timeout-s":2,"recover-timeout-s":{source_recover_s}}}}}"#,
        relay.addr
    );
    let started = ask(&sock, &req);
    assert!(started.get("return").is_some(), "{started}");
    until(
        &sock,
        r#"{"execute":"query-migrate"}"#,
        "postcopy-recover",
        |q| q["status"] == "postcopy-recover",
    );
    Scene {
        source,
        sock,
        dest,
        relay,
    }
}

#[test]
fn a_destination_killed_in_postcopy_recovery_leaves_the_source_paused_with_every_page() {
    if !postcopy_possible() {
        return;
    }
    let mut s = in_recovery(5);
    kill(&mut s.dest.child);
    // The source's retries now reach a closed port.
    s.relay.readmit();
    let end = until(
        &s.sock,
        r#"{"execute":"query-migrate"}"#,
        "postcopy-paused",
        |q| q["status"] == "postcopy-paused",
    );
    println!(
        "destination killed in recovery: source: {}",
        end["error-desc"]
    );
    assert!(end["error-desc"].is_string(), "{end}");
    let state = ask(&s.sock, r#"{"execute":"query-status"}"#);
    assert_eq!(state["return"]["running"], false, "{state}");
    // Its pages are kept for a resume: a new migration, or cont, is refused.
    let again = ask(
        &s.sock,
        r#"{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:1"}}"#,
    );
    assert!(
        again["error"]["desc"]
            .as_str()
            .is_some_and(|d| d.contains("resume")),
        "{again}"
    );
    let cont = ask(&s.sock, r#"{"execute":"cont"}"#);
    assert!(
        cont["error"]["desc"]
            .as_str()
            .is_some_and(|d| d.contains("must not run here")),
        "{cont}"
    );
    stop(s.source, &s.sock);
}

#[test]
fn a_source_killed_in_postcopy_recovery_leaves_the_destination_naming_the_missing_pages() {
    if !postcopy_possible() {
        return;
    }
    let mut s = in_recovery(30);
    kill(&mut s.source);
    let _ = std::fs::remove_file(&s.sock);
    let (ok, stderr) = s.dest.finish_within(30, "its source was killed");
    println!("source killed in recovery: destination: {stderr}");
    assert!(!ok && !stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("still missing here"), "{stderr}");
}
