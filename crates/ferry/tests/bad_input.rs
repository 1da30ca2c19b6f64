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
    let out = run(&["demo", "--vcpus", "1", "--mem-per-vcpu", "160G"]);
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

#[test]
fn garbage_stream_is_refused_by_the_destination() {
    let mut dest = Receiver::start(&[]);
    let mut s = std::net::TcpStream::connect(&dest.addr).unwrap();
    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: ferry\r\n\r\n");
    let _ = s.write_all(&[0xa5; 4096]);
    drop(s);
    let (ok, stderr) = dest.finish();
    assert!(!ok);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("not a ferry migration stream"),
        "unclear error: {stderr}"
    );
}

#[test]
fn destination_with_other_memory_size_is_refused() {
    if !require_kvm("memory-size mismatch") {
        return;
    }
    let dest = Receiver::start(&["--memory", "2G"]);
    let out = run(&[
        "migrate",
        "--to",
        &dest.addr,
        "--json",
        "--mem-per-vcpu",
        "64M",
        "--warmup",
        "0",
    ]);
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
fn stream_of_another_version_is_refused_by_the_destination() {
    let mut dest = Receiver::start(&[]);
    let mut s = std::net::TcpStream::connect(&dest.addr).unwrap();
    let mut preamble = b"FERRYMIG".to_vec();
    preamble.extend_from_slice(&99u32.to_le_bytes());
    preamble.extend_from_slice(&[0; 4]);
    let _ = s.write_all(&preamble);
    drop(s);
    let (ok, stderr) = dest.finish();
    assert!(!ok);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("version 99"), "unclear error: {stderr}");
}
