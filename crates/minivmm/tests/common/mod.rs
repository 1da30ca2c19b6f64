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
/// error, and its console (at `console`) and disk journal go on without a
/// lost or doubled line or request. Returns the console's line count.
pub fn source_kept_its_streams(j: &serde_json::Value, console: &Path) -> u64 {
    assert_ne!(j["status"], "completed", "{j}");
    assert!(j["error"].is_string(), "{j}");
    let lines = checks::console(&std::fs::read_to_string(console).unwrap());
    assert_eq!(
        (lines.lost, lines.doubled, lines.bad),
        (0, 0, 0),
        "{lines:?}"
    );
    let runs: Vec<[u64; 2]> = serde_json::from_value(j["disk_runs"].clone()).unwrap();
    let journal: Vec<u64> = runs.iter().flat_map(|&[a, b]| a..=b).collect();
    let disk = checks::disk(&journal);
    assert_eq!((disk.lost, disk.doubled), (0, 0), "{disk:?}");
    assert_eq!(j["guest"]["bad_reads"], 0, "{j}");
    lines.lines
}
