//! The control socket in QMP's terms, driven by `ferry ctl`: parameters,
//! a migration followed by its events, query-migrate while it runs, a
//! cancel, and the errors a QMP client can meet.

mod common;
use common::*;
use serde_json::{json, Value};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

fn ctl(sock: &std::path::Path, args: &[&str]) -> Output {
    ferry()
        .arg("ctl")
        .arg(sock)
        .args(args)
        .output()
        .expect("ferry ctl runs")
}

/// The JSON lines `ferry ctl --json` printed.
fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn statuses(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["event"] == "MIGRATION")
        .map(|e| e["data"]["status"].as_str().unwrap().to_string())
        .collect()
}

/// Polls query-migrate until `done` holds (30 s at most).
fn query_until(sock: &std::path::Path, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let q = ask(sock, r#"{"execute":"query-migrate"}"#);
        if done(&q["return"]) {
            return q["return"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "query-migrate never got there: {q}"
        );
        std::thread::sleep(Duration::from_millis(30));
    }
}

#[test]
fn ctl_sets_parameters_and_follows_a_migration_to_completion() {
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").mem("32M"));
    let idle = ask(&sock, r#"{"execute":"query-migrate","id":7}"#);
    assert_eq!(idle, json!({"return": {}, "id": 7}));

    let set = ctl(
        &sock,
        &[
            "migrate-set-parameters",
            "downtime-limit=250",
            "max-bandwidth=33554432",
            "x-converge=quota",
        ],
    );
    assert_success(&set);
    let params = ask(&sock, r#"{"execute":"query-migrate-parameters"}"#);
    assert_eq!(params["return"]["downtime-limit"], 250, "{params}");
    assert_eq!(params["return"]["max-bandwidth"], 33554432, "{params}");
    assert_eq!(params["return"]["x-converge"], "quota", "{params}");

    let dest = Receiver::start(&["--backend", "soft"]);
    let uri = format!("uri=tcp:{}", dest.addr);
    let follower = ferry()
        .arg("ctl")
        .arg(&sock)
        .args(["migrate", &uri, "--follow", "--json", "--timeout", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // 64 MiB at 32 MiB/s: query-migrate sees it under way.
    let running = query_until(&sock, |r| {
        r["status"] == "active" && r["ram"]["transferred"].as_u64() > Some(0)
    });
    // Guest RAM, with the few pages the soft backend keeps for the guest's
    // code and report.
    assert!(
        running["ram"]["total"].as_u64() >= Some(64 << 20),
        "{running}"
    );
    assert!(running["total-time"].is_u64(), "{running}");
    let busy = ask(
        &sock,
        &format!(
            r#"{{"execute":"migrate","arguments":{{"uri":"tcp:{}"}}}}"#,
            dest.addr
        ),
    );
    assert!(
        busy["error"]["desc"]
            .as_str()
            .is_some_and(|d| d.contains("in progress")),
        "a second migrate was not refused: {busy}"
    );

    let out = follower.wait_with_output().unwrap();
    assert_no_panic(&out);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let events = json_lines(&out);
    let seen = statuses(&events);
    assert_eq!(seen.first().map(String::as_str), Some("setup"), "{seen:?}");
    assert!(seen.contains(&"active".to_string()), "{seen:?}");
    assert_eq!(
        seen.last().map(String::as_str),
        Some("completed"),
        "{seen:?}"
    );
    assert!(events.iter().any(|e| e["event"] == "MIGRATION_PASS"));
    let summary = events
        .iter()
        .find(|e| e["event"] == "FERRY_MIGRATION_SUMMARY")
        .expect("a summary event");
    assert_verified(&summary["data"], "migrated through QMP");
    assert_eq!(summary["data"]["converge"], "quota", "{summary}");
    // The VM moved: `ferry run` ends on its own.
    assert!(vm.wait().unwrap().success());
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn migrate_cancel_leaves_the_source_running_and_events_say_cancelled() {
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").mem("32M"));
    // 4 MiB/s: the full pass of 64 MiB alone would take 16 s.
    assert_success(&ctl(
        &sock,
        &["migrate-set-parameters", "max-bandwidth=4194304"],
    ));
    let events = follow_events(&sock);
    let dest = Receiver::start(&["--backend", "soft"]);
    let started = ctl(&sock, &["migrate", &format!("uri=tcp:{}", dest.addr)]);
    assert_success(&started);
    query_until(&sock, |r| r["ram"]["transferred"].as_u64() > Some(0));
    assert_success(&ctl(&sock, &["migrate_cancel"]));
    let ended = query_until(&sock, |r| r["status"] == "cancelled");
    assert!(ended["error-desc"].is_string(), "{ended}");
    assert_eq!(ended["x-ferry-summary"]["status"], "failed", "{ended}");

    let out = events.wait_with_output().unwrap();
    assert_no_panic(&out);
    assert!(!out.status.success(), "events of a cancel must not exit 0");
    let seen = statuses(&json_lines(&out));
    assert_eq!(
        seen.last().map(String::as_str),
        Some("cancelled"),
        "{seen:?}"
    );

    // The source runs on, with its guest intact.
    let status = ask(&sock, r#"{"cmd":"status"}"#);
    assert_eq!(status["ok"], true, "{status}");
    let mismatches: u64 = status["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["mismatches"].as_u64().unwrap())
        .sum();
    assert_eq!(mismatches, 0, "{status}");
    let stop = ask(&sock, r#"{"cmd":"stop"}"#);
    assert_eq!(stop["ok"], true, "{stop}");
    assert!(vm.wait().unwrap().success());
    let _ = std::fs::remove_file(&sock);
}

/// QEMU's postcopy flow: the `postcopy-ram` capability, a migration that
/// stays in precopy, and `migrate-start-postcopy`, after which it switches
/// and completes, verified. query-status says the source runs until then.
#[test]
fn migrate_start_postcopy_switches_a_migration_started_with_postcopy_ram() {
    let ram = ferry_vm::GuestRam::new(&[2 << 20], ferry_vm::Backing::Anonymous).unwrap();
    if let Err(e) = ferry_vm::uffd::Placer::register_for_faults(&ram) {
        ferry_vm::skip!("SKIP: userfaultfd is unavailable here ({e})");
        return;
    }
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").mem("32M"));
    let status = ask(&sock, r#"{"execute":"query-status"}"#);
    assert_eq!(
        status["return"],
        json!({"status": "running", "running": true, "singlestep": false})
    );
    // Without a migration, or with one that cannot switch, it is refused.
    let early = ask(&sock, r#"{"execute":"migrate-start-postcopy"}"#);
    assert!(
        early["error"]["desc"]
            .as_str()
            .is_some_and(|d| d.contains("no migration")),
        "{early}"
    );
    assert_success(&ctl(
        &sock,
        &[
            "migrate-set-capabilities",
            "postcopy-ram=on",
            "dirty-limit=on",
        ],
    ));
    let caps = ask(&sock, r#"{"execute":"query-migrate-capabilities"}"#);
    assert!(
        caps["return"]
            .as_array()
            .unwrap()
            .contains(&json!({"capability": "postcopy-ram", "state": true})),
        "{caps}"
    );
    // 16 MiB/s, and a 1 ms downtime limit that a running guest never
    // meets: precopy would go on to its round cap; the switch ends it.
    assert_success(&ctl(
        &sock,
        &[
            "migrate-set-parameters",
            "max-bandwidth=16777216",
            "downtime-limit=1",
        ],
    ));
    let events = follow_events(&sock);
    let dest = Receiver::start(&["--backend", "soft"]);
    let started = ctl(&sock, &["migrate", &format!("uri=tcp:{}", dest.addr)]);
    assert_success(&started);
    query_until(&sock, |r| {
        r["status"] == "active" && r["ram"]["transferred"].as_u64() > Some(0)
    });
    let status = ask(&sock, r#"{"execute":"query-status"}"#);
    assert_eq!(status["return"]["running"], true, "{status}");
    assert_success(&ctl(&sock, &["migrate-start-postcopy"]));
    // The switch comes at the end of the round under way; then the cap
    // is lifted so that the push of the rest does not take long.
    query_until(&sock, |r| r["status"] == "postcopy-active");
    let status = ask(&sock, r#"{"execute":"query-status"}"#);
    assert_eq!(status["return"]["status"], "postmigrate", "{status}");
    assert_success(&ctl(&sock, &["migrate-set-parameters", "max-bandwidth=0"]));
    let out = events.wait_with_output().unwrap();
    assert_no_panic(&out);
    let events = json_lines(&out);
    let seen = statuses(&events);
    assert!(seen.contains(&"postcopy-active".to_string()), "{seen:?}");
    assert_eq!(
        seen.last().map(String::as_str),
        Some("completed"),
        "{seen:?}"
    );
    let summary = events
        .iter()
        .find(|e| e["event"] == "FERRY_MIGRATION_SUMMARY")
        .expect("a summary event")["data"]
        .clone();
    assert_verified(&summary, "switched by migrate-start-postcopy");
    assert_eq!(summary["mode"], "hybrid", "{summary}");
    let kinds: Vec<&str> = summary["round_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.last(), Some(&"postcopy"), "{kinds:?}");
    assert!(
        summary["operator_changes"]
            .to_string()
            .contains("switch to postcopy"),
        "{summary}"
    );
    assert!(vm.wait().unwrap().success());
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn qmp_errors_are_in_qmps_shape_and_name_the_problem() {
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").mem("8M"));
    let cases = [
        (
            r#"{"execute":"launch","id":"a"}"#,
            "CommandNotFound",
            "launch",
        ),
        (r#"{"execute":7}"#, "GenericError", "execute"),
        (
            r#"{"execute":"query-migrate","extra":1}"#,
            "GenericError",
            "extra",
        ),
        (
            r#"{"execute":"query-migrate","arguments":{"x":1}}"#,
            "GenericError",
            "'x'",
        ),
        (
            r#"{"execute":"migrate-set-parameters","arguments":{"downtime-limit":"soon"}}"#,
            "GenericError",
            "whole number",
        ),
        (
            r#"{"execute":"migrate-set-parameters","arguments":{"x-converge":"faster"}}"#,
            "GenericError",
            "faster",
        ),
        (
            r#"{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"xbzrle","state":true}]}}"#,
            "GenericError",
            "xbzrle",
        ),
        (
            r#"{"execute":"migrate","arguments":{"uri":"unix:/x"}}"#,
            "GenericError",
            "tcp",
        ),
        (
            r#"{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:1","connections":0}}"#,
            "GenericError",
            "connections",
        ),
        (
            r#"{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:1","warp":9}}"#,
            "GenericError",
            "warp",
        ),
        (
            r#"{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:1","resume":true}}"#,
            "GenericError",
            "no paused postcopy",
        ),
    ];
    for (request, class, says) in cases {
        let reply = ask(&sock, request);
        assert_eq!(reply["error"]["class"], class, "{request} -> {reply}");
        let desc = reply["error"]["desc"].as_str().unwrap_or("");
        assert!(desc.contains(says), "{request} -> {reply}");
    }
    assert_eq!(
        ask(&sock, r#"{"execute":"launch","id":"a"}"#)["id"],
        "a",
        "the id is echoed"
    );
    // Nothing above changed a parameter.
    let params = ask(&sock, r#"{"execute":"query-migrate-parameters"}"#);
    assert_eq!(params["return"]["downtime-limit"], 300, "{params}");
    assert_eq!(params["return"]["x-converge"], Value::Null, "{params}");

    // ferry ctl: a usage error, an unknown command, a missing socket.
    let bad = ctl(&sock, &["migrate", "uri"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("NAME=VALUE"));
    let unknown = ctl(&sock, &["launch"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("has not been found"));
    let nowhere = Ferry::new("ctl")
        .args(&["/nonexistent/ferry.sock", "query-migrate"])
        .run();
    assert!(!nowhere.status.success());
    assert!(String::from_utf8_lossy(&nowhere.stderr).contains("cannot reach control socket"));

    let stop = ask(&sock, r#"{"cmd":"stop"}"#);
    assert_eq!(stop["ok"], true, "{stop}");
    assert!(vm.wait().unwrap().success());
    let _ = std::fs::remove_file(&sock);
}

/// `--qmp` is QEMU's monitor in shape: a greeting first, then nothing but
/// `qmp_capabilities` until it was sent, then QMP only. `ferry ctl` speaks
/// it as it speaks the `--control` socket.
#[test]
fn the_qmp_socket_greets_and_negotiates_as_qemus_does() {
    let qsock = std::env::temp_dir().join(format!("ferry-test-qmp-{}.sock", std::process::id()));
    let qarg = qsock.to_str().unwrap().to_string();
    let (mut vm, sock) = run_with_control(
        Ferry::new("run")
            .on("soft")
            .mem("8M")
            .args(&["--qmp", &qarg]),
    );
    // The sockets are served one after the other: wait for this one too.
    let deadline = Instant::now() + Duration::from_secs(30);
    let conn = loop {
        match std::os::unix::net::UnixStream::connect(&qsock) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "no QMP socket: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = conn.try_clone().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(conn));
    let mut next = || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let greeting = next();
    assert!(greeting["QMP"]["version"]["package"]
        .as_str()
        .is_some_and(|p| p.starts_with("ferry")));
    let mut say =
        |line: &str| std::io::Write::write_all(&mut out, format!("{line}\n").as_bytes()).unwrap();
    say(r#"{"execute":"query-migrate","id":1}"#);
    let early = next();
    assert_eq!(early["error"]["class"], "CommandNotFound", "{early}");
    assert!(early["error"]["desc"]
        .as_str()
        .unwrap()
        .contains("qmp_capabilities"));
    assert_eq!(early["id"], 1);
    say(r#"{"cmd":"status"}"#);
    let lines_req = next();
    assert!(
        lines_req["error"]["desc"]
            .as_str()
            .unwrap()
            .contains("--control"),
        "{lines_req}"
    );
    say(r#"{"execute":"qmp_capabilities"}"#);
    assert_eq!(next(), json!({"return": {}}));
    say(r#"{"execute":"qmp_capabilities"}"#);
    let again = next();
    assert!(
        again["error"]["desc"]
            .as_str()
            .unwrap()
            .contains("already complete"),
        "{again}"
    );
    say(r#"{"execute":"query-status","id":"s"}"#);
    assert_eq!(
        next(),
        json!({"return": {"status": "running", "running": true, "singlestep": false}, "id": "s"})
    );
    // ferry ctl negotiates by itself; what it sets is seen on both sockets.
    assert_success(&ctl(
        &qsock,
        &["migrate-set-parameters", "downtime-limit=123"],
    ));
    let params = ask(&sock, r#"{"execute":"query-migrate-parameters"}"#);
    assert_eq!(params["return"]["downtime-limit"], 123, "{params}");
    let stop = ask(&sock, r#"{"cmd":"stop"}"#);
    assert_eq!(stop["ok"], true, "{stop}");
    assert!(vm.wait().unwrap().success());
    assert!(!qsock.exists(), "the QMP socket is removed on exit");
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn the_qmp_socket_reads_a_json_stream_and_ends_messages_with_crlf() {
    let qsock =
        std::env::temp_dir().join(format!("ferry-test-qmp-stream-{}.sock", std::process::id()));
    let qarg = qsock.to_str().unwrap().to_string();
    let (mut vm, sock) = run_with_control(
        Ferry::new("run")
            .on("soft")
            .mem("8M")
            .args(&["--qmp", &qarg]),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let conn = loop {
        match std::os::unix::net::UnixStream::connect(&qsock) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "no QMP socket: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = conn.try_clone().unwrap();
    let mut reader = std::io::BufReader::new(conn);
    let mut next = || -> Value {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
        assert!(
            line.ends_with("\r\n"),
            "QMP ends a message with CRLF: {line:?}"
        );
        serde_json::from_str(&line).unwrap()
    };
    let mut send = |bytes: &str| {
        std::io::Write::write_all(&mut out, bytes.as_bytes()).unwrap();
        std::io::Write::flush(&mut out).unwrap();
    };
    assert!(next()["QMP"].is_object(), "the greeting");
    // As qemu.qmp sends it: no newline after the command.
    send(r#"{"execute": "qmp_capabilities"}"#);
    assert_eq!(next(), json!({"return": {}}));
    // A command split across two writes.
    send(r#"{"execute": "query-st"#);
    std::thread::sleep(Duration::from_millis(50));
    send(r#"atus", "id": 1}"#);
    let status = next();
    assert_eq!(status["return"]["status"], "running", "{status}");
    assert_eq!(status["id"], 1);
    // Two commands in one write, no whitespace between them.
    send(r#"{"execute":"query-name","id":2}{"execute":"query-migrate","id":3}"#);
    let (a, b) = (next(), next());
    assert_eq!((&a["id"], &b["id"]), (&json!(2), &json!(3)), "{a} {b}");
    // A syntax error gets QEMU's reply, and the next command is read.
    send("nonsense {\"execute\":\"query-status\",\"id\":4}\n");
    let err = next();
    assert_eq!(err["error"]["class"], "GenericError", "{err}");
    assert!(err["error"]["desc"]
        .as_str()
        .unwrap()
        .contains("JSON parse error"));
    assert_eq!(next()["id"], 4);
    let stop = ask(&sock, r#"{"cmd":"stop"}"#);
    assert_eq!(stop["ok"], true, "{stop}");
    assert!(vm.wait().unwrap().success());
}
