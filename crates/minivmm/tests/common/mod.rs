//! What the CLI tests share: the binary, the KVM check, and the check that
//! a source which kept its guest lost nothing.

#![allow(dead_code)]

use minivmm::checks;
use std::path::Path;

/// The minivmm binary under test.
pub const EXE: &str = env!("CARGO_BIN_EXE_minivmm");

/// True if /dev/kvm is usable; otherwise prints the skip line.
#[allow(unused_imports)]
pub use ferry_kvm::require_kvm as kvm;

/// The JSON object on the last line of `stdout`.
pub fn last_json(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
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
