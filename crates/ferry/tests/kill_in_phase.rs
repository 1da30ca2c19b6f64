//! A peer process killed (SIGKILL) mid-migration, at a point chosen from
//! the source's own QMP status: in the full pass, in a dirty round, and in
//! postcopy. Each end is then left as promised, within the stall timeout:
//!
//! ```text
//!  destination killed in precopy   the source fails and its guest runs on, intact
//!  source killed in precopy        the destination fails and exits; no guest runs there
//!                                  (in the full pass, and in a dirty round)
//!  destination killed in postcopy  the source stays paused with every page (postcopy-paused)
//!  source killed in postcopy       the destination names the pages only the source held
//! ```

mod common;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Polls the source's query-migrate until `done` (60 s at most).
fn until(sock: &std::path::Path, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let q = ask(sock, r#"{"execute":"query-migrate"}"#)["return"].clone();
        if done(&q) {
            return q;
        }
        assert!(Instant::now() < deadline, "never reached {what}: {q}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A soft source at 16 MiB/s (a pass of its 64 MiB takes 4 s) migrating
/// to a soft destination whose stall and recovery timeouts are short.
fn start(mode: &str) -> (std::process::Child, std::path::PathBuf, Receiver) {
    let (vm, sock) = run_with_control(Ferry::new("run").on("soft").mem("32M"));
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
        "1",
    ]);
    let req = format!(
        r#"{{"execute":"migrate","arguments":{{"uri":"tcp:{}","mode":"{mode}","stall-timeout-s":2,"recover-timeout-s":1}}}}"#,
        dest.addr
    );
    let started = ask(&sock, &req);
    assert!(started.get("return").is_some(), "{started}");
    (vm, sock, dest)
}

fn kill(child: &mut std::process::Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

fn guest_mismatches(sock: &std::path::Path) -> u64 {
    let status = ask(sock, r#"{"cmd":"status"}"#);
    assert_eq!(status["ok"], true, "{status}");
    status["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["mismatches"].as_u64().unwrap())
        .sum()
}

fn stop(mut vm: std::process::Child, sock: &std::path::Path) {
    let _ = ask(sock, r#"{"cmd":"stop"}"#);
    let _ = vm.wait();
    let _ = std::fs::remove_file(sock);
}

/// The destination killed at pass `pass` of a precopy.
fn destination_killed_in_precopy(pass: u64) {
    let (vm, sock, mut dest) = start("precopy");
    until(&sock, &format!("pass {pass}"), |q| {
        q["ram"]["dirty-sync-count"].as_u64() >= Some(pass)
            && q["ram"]["transferred"].as_u64() > Some(0)
    });
    kill(&mut dest.child);
    let killed = Instant::now();
    let end = until(&sock, "the end of the migration", |q| {
        q["status"] == "failed"
    });
    println!(
        "destination killed in pass {pass}: the source failed {:.1} s later: {}",
        killed.elapsed().as_secs_f64(),
        end["error-desc"]
    );
    assert!(end["error-desc"].is_string(), "{end}");
    // The source's guest runs on, intact.
    assert_eq!(guest_mismatches(&sock), 0);
    stop(vm, &sock);
}

#[test]
fn a_destination_killed_in_the_full_pass_leaves_the_source_running() {
    destination_killed_in_precopy(1);
}

#[test]
fn a_destination_killed_in_a_dirty_round_leaves_the_source_running() {
    destination_killed_in_precopy(2);
}

/// The source killed once `reached` holds; returns the destination's
/// stderr after it exited.
fn source_killed(mode: &str, reached: impl Fn(&Value) -> bool) -> String {
    let (mut vm, sock, mut dest) = start(mode);
    until(&sock, "the kill point", reached);
    kill(&mut vm);
    let _ = std::fs::remove_file(&sock);
    let (ok, stderr) = dest.finish_within(30, "its source was killed");
    assert!(!ok, "the destination claims success");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn a_source_killed_in_precopy_ends_the_destination_with_no_guest() {
    let stderr = source_killed("precopy", |q| q["ram"]["transferred"].as_u64() > Some(0));
    assert!(stderr.contains("error"), "{stderr}");
}

#[test]
fn a_source_killed_in_a_dirty_round_ends_the_destination_with_no_guest() {
    let stderr = source_killed("precopy", |q| {
        q["ram"]["dirty-sync-count"].as_u64() >= Some(2) && q["status"] == "active"
    });
    assert!(stderr.contains("error"), "{stderr}");
    assert!(!stderr.contains("guest running here"), "{stderr}");
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

#[test]
fn a_source_killed_in_postcopy_leaves_the_destination_naming_the_missing_pages() {
    if !postcopy_possible() {
        return;
    }
    let stderr = source_killed("postcopy", |q| q["status"] == "postcopy-active");
    assert!(stderr.contains("still missing here"), "{stderr}");
}

#[test]
fn a_destination_killed_in_postcopy_leaves_the_source_paused_with_every_page() {
    if !postcopy_possible() {
        return;
    }
    let (vm, sock, mut dest) = start("postcopy");
    until(&sock, "postcopy", |q| q["status"] == "postcopy-active");
    kill(&mut dest.child);
    let end = until(&sock, "postcopy-paused", |q| {
        q["status"] == "postcopy-paused"
    });
    assert!(end["error-desc"].is_string(), "{end}");
    // The VM is held for a resume: a new migration is refused.
    let again = ask(
        &sock,
        r#"{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:1"}}"#,
    );
    assert!(
        again["error"]["desc"]
            .as_str()
            .is_some_and(|d| d.contains("resume")),
        "{again}"
    );
    stop(vm, &sock);
}
