//! `ferry run --control`: status while running, live tunables, and a migration
//! started through the socket.

mod common;
use common::*;
use std::time::{Duration, Instant};

#[test]
fn control_socket_reports_tunes_and_migrates() {
    if !require_kvm("control socket") {
        return;
    }
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("kvm").guest("32M", 32));
    let status = ask(&sock, r#"{"cmd":"status"}"#);
    assert_eq!(status["ok"], true, "{status}");
    assert_eq!(status["progress"].as_array().unwrap().len(), 2);

    let set = ask(&sock, r#"{"cmd":"set","downtime_ms":120,"max_rounds":7}"#);
    assert_eq!(set["downtime_ms"], 120, "{set}");
    assert_eq!(set["max_rounds"], 7, "{set}");
    let throttle = ask(&sock, r#"{"cmd":"throttle","percent":30}"#);
    assert_eq!(throttle["throttle_percent"], 30, "{throttle}");
    let bad = ask(&sock, r#"{"cmd":"launch"}"#);
    assert_eq!(bad["ok"], false, "{bad}");

    let dest = Receiver::start(&[]);
    let out = Ferry::new("migrate")
        .args(&[
            "--to",
            &dest.addr,
            "--control",
            sock.to_str().unwrap(),
            "--downtime-ms",
            "300",
            "--json",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "via control socket");
    // The VM has moved: `ferry run` exits on its own.
    let code = vm.wait().unwrap();
    assert!(code.success());
    let _ = std::fs::remove_file(&sock);
}

/// `ferry migrate --control SOCK --bandwidth 16 --json EXTRA` to a fresh
/// soft destination, on a thread of its own.
fn migrate_in_background(
    sock: &std::path::Path,
    extra: &[&str],
) -> (Receiver, std::thread::JoinHandle<std::process::Output>) {
    let dest = Receiver::start(&["--backend", "soft"]);
    let mut args: Vec<String> = ["migrate", "--to", &dest.addr, "--control"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.push(sock.to_str().unwrap().to_string());
    args.extend(["--bandwidth", "16", "--json"].map(String::from));
    args.extend(extra.iter().map(|a| a.to_string()));
    let migration = std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args)
    });
    (dest, migration)
}

#[test]
fn a_throttle_reaches_a_vm_that_is_migrating() {
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").mem("32M"));
    // 16 MiB/s for a 64 MiB guest: the full pass alone takes 4 s.
    let (_dest, migration) = migrate_in_background(&sock, &[]);
    // Until the migration owns the VM, a throttle is answered by the VM's
    // thread; once it runs, the engine takes it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let reply = loop {
        let r = ask(&sock, r#"{"cmd":"throttle","percent":40}"#);
        if r.get("applies").is_some() {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the migration never started: {r}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(reply["throttle_percent"], 40, "{reply}");
    let out = migration.join().unwrap();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "throttled mid-migration");
    let applied = j["throttle_timeline"]
        .as_array()
        .is_some_and(|t| t.iter().any(|s| s["percent"] == 40));
    assert!(applied, "the throttle never reached the VM: {j}");
    assert!(vm.wait().unwrap().success());
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn the_policy_and_the_quota_interval_change_while_a_migration_runs() {
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").mem("32M"));
    // The policy is chosen per migration: with none running, a switch is
    // refused, and so is a policy that does not exist.
    let idle = ask(&sock, r#"{"cmd":"set","converge":"quota"}"#);
    assert_eq!(idle["ok"], false, "{idle}");
    let unknown = ask(&sock, r#"{"cmd":"set","converge":"faster"}"#);
    assert_eq!(unknown["ok"], false, "{unknown}");
    let short = ask(&sock, r#"{"cmd":"set","quota_interval_ms":1}"#);
    assert_eq!(short["ok"], false, "{short}");

    // An uncapped writer over 16 MiB/s under `none` would never converge.
    let (_dest, migration) = migrate_in_background(&sock, &["--converge", "none"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let reply = loop {
        let r = ask(
            &sock,
            r#"{"cmd":"set","converge":"quota","quota_interval_ms":50}"#,
        );
        if r["ok"] == true {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the migration never started: {r}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(reply["converge"], "quota", "{reply}");
    assert_eq!(reply["quota_interval_ms"], 50, "{reply}");
    let out = migration.join().unwrap();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "policy switched mid-migration");
    assert_eq!(j["converge"], "quota", "{j}");
    assert_eq!(j["converged"], true, "the quota never converged it: {j}");
    let switched = j["operator_changes"].as_array().is_some_and(|c| {
        c.iter()
            .any(|e| e["what"].as_str().unwrap_or("").contains("none -> quota"))
    });
    assert!(switched, "the switch is not in the summary: {j}");
    let quota_at_50 = j["throttle_timeline"].as_array().is_some_and(|t| {
        t.iter()
            .any(|s| s["quota_bytes"].as_u64().is_some() && s["quota_interval_ms"] == 50.0)
    });
    assert!(quota_at_50, "no quota per 50 ms was applied: {j}");
    assert!(vm.wait().unwrap().success());
    let _ = std::fs::remove_file(&sock);
}

/// Starts a soft postcopy through the socket whose source gives up at once
/// (--recover-timeout 0), and freezes its destination mid-push, beyond the
/// 1 s stall timeout. Returns the paused source, its socket and the
/// destination (waiting for a reconnection, 60 s by default), or `None`
/// when a loaded host put the freeze before the switchover or after the end.
fn postcopy_cut_by_a_freeze() -> Option<(std::process::Child, std::path::PathBuf, Receiver)> {
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").mem("32M"));
    // Nothing failed yet: nothing to resume.
    let none = ask(&sock, r#"{"cmd":"resume"}"#);
    assert!(
        none["error"]
            .as_str()
            .unwrap_or("")
            .contains("no failed postcopy"),
        "{none}"
    );
    // 16 MiB/s for 64 MiB: the postcopy push takes 4 s.
    let (dest, migration) = migrate_in_background(
        &sock,
        &[
            "--mode",
            "postcopy",
            "--stall-timeout",
            "1",
            "--recover-timeout",
            "0",
        ],
    );
    std::thread::sleep(Duration::from_millis(1500));
    let pid = dest.child.id().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let out = migration.join().unwrap();
    signal("-CONT");
    assert_no_panic(&out);
    let failed = last_json(&out);
    let error = failed["error"].as_str().unwrap_or("");
    if failed["status"] == "failed" && error.contains("stays paused") {
        return Some((vm, sock, dest));
    }
    println!("the freeze missed the postcopy push; trying again: {failed}");
    let _ = vm.kill();
    let _ = vm.wait();
    let _ = std::fs::remove_file(&sock);
    None
}

#[test]
fn a_postcopy_whose_retries_ran_out_is_resumed_through_the_socket() {
    if !std::path::Path::new("/dev/userfaultfd").exists() {
        ferry_vm::skip!("SKIP: /dev/userfaultfd absent; postcopy resume not tested");
        return;
    }
    let (mut vm, sock, mut dest) = (0..3)
        .find_map(|_| postcopy_cut_by_a_freeze())
        .expect("a freeze landed mid-push in one of 3 tries");
    // A new migration is refused while the failed postcopy holds the VM.
    let busy = ask(
        &sock,
        &format!(r#"{{"cmd":"migrate","to":"{}"}}"#, dest.addr),
    );
    assert!(
        busy["error"]
            .as_str()
            .unwrap_or("")
            .contains("resume that one"),
        "{busy}"
    );
    let out = Ferry::new("migrate")
        .args(&[
            "--to",
            &dest.addr,
            "--control",
            sock.to_str().unwrap(),
            "--resume",
            "--json",
        ])
        .run();
    assert_no_panic(&out);
    let j = last_json(&out);
    assert_verified(&j, "resumed postcopy");
    assert_eq!(j["mode"], "postcopy", "{j}");
    assert!(vm.wait().unwrap().success());
    assert!(dest.child.wait().unwrap().success());
    let _ = std::fs::remove_file(&sock);
}
