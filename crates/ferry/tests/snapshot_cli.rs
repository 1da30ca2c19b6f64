//! `ferry snapshot` and `ferry restore` against running VMs: a guest saved
//! through its control socket while it writes, restored in each mode and
//! checked by its own stamps and the digest; a restored guest saved again;
//! QMP's `migrate` to a `file:` URI, which leaves the guest paused as
//! QEMU's does; a cancelled snapshot, which leaves the guest running and
//! no file; and the refusals.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

/// A directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferry-snapcli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn snapshot(sock: &Path, file: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "snapshot",
        sock.to_str().unwrap(),
        file.to_str().unwrap(),
        "--json",
    ];
    args.extend(extra);
    run(&args)
}

/// `ferry restore FILE --exit-after-restore --json` in `mode`: its summary,
/// checked as every verified restore must be.
fn restore_checked(file: &Path, mode: &str, context: &str) -> Value {
    let out = run(&[
        "restore",
        file.to_str().unwrap(),
        "--mode",
        mode,
        "--exit-after-restore",
        "--json",
    ]);
    assert_no_panic(&out);
    let j = last_json(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{context}, {mode}: {stderr}\n{j}");
    assert_eq!(j["status"], "restored", "{context}, {mode}: {j}");
    assert_eq!(j["digest_match"], true, "{context}, {mode}: {j}");
    assert_eq!(j["mismatches_before"], 0, "{context}, {mode}: {j}");
    assert_eq!(j["mismatches_after"], 0, "{context}, {mode}: {j}");
    assert!(
        j["dest_passes_after"].as_u64().unwrap() >= 1,
        "{context}, {mode}: {j}"
    );
    assert_eq!(j["restore"]["mode"], mode, "{j}");
    j
}

/// Waits for `vm` to exit after a stop, and says whether it exited 0.
fn stop(vm: &mut Child, sock: &Path) -> bool {
    let reply = ask(sock, r#"{"cmd":"stop"}"#);
    assert_eq!(reply["ok"], true, "{reply}");
    vm.wait().unwrap().success()
}

/// The guest's passes so far, from the control socket.
fn passes(sock: &Path) -> u64 {
    let s = ask(sock, r#"{"cmd":"status"}"#);
    assert_eq!(s["ok"], true, "{s}");
    s["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["passes"].as_u64().unwrap())
        .sum()
}

/// Waits until the guest's passes grow: it runs.
fn assert_runs(sock: &Path, context: &str) {
    let before = passes(sock);
    let deadline = Instant::now() + Duration::from_secs(30);
    while passes(sock) <= before {
        assert!(
            Instant::now() < deadline,
            "{context}: the guest does not run"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ferry restore FILE --control SOCK` (and `extra`), once its socket
/// answers: the restored VM, served.
fn restore_serving(file: &Path, sock: &Path, extra: &[&str]) -> Child {
    let vm = ferry()
        .arg("restore")
        .arg(file)
        .arg("--control")
        .arg(sock)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        assert!(
            Instant::now() < deadline,
            "the restored VM's socket never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    vm
}

#[test]
fn a_running_guest_is_saved_through_its_socket_and_restored_in_every_mode() {
    for backend in backends("ferry snapshot") {
        let dir = scratch(backend);
        let file = dir.join("vm.snap");
        let (mut vm, sock) = run_with_control(Ferry::new("run").on(backend).guest("32M", 64));
        assert_runs(&sock, "before the snapshot");
        let out = snapshot(&sock, &file, &[]);
        assert_no_panic(&out);
        let j = last_json(&out);
        assert!(out.status.success(), "{backend}: {j}");
        assert_eq!(j["status"], "completed", "{j}");
        assert_eq!(j["stopped"], false, "{j}");
        for key in ["total_ms", "pause_ms", "bytes"] {
            assert!(j[key].as_f64().unwrap() > 0.0, "{key}: {j}");
        }
        assert_eq!(
            std::fs::metadata(&file).unwrap().len(),
            j["file_bytes"].as_u64().unwrap()
        );
        // What the file holds, its parts checked, without restoring it.
        let out = run(&["restore", file.to_str().unwrap(), "--inspect", "--json"]);
        let info = last_json(&out);
        assert!(out.status.success(), "{info}");
        assert_eq!(info["working_set_pages"], j["working_set_pages"], "{info}");
        assert_eq!(info["digest"], j["digest"], "{info}");
        assert_eq!(info["vcpus"], 2, "{info}");
        // Without --stop, the guest runs on after its snapshot.
        assert_runs(&sock, "after the snapshot");
        assert!(stop(&mut vm, &sock), "{backend}: the source's own checks");

        for mode in ["eager", "lazy", "lazy-working-set"] {
            restore_checked(&file, mode, backend);
        }

        // A restored guest is served: it can be saved again, and --stop
        // leaves it paused for a cont.
        let sock2 = dir.join("restored.sock");
        let mut restored = restore_serving(&file, &sock2, &[]);
        assert_runs(&sock2, "restored");
        let file2 = dir.join("again.snap");
        let out = snapshot(&sock2, &file2, &["--stop"]);
        let j = last_json(&out);
        assert!(out.status.success(), "{backend}: {j}");
        assert_eq!(j["stopped"], true, "{j}");
        let status = ask(&sock2, r#"{"execute":"query-status"}"#);
        assert_eq!(status["return"]["status"], "paused", "{status}");
        let cont = ask(&sock2, r#"{"execute":"cont"}"#);
        assert!(cont.get("return").is_some(), "{cont}");
        assert_runs(&sock2, "after cont");
        assert!(
            stop(&mut restored, &sock2),
            "{backend}: the restored guest's checks"
        );
        restore_checked(&file2, "eager", "saved again");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn qmp_migrate_to_a_file_saves_the_guest_and_leaves_it_paused() {
    let dir = scratch("qmp");
    let file = dir.join("vm.snap");
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").guest("32M", 64));
    let uri = format!("uri=file:{}", file.display());
    let out = run(&[
        "ctl",
        sock.to_str().unwrap(),
        "migrate",
        &uri,
        "--follow",
        "--json",
        "--timeout",
        "120",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let statuses: Vec<String> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "MIGRATION")
        .map(|e| e["data"]["status"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        statuses.last().map(String::as_str),
        Some("completed"),
        "{stdout}"
    );
    assert!(statuses.iter().any(|s| s == "active"), "{stdout}");
    let q = ask(&sock, r#"{"execute":"query-migrate"}"#);
    assert_eq!(q["return"]["status"], "completed", "{q}");
    assert!(
        q["return"]["ram"]["transferred"].as_u64().unwrap() > 0,
        "{q}"
    );
    // As QEMU leaves it: stopped, its state the file's, until cont.
    let status = ask(&sock, r#"{"execute":"query-status"}"#);
    assert_eq!(status["return"]["status"], "paused", "{status}");
    let cont = ask(&sock, r#"{"execute":"cont"}"#);
    assert!(cont.get("return").is_some(), "{cont}");
    assert_runs(&sock, "after cont");
    assert!(stop(&mut vm, &sock));
    restore_checked(&file, "lazy-working-set", "QMP's file");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cancelled_snapshot_leaves_the_guest_running_and_no_file() {
    let dir = scratch("cancel");
    let file = dir.join("vm.snap");
    std::fs::write(&file, b"what was here before").unwrap();
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").guest("32M", 64));
    // 2 MiB/s for 64 MiB of guest: the first round alone takes half a
    // minute, so the cancel lands in it.
    let set = ask(&sock, r#"{"cmd":"set","bandwidth_mib_s":2}"#);
    assert_eq!(set["ok"], true, "{set}");
    let (s, f) = (sock.clone(), file.clone());
    let saving = std::thread::spawn(move || snapshot(&s, &f, &[]));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let q = ask(&sock, r#"{"execute":"query-migrate"}"#);
        if q["return"]["status"] == "active" {
            break;
        }
        assert!(Instant::now() < deadline, "the snapshot never started: {q}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let cancel = ask(&sock, r#"{"execute":"migrate_cancel"}"#);
    assert!(cancel.get("return").is_some(), "{cancel}");
    let out = saving.join().unwrap();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cancelled"), "{stderr}");
    let q = ask(&sock, r#"{"execute":"query-migrate"}"#);
    assert_eq!(q["return"]["status"], "cancelled", "{q}");
    // What the file held is untouched, and no partial file is left.
    assert_eq!(std::fs::read(&file).unwrap(), b"what was here before");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    assert_runs(&sock, "after the cancel");
    assert!(stop(&mut vm, &sock));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn snapshot_and_restore_refuse_bad_input_in_words() {
    let dir = scratch("bad");
    let missing = dir.join("none.snap");
    let out = run(&["restore", missing.to_str().unwrap()]);
    assert_no_panic(&out);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("none.snap"), "{stderr}");

    let junk = dir.join("junk.snap");
    std::fs::write(&junk, vec![7u8; 8192]).unwrap();
    let out = run(&["restore", junk.to_str().unwrap()]);
    assert_no_panic(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a ferry snapshot"), "{stderr}");

    let out = run(&["restore", junk.to_str().unwrap(), "--inspect"]);
    assert_no_panic(&out);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a ferry snapshot"), "{stderr}");

    let out = run(&["restore", junk.to_str().unwrap(), "--mode", "sideways"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lazy-working-set"), "{stderr}");

    let out = run(&[
        "snapshot",
        dir.join("no.sock").to_str().unwrap(),
        missing.to_str().unwrap(),
    ]);
    assert_no_panic(&out);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no.sock"), "{stderr}");

    // A soft VM's snapshot, restored on --backend kvm, is refused naming both.
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").mem("16M"));
    let relative = ask(
        &sock,
        r#"{"execute":"migrate","arguments":{"uri":"file:vm.snap"}}"#,
    );
    assert!(
        relative["error"]["desc"]
            .as_str()
            .unwrap()
            .contains("absolute"),
        "{relative}"
    );
    let file = dir.join("soft.snap");
    assert!(snapshot(&sock, &file, &[]).status.success());
    assert!(stop(&mut vm, &sock));
    let out = run(&["restore", file.to_str().unwrap(), "--backend", "kvm"]);
    assert_no_panic(&out);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("soft") && stderr.contains("kvm"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_diff_snapshot_holds_what_changed_and_a_merge_flattens_its_chain() {
    let dir = scratch("diff");
    let (full, diff, merged) = (
        dir.join("full.snap"),
        dir.join("diff.snap"),
        dir.join("merged.snap"),
    );
    // The guest writes a tenth of its memory; the rest keeps its boot fill.
    let (mut vm, sock) = run_with_control(Ferry::new("run").on("soft").guest("32M", 64).args(&[
        "--hot-percent",
        "10",
        "--fill",
        "text",
    ]));
    let f = last_json(&snapshot(&sock, &full, &[]));
    let out = snapshot(&sock, &diff, &["--parent", full.to_str().unwrap()]);
    let d = last_json(&out);
    assert!(out.status.success(), "{d}");
    let (full_pages, diff_pages) = (
        f["data_pages"].as_u64().unwrap(),
        d["data_pages"].as_u64().unwrap(),
    );
    assert!(
        diff_pages > 0 && diff_pages * 3 < full_pages,
        "the diff holds {diff_pages} pages, the full snapshot {full_pages}"
    );
    assert!(stop(&mut vm, &sock));
    let info = last_json(&run(&[
        "restore",
        diff.to_str().unwrap(),
        "--inspect",
        "--json",
    ]));
    assert_eq!(info["parent"], full.to_str().unwrap(), "{info}");
    restore_checked(&diff, "lazy-working-set", "a diff");

    let out = run(&[
        "snapshot",
        "--merge",
        diff.to_str().unwrap(),
        merged.to_str().unwrap(),
        "--json",
    ]);
    let m = last_json(&out);
    assert!(out.status.success(), "{m}");
    assert_eq!(m["chain"], 2, "{m}");
    std::fs::remove_file(&full).unwrap();
    // Without its parent the diff is refused, naming it; the merged file
    // needs none.
    let out = run(&["restore", diff.to_str().unwrap(), "--exit-after-restore"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("full.snap"), "{stderr}");
    restore_checked(&merged, "eager", "merged");
    let _ = std::fs::remove_dir_all(&dir);
}
