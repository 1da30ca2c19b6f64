//! A VM's lifecycle through its monitor, as libvirt drives QEMU's: the
//! destination's monitor is up before the migration arrives (run state
//! `inmigrate`, VM commands refused) and follows it to `completed`; `stop`
//! pauses a source, which migrates paused and arrives paused; `cont` runs
//! it there.

mod common;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Output, Stdio};

fn ctl(sock: &std::path::Path, args: &[&str]) -> Output {
    ferry()
        .arg("ctl")
        .arg(sock)
        .args(args)
        .output()
        .expect("ferry ctl runs")
}

fn run_state(sock: &std::path::Path) -> Value {
    ask(sock, r#"{"execute":"query-status"}"#)["return"].clone()
}

/// query-migrate once the arrival is over (30 s at most).
fn settled(sock: &std::path::Path) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let q = ask(sock, r#"{"execute":"query-migrate"}"#)["return"].clone();
        if !matches!(q["status"].as_str(), Some("setup" | "active")) {
            return q;
        }
        assert!(std::time::Instant::now() < deadline, "still arriving: {q}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn statuses(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "MIGRATION")
        .map(|e| e["data"]["status"].as_str().unwrap_or("?").to_string())
        .collect()
}

#[test]
fn a_stopped_guest_arrives_paused_at_a_monitor_that_was_up_from_the_start() {
    let dsock = std::env::temp_dir().join(format!("ferry-inmigrate-{}.sock", std::process::id()));
    let mut dest = Receiver::serving(&["--backend", "soft", "--control", dsock.to_str().unwrap()]);

    // Up before anything arrives: inmigrate, queries answered, the rest
    // refused with why.
    let state = run_state(&dsock);
    assert_eq!(state["status"], "inmigrate", "{state}");
    assert_eq!(state["running"], false, "{state}");
    let cont = ask(&dsock, r#"{"execute":"cont"}"#);
    let desc = cont["error"]["desc"].as_str().unwrap_or_default();
    assert!(desc.contains("inmigrate"), "{cont}");
    let status = ask(&dsock, r#"{"cmd":"status"}"#);
    assert_eq!(status["ok"], false, "{status}");

    // Follow the destination's events from before the migration starts.
    let follower = follow_events(&dsock);

    // The source, paused by stop.
    let (mut vm, ssock) = run_with_control(Ferry::new("run").on("soft").mem("16M"));
    let stopped = ask(&ssock, r#"{"execute":"stop"}"#);
    assert!(stopped["return"].is_object(), "{stopped}");
    assert_eq!(run_state(&ssock)["status"], "paused");

    let moved = ctl(
        &ssock,
        &[
            "migrate",
            &format!("uri=tcp:{}", dest.addr),
            "--follow",
            "--json",
            "--timeout",
            "120",
        ],
    );
    assert_no_panic(&moved);
    assert!(
        moved.status.success(),
        "{}",
        String::from_utf8_lossy(&moved.stderr)
    );
    assert!(vm.wait().unwrap().success(), "the source ends once moved");

    let followed = follower.wait_with_output().unwrap();
    assert!(followed.status.success(), "{followed:?}");
    let seen = statuses(&followed);
    assert_eq!(
        seen.last().map(String::as_str),
        Some("completed"),
        "{seen:?}"
    );
    assert!(seen.contains(&"active".to_string()), "{seen:?}");

    // Arrived paused, verified; cont runs it here.
    let state = run_state(&dsock);
    assert_eq!(state["status"], "paused", "{state}");
    let arrived = ask(&dsock, r#"{"execute":"query-migrate"}"#)["return"].clone();
    assert_eq!(arrived["status"], "completed", "{arrived}");
    assert_eq!(arrived["x-ferry-summary"]["paused"], true, "{arrived}");
    assert_eq!(
        arrived["x-ferry-summary"]["digest_match"], true,
        "{arrived}"
    );
    let cont = ask(&dsock, r#"{"execute":"cont"}"#);
    assert!(cont["return"].is_object(), "{cont}");
    let state = run_state(&dsock);
    assert_eq!(state["status"], "running", "{state}");
    let status = ask(&dsock, r#"{"cmd":"status"}"#);
    assert_eq!(status["ok"], true, "{status}");

    let quit = ask(&dsock, r#"{"cmd":"stop"}"#);
    assert_eq!(quit["ok"], true, "{quit}");
    let (ok, stderr) = dest.finish_within(60, "stop");
    assert!(ok, "{stderr}");
    assert!(stderr.contains("arrived paused"), "{stderr}");
    let _ = std::fs::remove_file(&dsock);
}

#[test]
fn a_same_host_destination_serves_its_monitor_from_the_start_and_runs_the_guest_on() {
    let pid = std::process::id();
    let dir = std::env::temp_dir();
    let (socket, csock) = (
        dir.join(format!("ferry-local-mon-{pid}.sock")),
        dir.join(format!("ferry-local-mon-ctl-{pid}.sock")),
    );
    let mut dest = ferry()
        .args(["receive", "--backend", "soft", "--local"])
        .arg(&socket)
        .arg("--control")
        .arg(&csock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ferry receive runs");
    let mut first = String::new();
    BufReader::new(dest.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("listening on"), "{first}");
    assert_eq!(run_state(&csock)["status"], "inmigrate");

    let src = Ferry::new("migrate").on("soft").mem("32M").args(&[
        "--backing",
        "memfd",
        "--vcpus",
        "1",
        "--warmup",
        "0.3",
        "--local",
    ]);
    let moved = ferry().args(src.to_args()).arg(&socket).output().unwrap();
    assert_no_panic(&moved);
    assert!(
        moved.status.success(),
        "{}",
        String::from_utf8_lossy(&moved.stderr)
    );

    // It runs on here, answering its monitor, until told to stop. The
    // source may hear "resumed" before this side's monitor records it.
    let arrived = settled(&csock);
    assert_eq!(arrived["status"], "completed", "{arrived}");
    assert_eq!(run_state(&csock)["status"], "running");
    let status = ask(&csock, r#"{"cmd":"status"}"#);
    assert_eq!(status["ok"], true, "{status}");
    assert_eq!(ask(&csock, r#"{"cmd":"stop"}"#)["ok"], true);
    assert!(dest.wait().unwrap().success());
    let _ = std::fs::remove_file(&csock);
}
