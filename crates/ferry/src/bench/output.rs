//! How every `ferry bench` ends: the report's tables on stdout, its JSON
//! and SVG written to `--out`, and with `--json` one line a script reads.
//! One place, so that each bench's outputs keep the same shape.

use crate::error::CmdError;
use ferry_report::Report;
use std::path::Path;
use std::process::ExitCode;

/// Prints a report and writes its JSON and SVG.
pub fn emit<T: serde::Serialize>(report: &Report<T>, out: &Path) -> Result<ExitCode, CmdError> {
    emit_json(report, out, false)
}

/// [`emit`], then with `json` one JSON object as the last stdout line: the
/// bench's name, where its outputs went, and its results (for the benches
/// whose `--json` has no summary of its own).
pub fn emit_json<T: serde::Serialize>(
    report: &Report<T>,
    out: &Path,
    json: bool,
) -> Result<ExitCode, CmdError> {
    print!("{}", report.render());
    let written = report.write(out)?;
    println!(
        "wrote {} and {}",
        written.json.display(),
        written.svg.display()
    );
    if json {
        let line = serde_json::json!({
            "bench": report.name,
            "json": written.json,
            "svg": written.svg,
            "results": report.results,
        });
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
