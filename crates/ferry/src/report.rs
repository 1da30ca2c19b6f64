//! `ferry demo --report FILE.html`: one migration as a page a browser
//! opens offline. What a person checks first comes first: did it verify,
//! how long was the pause against its prediction; then the timeline, each
//! round, each throttle change and the prediction. The summary's JSON goes
//! beside it (FILE.json), linked from the page.

use crate::error::CmdError;
use crate::summary::DestinationChecks;
use ferry_engine::MigrationSummary;
use ferry_report::html::Page;
use ferry_report::{Chart, Table};
use std::path::Path;

/// Writes the page of migration `s` to `path`, and its JSON beside it.
pub fn write(path: &Path, s: &MigrationSummary, after: &DestinationChecks) -> Result<(), CmdError> {
    let failed = |what: &Path, e: &dyn std::fmt::Display| {
        CmdError::Failed(format!("cannot write the report {}: {e}", what.display()))
    };
    let json_path = path.with_extension("json");
    let json = crate::summary::json(s, after);
    let text = serde_json::to_string_pretty(&json).map_err(|e| failed(&json_path, &e))?;
    ferry_report::write_file(&json_path, text.as_bytes()).map_err(|e| failed(&json_path, &e))?;
    let title = format!(
        "ferry demo: {} backend, {} dirty tracking, {}",
        s.backend,
        s.memory.dirty_tracking,
        format!("{:?}", s.status).to_lowercase()
    );
    let timeline = crate::timeline::of(&json, "the migration over time".into());
    let [rounds, totals] = crate::summary::tables(s, after);
    let mut tables: Vec<Table> = vec![totals, rounds, crate::summary::throttle_changes(s)];
    if let Some(p) = &s.convergence.predicted {
        tables.push(crate::forecast::table(p));
    }
    let json_name = json_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let page = Page {
        title: &title,
        intro: &verdicts(s, after),
        tables: &tables,
        charts: &[Chart::from(timeline)],
        json: Some(&json_name),
        others: &[],
    }
    .render()
    .map_err(|e| failed(path, &e))?;
    ferry_report::write_file(path, page.as_bytes()).map_err(|e| failed(path, &e))
}

/// The checks, one line each: the digest, the guest's own, the pause.
fn verdicts(s: &MigrationSummary, after: &DestinationChecks) -> Vec<String> {
    let digest = match (s.digest_checked, s.digest_match) {
        (false, _) => "not reached".to_string(),
        (true, true) => "match: every page on the destination is the source's".into(),
        (true, false) => "MISMATCH".into(),
    };
    let count = |n: Option<u64>| n.map_or_else(|| "not counted".into(), |n| n.to_string());
    let mut lines = vec![
        format!("Digest at the switchover: {digest}."),
        format!(
            "The guest's own stamp checks: {} mismatches before the switchover, {} after; {} passes on the destination.",
            count(s.guest.mismatches_before),
            count(after.mismatches),
            count(after.passes)
        ),
    ];
    let predicted = match s.switchover.predicted_downtime_ms {
        p if p > 0.0 => format!(" against {p:.1} ms predicted at the switchover"),
        _ => String::new(),
    };
    lines.push(format!(
        "Pause: {:.1} ms{predicted}; the whole migration {:.2} s.",
        s.downtime_ms,
        s.total_ms / 1e3
    ));
    if let Some(e) = &s.error {
        lines.push(format!("Error: {e}"));
    }
    lines
}
