//! No process outlives the command that started it: the demo's destination
//! dies with the demo, even when the demo is killed with SIGKILL.

mod common;
use common::*;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn the_destination_dies_with_a_killed_demo() {
    let mut demo = ferry()
        .args(["demo", "--backend", "soft", "--mem-per-vcpu", "32M"])
        .args(["--rate-limit", "8", "--warmup", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // "... destination pid N on ADDR"
    let mut stderr = demo.stderr.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    let pid: u32 = loop {
        let n = stderr.read(&mut buf).unwrap();
        assert!(n > 0, "demo ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        if let Some(p) = seen
            .split("destination pid ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|p| p.parse().ok())
        {
            break p;
        }
    };
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    demo.kill().unwrap();
    demo.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        // A zombie of ours would stay listed; the destination is the demo's child,
        // reaped by init once the demo is gone.
        assert!(
            Instant::now() < deadline,
            "destination {pid} outlived the demo"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
