//! What minivmm's tests share: the binary, the KVM check, a demo run, a
//! destination listening, VMs' disks and consoles, and the check that a
//! source which kept its guest lost nothing.

#![allow(dead_code)]

use minivmm::serial::ConsoleOut;
use minivmm::{checks, MiniConfig};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The minivmm binary under test.
pub const EXE: &str = env!("CARGO_BIN_EXE_minivmm");

/// True if /dev/kvm is usable; otherwise prints the skip line.
#[allow(unused_imports)]
pub use ferry_kvm::require_kvm as kvm;

/// The JSON object on the last line of `stdout`.
pub fn last_json(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    ferry_harness::output::last_line_json(&text)
        .unwrap_or_else(|e| panic!("the last line is not JSON ({e}): {text}"))
}

/// A failed migration's source kept its guest: its summary `j` names the
/// error, and every vCPU's console (vCPU 0's at `console`) and disk
/// journal go on without a lost or doubled line or request. Returns the
/// consoles' line count.
pub fn source_kept_its_streams(j: &serde_json::Value, console: &Path) -> u64 {
    assert_ne!(j["status"], "completed", "{j}");
    assert!(j["error"].is_string(), "{j}");
    let vcpus = j["vcpus"].as_u64().expect("the summary names its vCPUs") as u32;
    let mut total = 0;
    for i in 0..vcpus {
        let path = minivmm::serial::console_path(console, i);
        let lines = checks::console(&std::fs::read_to_string(path).unwrap());
        assert_eq!(
            (lines.lost, lines.doubled, lines.bad),
            (0, 0, 0),
            "vCPU {i}: {lines:?}"
        );
        let runs: Vec<[u64; 2]> =
            serde_json::from_value(j["disk_runs"][i as usize].clone()).unwrap();
        let journal: Vec<u64> = runs.iter().flat_map(|&[a, b]| a..=b).collect();
        let disk = checks::disk(&journal);
        assert!(disk.requests > 0, "vCPU {i}: {disk:?}");
        assert_eq!((disk.lost, disk.doubled), (0, 0), "vCPU {i}: {disk:?}");
        total += lines.lines;
    }
    assert_eq!(j["guest"]["bad_reads"], 0, "{j}");
    total
}

/// `minivmm demo --json --data-mib 16` with `extra`: whether it succeeded,
/// and its summary.
pub fn demo_json(extra: &[&str]) -> (bool, serde_json::Value) {
    let out = Command::new(EXE)
        .args(["demo", "--json", "--data-mib", "16"])
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let j = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no summary ({e}): {stdout}\n{stderr}"));
    (out.status.success(), j)
}

/// A `minivmm receive` on loopback, its console at `console`, and the
/// address it listens on.
pub fn receiver(console: &Path) -> (Child, String) {
    receiver_with(console, &[], Stdio::null())
}

/// A [`receiver`] with `extra` arguments, its stderr to `stderr`.
pub fn receiver_with(console: &Path, extra: &[&str], stderr: Stdio) -> (Child, String) {
    let mut dest = Command::new(EXE)
        .args(["receive", "--listen", "127.0.0.1:0", "--console"])
        .arg(console)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(dest.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let said: serde_json::Value = serde_json::from_str(&first).unwrap();
    let addr = said["listening"].as_str().unwrap().to_string();
    (dest, addr)
}

/// Creates the disk image of each of `config`'s vCPUs.
pub fn make_disks(config: &MiniConfig) {
    for i in 0..config.vcpus {
        let f = std::fs::File::create(config.disk_path(i)).unwrap();
        f.set_len(minivmm::layout::DISK_BLOCKS * minivmm::layout::BLOCK_BYTES)
            .unwrap();
    }
}

/// Consoles that throw away what `n` vCPUs print.
pub fn sinks(n: u32) -> Vec<ConsoleOut> {
    (0..n)
        .map(|_| ConsoleOut::new(Box::new(std::io::sink())))
        .collect()
}

/// A console that keeps what the guest printed.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// What was printed.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}
