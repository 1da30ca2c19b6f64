//! `minivmm demo --guest linux`: the summary of a Linux guest's move, from
//! what its checker printed on both consoles and wrote to the disk.

use minivmm::checks;
use serde_json::{json, Value};

/// What the two ends reported, and where their consoles are.
pub struct Ends<'a> {
    pub source: &'a Value,
    pub destination: &'a Value,
    pub destination_ok: bool,
    pub source_console: String,
    pub destination_console: String,
    /// The host's time of each checker line, as the consoles grew.
    pub stamps: Vec<super::stamps::Stamp>,
}

/// The summary, and whether every check passed.
pub fn summarize(mode: &str, vcpus: u32, e: &Ends) -> (Value, bool) {
    let console = checks::linux_console(&(e.source_console.clone() + &e.destination_console));
    let dest_lines = checks::linux_console(&e.destination_console);
    // The pause the guest saw: the gap between its clock readings that
    // spans the source's pause for the switchover. The destination's first
    // lines span it too, with a throttle's stalls before it.
    let paused = e.source["paused_unix_ms"].as_f64();
    let guest_pause_ms = paused.and_then(|at| super::stamps::switchover_gap_ms(&e.stamps, at));
    // Where a throttle's stalls crowded it out of its lines: the most it
    // can have been.
    let guest_pause_at_most_ms =
        paused.and_then(|at| super::stamps::switchover_gap_at_most_ms(&e.stamps, at));
    let gap_near_move_ms = first_gaps(&e.destination_console, 3);
    let journal: Vec<u64> = [e.source, e.destination]
        .iter()
        .flat_map(|j| {
            let runs: Vec<[u64; 2]> =
                serde_json::from_value(j["disk_runs"][0].clone()).unwrap_or_default();
            super::expand(&runs)
        })
        .collect();
    let disk = checks::disk(&journal);
    let last = console.last.clone().unwrap_or_default();
    let guest_exit = e.destination["guest_exit"].as_str().map(String::from);
    let digest_match = e.source["digest_match"] == true && e.destination["digest_match"] == true;
    let completed = e.source["status"] == "completed";
    let error = first_error(e, completed, &console, guest_exit.as_deref());
    let mut summary = json!({
        "guest": "linux",
        "kernel": console.kernel,
        "vcpus": vcpus,
        "mode": mode,
        "status": e.source["status"],
        "digest_match": digest_match,
        "downtime_ms": e.source["downtime_ms"],
        "outputs_held_ms": e.destination["summary"]["outputs_held_ms"],
        "total_ms": e.source["total_ms"],
        "converge": e.source["summary"]["converge"],
        "rounds": e.source["summary"]["rounds"].as_array().map(Vec::len),
        "guest_pause_ms": guest_pause_ms,
        "guest_pause_at_most_ms": guest_pause_at_most_ms,
        "gap_near_move_ms": gap_near_move_ms,
        "guest_clock_lost_ms": super::stamps::clock_lost_ms(&e.stamps),
        "checker_lines_after_move": dest_lines.lines.lines,
        "checker_mismatches": last.mismatches,
        "checker_done": console.done,
        "console_lines": console.lines.lines,
        "console_lines_lost": console.lines.lost,
        "console_lines_doubled": console.lines.doubled,
        "console_lines_bad": console.lines.bad,
        "console_bad_lines": console.bad_lines,
        "blk_requests": disk.requests,
        "blk_requests_lost": disk.lost,
        "blk_requests_doubled": disk.doubled,
        "blk_bad_reads": last.disk_bad_reads,
        "kernel_warnings": console.warnings,
        "boot_warnings": console.boot_warnings,
        "guest_exit": guest_exit,
        "error": error,
    });
    if mode == "snapshot" {
        // The save's and the restore's own figures (their summaries).
        let (saved, restored) = (&e.source["summary"], &e.destination["summary"]);
        summary["snapshot"] = json!({
            "total_ms": saved["total_ms"],
            "pause_ms": saved["pause_ms"],
            "digest_ms": saved["digest_ms"],
            "bytes": saved["bytes"],
            "converged": saved["converged"],
            "policy": saved["convergence"]["converge"],
        });
        summary["restore"] = json!({
            "mode": restored["mode"],
            "first_instruction_ms": restored["first_instruction_ms"],
            "working_set_ms": restored["working_set_ms"],
            "resident_ms": restored["resident_ms"],
            "blocking_faults": restored["blocking_faults"],
        });
    }
    let clean = error.is_none()
        && digest_match
        && last.mismatches == 0
        && console.lines.lost + console.lines.doubled + console.lines.bad == 0
        && disk.lost + disk.doubled + last.disk_bad_reads == 0
        && console.warnings.is_empty();
    (summary, clean)
}

/// The largest `gap_ms` in the first `n` checker lines of `text`.
pub fn first_gaps(text: &str, n: usize) -> Option<f64> {
    use ferry_guest_checker::line::Line;
    text.lines()
        .filter_map(|l| Line::parse(l)?.ok())
        .take(n)
        .map(|l| l.gap_ms)
        .reduce(f64::max)
}

/// Why the run failed, if it did: the migration's error, the
/// destination's, or the guest's end.
fn first_error(
    e: &Ends,
    completed: bool,
    console: &checks::LinuxConsole,
    guest_exit: Option<&str>,
) -> Option<String> {
    if let Some(err) = e.source["error"].as_str() {
        return Some(err.to_string());
    }
    if !completed {
        return Some(format!("the migration ended {}", e.source["status"]));
    }
    if let Some(panic) = super::linux_run::panic_line(&e.destination_console) {
        let then = match (e.destination["health"].as_str(), guest_exit) {
            // The destination saw the panic itself and stopped the guest.
            (Some(h), _) if h.contains(super::linux_run::PANIC_LINE) => {
                "the destination stopped it".to_string()
            }
            (Some(h), _) => h.to_string(),
            (None, Some(exit)) => format!("it ended: {exit}"),
            (None, None) => "it did not end".to_string(),
        };
        return Some(format!(
            "the guest's kernel panicked at the destination ({panic}); then {then}"
        ));
    }
    if let Some(h) = e.destination["health"].as_str() {
        return Some(format!("the destination's guest failed: {h}"));
    }
    if guest_exit != Some("poweroff") {
        return Some(format!(
            "the guest did not power off at the destination (it ended: {})",
            guest_exit.unwrap_or("not at all")
        ));
    }
    if !console.done {
        return Some("the guest's checker did not print its last line".into());
    }
    if !e.destination_ok {
        return Some("the destination exited non-zero".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_whose_kernel_panicked_after_the_move_fails_the_run_by_name() {
        let source = json!({"status": "completed", "digest_match": true});
        let destination = json!({
            "status": "completed",
            "digest_match": true,
            "health": "vCPU 1 stopped: unexpected exit Shutdown",
            "guest_exit": null,
        });
        let ends = Ends {
            source: &source,
            destination: &destination,
            destination_ok: false,
            source_console: String::new(),
            destination_console: "[   41.2] sysrq: Trigger a crash\n\
                [   41.2] Kernel panic - not syncing: sysrq triggered crash\n"
                .into(),
            stamps: Vec::new(),
        };
        let (summary, clean) = summarize("precopy", 2, &ends);
        assert!(!clean, "{summary}");
        let error = summary["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("kernel panicked at the destination")
                && error.contains("sysrq triggered crash")
                && error.contains("vCPU 1 stopped: unexpected exit Shutdown"),
            "{error}"
        );
    }

    #[test]
    fn a_snapshot_s_summary_carries_the_save_s_and_the_restore_s_figures() {
        let source = json!({"status": "completed", "digest_match": true, "summary": {
            "total_ms": 4261.8, "pause_ms": 1087.9, "digest_ms": 991.0, "bytes": 89149440,
            "converged": true, "convergence": {"converge": "quota"}}});
        let destination = json!({"status": "completed", "digest_match": true,
            "guest_exit": "poweroff", "summary": {"mode": "lazy-working-set",
            "first_instruction_ms": 304.1, "working_set_ms": 120.0, "resident_ms": 14427.7,
            "blocking_faults": 269}});
        let ends = Ends {
            source: &source,
            destination: &destination,
            destination_ok: true,
            source_console: String::new(),
            destination_console: String::new(),
            stamps: Vec::new(),
        };
        let (summary, _) = summarize("snapshot", 2, &ends);
        assert_eq!(summary["snapshot"]["pause_ms"], 1087.9);
        assert_eq!(summary["snapshot"]["digest_ms"], 991.0);
        assert_eq!(summary["snapshot"]["policy"], "quota");
        assert_eq!(summary["restore"]["mode"], "lazy-working-set");
        assert_eq!(summary["restore"]["first_instruction_ms"], 304.1);
        assert_eq!(summary["restore"]["blocking_faults"], 269);
        // A migration has neither.
        let (moved, _) = summarize("precopy", 2, &ends);
        assert!(moved.get("snapshot").is_none() && moved.get("restore").is_none());
    }
}
