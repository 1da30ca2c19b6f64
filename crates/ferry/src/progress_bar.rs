//! An indicatif progress bar driven by the engine's progress callbacks.

use ferry_engine::{Phase, Progress, RoundStats, ThrottleStep};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Shows the current round as a byte bar on stderr (hidden when stderr is not
/// a terminal, so logs and `--json` output stay clean).
pub struct MigrationBar {
    bar: ProgressBar,
}

impl MigrationBar {
    pub fn new(visible: bool) -> Self {
        let bar = ProgressBar::with_draw_target(
            Some(0),
            if visible {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            },
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>12} [{bar:40.cyan/blue}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        MigrationBar { bar }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for MigrationBar {
    fn phase(&self, phase: Phase) {
        let name = match phase {
            Phase::Handshake => "handshake",
            Phase::FullPass => "full pass",
            Phase::DirtyRounds => "dirty rounds",
            Phase::Switchover => "switchover",
            Phase::Postcopy => "postcopy",
            Phase::Recovering => "recovering",
            Phase::Verifying => "verifying",
            Phase::Reporting => "reporting",
            Phase::Done => "done",
            // A phase newer than this bar: keep the last one shown.
            _ => return,
        };
        self.bar.set_prefix(name);
    }

    fn round_started(&self, round: u32, pages: u64) {
        self.bar.set_length(pages * ferry_vm::PAGE_SIZE as u64);
        self.bar.set_position(0);
        self.bar
            .set_message(format!("round {round}: {pages} pages"));
    }

    fn pages_sent(&self, pages: u64, _bytes: u64) {
        self.bar.inc(pages * ferry_vm::PAGE_SIZE as u64);
    }

    fn throttle_changed(&self, step: &ThrottleStep) {
        let what = match (step.quota_bytes, step.limit_bytes_per_sec) {
            (Some(_), _) => format!(
                "dirty quota per {:.0} ms, by vCPU: {} (a vCPU that does not use its quota runs on)",
                step.quota_interval_ms.unwrap_or(100.0),
                step.vcpu_quota_bytes
                    .iter()
                    .map(|&b| ferry_vm::types::human_bytes(b))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            (_, Some(l)) => format!(
                "each vCPU's dirty rate is limited to {}/s (a vCPU that does not write runs on)",
                ferry_vm::types::human_bytes(l)
            ),
            _ if step.percent == 0 => "throttle lifted".to_string(),
            _ => format!("every vCPU sleeps {}% of its time", step.percent),
        };
        self.bar
            .println(format!("  round {:>2}: {what}", step.round));
    }

    fn round_finished(&self, stats: &RoundStats) {
        self.bar.println(format!(
            "  round {:>2} {:>5}: {:>7} pages ({:>7} zero) in {:>8.1} ms, {:>7.0} MB/s, guest dirtied {:>9.0} pages/s",
            stats.round,
            format!("{:?}", stats.kind).to_lowercase(),
            stats.pages,
            stats.zero_pages,
            stats.ms,
            stats.bandwidth_mb_s,
            stats.dirty_rate_pages_s
        ));
    }
}
