//! `--to` and `--listen` over the VMM's own transports: a UNIX socket, and
//! connected sockets handed in as inherited fds (as an orchestrator does,
//! and QEMU's `fd:` URI takes). Each migration proves itself as every other
//! does.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Stdio;

/// `ferry ARGS` with `fds` as its fds 3, 4, ...
fn with_fds(args: &[&str], fds: &[RawFd]) -> std::process::Command {
    let mut cmd = ferry();
    cmd.args(args);
    let fds = fds.to_vec();
    // Each fd is first copied above 100, so that one already at 3.. is
    // neither overwritten nor left close-on-exec.
    // SAFETY: runs in the forked child before exec; fcntl and dup2 are
    // async-signal-safe, and nothing is allocated (the Vec predates fork).
    unsafe {
        cmd.pre_exec(move || {
            let mut high = [0; 8];
            for (i, fd) in fds.iter().enumerate() {
                high[i] = libc::fcntl(*fd, libc::F_DUPFD, 100);
                if high[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, fd) in high.iter().take(fds.len()).enumerate() {
                if libc::dup2(*fd, 3 + i as libc::c_int) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd
}

#[test]
fn a_migration_over_a_unix_socket() {
    let path = std::env::temp_dir().join(format!("ferry-cli-unix-{}.sock", std::process::id()));
    let listen = format!("unix:{}", path.display());
    let mut dest = ferry()
        .args([
            "receive",
            "--backend",
            "soft",
            "--exit-after-report",
            "--json",
        ])
        .args(["--listen", &listen])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(dest.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("listening on {listen}"));
    let src = Ferry::new("migrate")
        .on("soft")
        .guest("32M", 32)
        .args(&[
            "--to",
            &listen,
            "--connections",
            "2",
            "--json",
            "--warmup",
            "0.3",
        ])
        .run();
    assert_no_panic(&src);
    let j = last_json(&src);
    assert_verified(&j, "over unix");
    // One host: the source let the resumed guest run before it hashed.
    assert!(j["digest_yield_ms"].as_f64().unwrap() > 0.0, "{j}");
    let status = dest.wait().unwrap();
    let mut summary = String::new();
    std::io::Read::read_to_string(&mut out, &mut summary).unwrap();
    let d: serde_json::Value = serde_json::from_str(summary.lines().last().unwrap()).unwrap();
    assert!(status.success(), "{d}");
    assert_eq!(
        (d["digest_match"].as_bool(), d["mismatches_after"].as_u64()),
        (Some(true), Some(0))
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_migration_over_inherited_fds() {
    // The orchestrator's connections: the main channel and one data
    // connection.
    let pairs: Vec<(UnixStream, UnixStream)> =
        (0..2).map(|_| UnixStream::pair().unwrap()).collect();
    let src_fds: Vec<RawFd> = pairs.iter().map(|p| p.0.as_raw_fd()).collect();
    let dst_fds: Vec<RawFd> = pairs.iter().map(|p| p.1.as_raw_fd()).collect();
    let dest = with_fds(
        &[
            "receive",
            "--backend",
            "soft",
            "--exit-after-report",
            "--json",
            "--listen",
            "fd:3,4",
        ],
        &dst_fds,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let src = with_fds(
        &[
            "migrate",
            "--backend",
            "soft",
            "--mem-per-vcpu",
            "32M",
            "--rate-limit",
            "32",
        ],
        &src_fds,
    )
    .args(["--to", "fd:3,4", "--json", "--warmup", "0.3"])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Only the two processes hold the connections now.
    drop(pairs);
    let src = src.wait_with_output().unwrap();
    assert_no_panic(&src);
    assert_verified(&last_json(&src), "over inherited fds");
    let dst = dest.wait_with_output().unwrap();
    assert!(
        dst.status.success(),
        "{}",
        String::from_utf8_lossy(&dst.stderr)
    );
    let d = last_json(&dst);
    assert_eq!(d["digest_match"], true, "{d}");
    assert_eq!(d["mismatches_after"], 0, "{d}");
}

#[test]
fn too_few_inherited_fds_and_tls_over_unix_are_refused_in_words() {
    let (a, _b) = UnixStream::pair().unwrap();
    let out = with_fds(
        &["migrate", "--backend", "soft", "--mem-per-vcpu", "8M"],
        &[a.as_raw_fd()],
    )
    .args(["--to", "fd:3", "--json", "--warmup", "0.1"])
    .output()
    .unwrap();
    assert_no_panic(&out);
    assert!(!out.status.success());
    let j = last_json(&out);
    assert!(
        j["error"] == "the migration opens 2 connections (1 main, 1 data), and 1 were handed over",
        "{j}"
    );
    let out = Ferry::new("receive")
        .args(&["--listen", "unix:/tmp/x.sock", "--tls-dir", "/tmp"])
        .run();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tls-dir runs over TCP, not unix:/tmp/x.sock"),
        "{err}"
    );
}
