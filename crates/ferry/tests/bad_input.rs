//! Bad input gets a clear error and a non-zero exit, never a panic.

mod common;
use common::*;
use std::io::Write;

#[test]
fn nonsense_cli_values_are_refused() {
    let cases: &[&[&str]] = &[
        &["demo", "--vcpus", "0"],
        &["demo", "--vcpus", "many"],
        &["demo", "--mem-per-vcpu", "3M"],
        &["demo", "--mem-per-vcpu", "12Q"],
        &["demo", "--write-percent", "200"],
        &["demo", "--dirty-tracking", "telepathy"],
        &["demo", "--dirty-tracking", "clear", "--clear-chunk", "100"],
        &["demo", "--dirty-tracking", "ring", "--ring-entries", "1000"],
        &["demo", "--backing", "paper"],
        &["migrate", "--to", "not-an-address:xx"],
        &["receive", "--listen", "300.1.1.1:1"],
        &["bench", "dirty-log", "--iterations", "0"],
        &["demo", "--connections", "0"],
        &["demo", "--connections", "65"],
        &["demo", "--connections", "lots"],
        &["demo", "--compress", "gzip"],
        &["demo", "--fill", "ones"],
        &["demo", "--stall-timeout", "0"],
        &["receive", "--listen", "127.0.0.1:0", "--stall-timeout", "0"],
        &["frobnicate"],
    ];
    for args in cases {
        let out = run(args);
        assert_no_panic(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("error"),
            "{args:?}: no error message:\n{stderr}"
        );
    }
}

#[test]
fn a_guest_larger_than_the_host_is_refused_at_once_with_both_sizes() {
    // 160 GiB: within what a layout supports, beyond any of our hosts.
    let out = Ferry::new("demo").mem("160G").args(&["--vcpus", "1"]).run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("guest needs 160.")
            && stderr.contains("this host has")
            && stderr.contains("available"),
        "{stderr}"
    );
}

/// Sends `bytes` on a stray connection to a fresh soft destination, waits
/// for its refusal (which must contain `reason`), then checks that it still
/// receives a real migration.
fn refuses_and_keeps_listening(bytes: &[u8], reason: &str) {
    let mut dest = Receiver::start(&["--backend", "soft"]);
    let mut s = std::net::TcpStream::connect(&dest.addr).unwrap();
    let _ = s.write_all(bytes);
    drop(s);
    let stderr = dest.child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let refusal = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the destination says why it refused the connection");
    assert!(!refusal.contains("panicked"), "{refusal}");
    assert!(
        refusal.contains(reason) && refusal.contains("still listening"),
        "unclear refusal: {refusal}"
    );
    assert!(
        dest.child.try_wait().unwrap().is_none(),
        "the destination exited"
    );
    let out = Ferry::new("migrate")
        .on("soft")
        .mem("64M")
        .args(&[
            "--to", &dest.addr, "--vcpus", "1", "--warmup", "0", "--json",
        ])
        .run();
    assert_no_panic(&out);
    assert_verified(&last_json(&out), "a migration after a stray connection");
    assert!(dest.child.wait().unwrap().success());
}

#[test]
fn garbage_stream_is_refused_and_the_destination_listens_on() {
    let mut junk = b"GET / HTTP/1.1\r\nHost: ferry\r\n\r\n".to_vec();
    junk.extend_from_slice(&[0xa5; 4096]);
    refuses_and_keeps_listening(&junk, "not a ferry migration stream");
}

#[test]
fn destination_with_other_memory_size_is_refused() {
    if !require_kvm("memory-size mismatch") {
        return;
    }
    let dest = Receiver::start(&["--memory", "2G"]);
    let out = Ferry::new("migrate")
        .mem("64M")
        .args(&["--to", &dest.addr, "--json", "--warmup", "0"])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let j = last_json(&out);
    assert_eq!(j["status"], "failed");
    let err = j["error"].as_str().unwrap();
    assert!(
        err.contains("destination has 2.0 GiB of guest memory, stream carries 128.0 MiB"),
        "unclear error: {err}"
    );
}

#[test]
fn stream_of_another_version_is_refused_and_the_destination_listens_on() {
    let mut preamble = b"FERRYMIG".to_vec();
    preamble.extend_from_slice(&99u32.to_le_bytes());
    preamble.extend_from_slice(&[0; 4]);
    refuses_and_keeps_listening(&preamble, "version 99");
}

#[test]
fn a_receiver_that_waits_in_vain_gives_up_at_its_deadline() {
    let out = Ferry::new("receive")
        .args(&["--listen", "127.0.0.1:0", "--wait", "1"])
        .run();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no connection from the source on 127.0.0.1:") && err.contains(" s"),
        "{err}"
    );
}
