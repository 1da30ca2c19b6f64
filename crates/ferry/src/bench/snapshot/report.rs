//! What `ferry bench snapshot` found: its cells, the three ratios
//! on each writing cell, the tables and the charts.

use super::SnapshotArgs;
use ferry_engine::snapshot::{ProofAt, RestoreMode, SnapshotSummary};
use ferry_report::{Bar, Bars, Report, Table};
use serde::Serialize;

/// The name of the restore from the file saved with the access log off.
const WRITES_ONLY: &str = "lazy-working-set, writes only";

/// One guest: its snapshot and its three restores.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// Guest memory, MiB.
    pub guest_mib: u64,
    /// Whether the guest wrote its hot set (else it only read it).
    pub writing: bool,
    /// "dropped" when each restore read the file from disk (`--cold`),
    /// else "warm" (it read what the snapshot had just written).
    pub page_cache: &'static str,
    /// The guest's page accesses in its first second after the snapshot's
    /// pause, running on where it was saved (not restored).
    pub baseline_accesses_s: u64,
    /// The live snapshot.
    pub snapshot: SnapshotCell,
    /// The same guest snapshotted again right after, under each other
    /// policy asked for (`--converge`); its file is not restored.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub snapshot_also: Vec<SnapshotCell>,
    /// The same guest snapshotted again with its access log off
    /// (`--access-log-off-too`); restored lazily with its working set
    /// first ([`Restores::lazy_working_set_writes_only`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_writes_only: Option<SnapshotCell>,
    /// The restores, by mode.
    pub restore: Restores,
    /// The ratios, on a writing cell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checks: Option<Checks>,
}

/// The live snapshot of a cell.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotCell {
    /// From the call to the file in place.
    pub total_ms: f64,
    /// The guest's pause.
    pub pause_ms: f64,
    /// Bytes the file takes on disk (zero pages are holes).
    pub bytes: u64,
    /// Bytes written over all rounds (a page dirtied again is written again).
    pub bytes_written: u64,
    /// Rounds, the paused one included.
    pub rounds: usize,
    /// Pages in the recorded working set.
    pub working_set_pages: u64,
    /// Whether the VM's access log was read for it.
    pub access_log: bool,
    /// Of its pages, those only the access log saw (read, not written).
    pub working_set_read_pages: u64,
    /// The convergence policy the live rounds ran.
    pub policy: String,
    /// Whether what was left for the pause fitted the downtime target
    /// (else the round cap ended the rounds).
    pub converged: bool,
    /// Pages the paused round wrote.
    pub paused_pages: u64,
    /// Throttle changes the policy made.
    pub throttle_steps: usize,
    /// How long the held guest ran free before the pause (ms).
    pub settle_ms: f64,
    /// Where the proof was made: in the pause, or after it with memory
    /// frozen.
    pub proof: ProofAt,
    /// How long the proof's hash took (ms).
    pub proof_ms: f64,
}

impl SnapshotCell {
    fn of(s: &SnapshotSummary) -> Self {
        SnapshotCell {
            total_ms: s.total_ms,
            pause_ms: s.pause_ms,
            bytes: s.bytes,
            bytes_written: s.rounds.iter().map(|r| r.bytes).sum(),
            rounds: s.rounds.len(),
            working_set_pages: s.working_set_pages,
            access_log: s.access_log,
            working_set_read_pages: s.working_set_read_pages,
            policy: s
                .convergence
                .converge
                .map_or("default".into(), |p| p.to_string()),
            converged: s.converged,
            paused_pages: s.rounds.last().map_or(0, |r| r.pages),
            throttle_steps: s.convergence.throttle_timeline.len(),
            settle_ms: s.settle_ms,
            proof: s.proof,
            proof_ms: s.digest_ms,
        }
    }
}

/// The restores of one file.
#[derive(Clone, Debug, Serialize)]
pub struct Restores {
    /// Everything read before the first instruction.
    pub eager: RestoreCell,
    /// On demand, the fill in address order.
    pub lazy: RestoreCell,
    /// On demand, the fill taking the working set first.
    pub lazy_working_set: RestoreCell,
    /// The same, from the file saved with the access log off
    /// (`--access-log-off-too`): its working set is what the dirty logs
    /// saw written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lazy_working_set_writes_only: Option<RestoreCell>,
}

/// One restore.
#[derive(Clone, Debug, Serialize)]
pub struct RestoreCell {
    /// From the call to the guest running.
    pub first_instruction_ms: f64,
    /// From the call to every page of the working set in memory.
    pub working_set_ms: f64,
    /// From the call to every page in memory.
    pub resident_ms: f64,
    /// Touches of a missing page that held a vCPU.
    pub blocking_faults: u64,
    /// Pages read for those touches.
    pub fault_pages: u64,
    /// The guest's page accesses in its first second.
    pub accesses_first_s: u64,
    /// Those over the same guest's first second from the pause, not
    /// restored ([`Cell::baseline_accesses_s`]).
    pub progress_first_s: f64,
    /// The digest compared and matched.
    pub digest_match: bool,
    /// Stale pages the guest found, before the snapshot and after.
    pub mismatches: u64,
    /// Passes the guest completed after the restore.
    pub passes_after: u64,
    /// A vCPU that stopped, or counters that could not be read.
    pub problem: Option<String>,
}

impl RestoreCell {
    /// The digest matched, the guest's checks found nothing, and it ran.
    pub fn verified(&self) -> bool {
        self.digest_match && self.mismatches == 0 && self.passes_after > 0 && self.problem.is_none()
    }
}

/// The goals for lazy-working-set against the other two, on a
/// writing cell: one run's ratios.
#[derive(Clone, Debug, Serialize)]
pub struct Checks {
    /// Its working-set time over lazy's (goal: at most 1/2).
    pub working_set_ratio: f64,
    /// Its blocking faults over lazy's (goal: at most 1/5); none when
    /// lazy had none.
    pub faults_ratio: Option<f64>,
    /// Its first instruction over eager's (goal: at most 1/10).
    pub first_instruction_ratio: f64,
    /// All three goals met.
    pub met: bool,
}

impl Checks {
    fn of(r: &Restores) -> Self {
        let working_set_ratio = r.lazy_working_set.working_set_ms / r.lazy.working_set_ms;
        let faults_ratio = (r.lazy.blocking_faults > 0)
            .then(|| r.lazy_working_set.blocking_faults as f64 / r.lazy.blocking_faults as f64);
        let first_instruction_ratio =
            r.lazy_working_set.first_instruction_ms / r.eager.first_instruction_ms;
        Checks {
            working_set_ratio,
            faults_ratio,
            first_instruction_ratio,
            met: working_set_ratio <= 0.5
                && faults_ratio.is_none_or(|f| f <= 0.2)
                && first_instruction_ratio <= 0.1,
        }
    }
}

impl Cell {
    /// A cell from its snapshot and its restores.
    pub fn new(
        guest_mib: u64,
        writing: bool,
        cold: bool,
        baseline_accesses_s: u64,
        s: &SnapshotSummary,
        restore: Restores,
    ) -> Self {
        Cell {
            guest_mib,
            writing,
            page_cache: if cold { "dropped" } else { "warm" },
            baseline_accesses_s,
            snapshot: SnapshotCell::of(s),
            snapshot_also: Vec::new(),
            snapshot_writes_only: None,
            checks: writing.then(|| Checks::of(&restore)),
            restore,
        }
    }

    /// This cell, with the same guest's snapshots under other policies.
    pub fn with_also(mut self, also: &[SnapshotSummary]) -> Self {
        self.snapshot_also = also.iter().map(SnapshotCell::of).collect();
        self
    }

    /// This cell, with the same guest's snapshot with its access log off.
    pub fn with_writes_only(mut self, s: &SnapshotSummary) -> Self {
        self.snapshot_writes_only = Some(SnapshotCell::of(s));
        self
    }

    /// Every snapshot of the guest: the one restored first.
    fn snapshots(&self) -> impl Iterator<Item = &SnapshotCell> {
        std::iter::once(&self.snapshot)
            .chain(&self.snapshot_also)
            .chain(&self.snapshot_writes_only)
    }

    /// The restores, in [`RestoreMode::ALL`]'s order, with their modes'
    /// names.
    pub fn named(&self) -> [(&'static str, &RestoreCell); 3] {
        let r = &self.restore;
        let [eager, lazy, lazy_working_set] = RestoreMode::ALL.map(RestoreMode::name);
        [
            (eager, &r.eager),
            (lazy, &r.lazy),
            (lazy_working_set, &r.lazy_working_set),
        ]
    }

    /// Every restore, the one from the file without the access log last.
    pub fn restores(&self) -> impl Iterator<Item = &RestoreCell> {
        let writes_only = self.restore.lazy_working_set_writes_only.as_ref();
        self.named().into_iter().map(|(_, r)| r).chain(writes_only)
    }

    fn label(&self) -> String {
        let size = match self.guest_mib {
            m if m % 1024 == 0 => format!("{} GiB", m / 1024),
            m => format!("{m} MiB"),
        };
        format!("{size} {}", if self.writing { "writing" } else { "idle" })
    }
}

/// The JSON results.
#[derive(Debug, Serialize)]
pub struct Results {
    /// Backend of the guests.
    pub backend: String,
    /// Every cell, in the order run.
    pub cells: Vec<Cell>,
    /// Sizes left out, and why.
    pub skipped: Vec<String>,
}

/// The report: two tables (snapshots, restores) and two charts.
pub fn report(a: &SnapshotArgs, cells: Vec<Cell>, skipped: Vec<String>) -> Report<Results> {
    let backend = a.backend.kind().to_string();
    let mut saves = Table::new(
        format!("live snapshot to a file, {backend} guest, 2 vCPUs"),
        &[
            "guest",
            "policy",
            "total ms",
            "pause ms",
            "proof",
            "proof ms",
            "rounds",
            "converged",
            "paused pages",
            "throttle steps",
            "MiB written",
            "MiB on disk",
            "working set pages",
            "of them only read",
        ],
    );
    for c in &cells {
        for s in c.snapshots() {
            saves.row(vec![
                c.label(),
                s.policy.clone(),
                format!("{:.0}", s.total_ms),
                format!("{:.1}", s.pause_ms),
                s.proof.name().into(),
                format!("{:.0}", s.proof_ms),
                s.rounds.to_string(),
                if s.converged { "yes" } else { "no" }.into(),
                s.paused_pages.to_string(),
                s.throttle_steps.to_string(),
                (s.bytes_written >> 20).to_string(),
                (s.bytes >> 20).to_string(),
                s.working_set_pages.to_string(),
                match s.access_log {
                    true => s.working_set_read_pages.to_string(),
                    false => "no access log".into(),
                },
            ]);
        }
    }
    if a.file_cap_mib_s > 0 {
        saves.note(format!(
            "The snapshot's writes were capped at {} MiB/s (--file-cap-mib-s), as a slow disk would take them; the policies take the file's measured rate, within that cap, as their link.",
            a.file_cap_mib_s
        ));
    }
    if cells.iter().any(|c| !c.snapshot_also.is_empty()) {
        saves.note("Each guest's first row is the snapshot its restores read; the rows after it snapshot the same guest again right after, under the other policies, then (--proof-in-pause-too) with the proof inside the pause.");
    }
    if cells.iter().any(|c| c.snapshot_writes_only.is_some()) {
        saves.note("--access-log-off-too: each guest's last row snapshots it once more with the VM's access log off: its working set is what the dirty logs saw written.");
    }
    saves.note("of them only read: the working set's pages that only the VM's access log saw (read, not written, in the guest's last seconds); a VM without one (kvm) records what the dirty logs saw written.");
    saves.note("proof: where the hash of the memory of the pause, held to the file's pages, was made. frozen: after the pause, the guest running on with its memory write-protected until each 2 MiB is hashed; pause: inside the pause.");
    saves.note(format!(
        "The guest: text written once at boot in every page; a hot set of {}% of its memory visited in random order at {} MiB/s per vCPU (writing: every visit writes; idle: reads only, so its dirty log is empty, and its working set is what an access log saw).",
        a.hot_percent, a.rate_limit_mib_s
    ));
    let mut restores = Table::new(
        "restore from the same file, each mode (same run)",
        &[
            "guest",
            "mode",
            "first instr ms",
            "working set ms",
            "all in ms",
            "blocking faults",
            "progress 1st s",
            "verified",
        ],
    );
    for c in &cells {
        let writes_only = c.restore.lazy_working_set_writes_only.as_ref();
        let rows = c
            .named()
            .into_iter()
            .chain(writes_only.map(|r| (WRITES_ONLY, r)));
        for (mode, r) in rows {
            restores.row(vec![
                c.label(),
                mode.into(),
                format!("{:.1}", r.first_instruction_ms),
                format!("{:.0}", r.working_set_ms),
                format!("{:.0}", r.resident_ms),
                r.blocking_faults.to_string(),
                format!("{:.2}", r.progress_first_s),
                if r.verified() { "yes" } else { "NO" }.into(),
            ]);
        }
        if let Some(k) = &c.checks {
            restores.note(format!(
                "{}: lazy-working-set's working set in {:.2}x lazy's time (goal <= 0.5), {} its blocking faults (goal <= 0.2), first instruction at {:.3}x eager's (goal <= 0.1): {}",
                c.label(),
                k.working_set_ratio,
                k.faults_ratio.map_or("lazy had no".into(), |f| format!("{f:.2}x")),
                k.first_instruction_ratio,
                if k.met { "met" } else { "NOT met" }
            ));
        }
    }
    restores.note("progress 1st s: the guest's page accesses in its first second after the restore, over the same guest's in its first second after the snapshot's pause, running on where it was (not restored). The guest keeps a schedule per pass: a vCPU held back (by the snapshot's tracking, or by faults) catches up later in its pass when it can, so both seconds start with the same debt (the unrestored guest's a pause longer: its clock ran through the pause).");
    restores.note(if a.cold {
        "--cold: the file was dropped from the page cache before each restore, which read it from disk."
    } else {
        "The file was written just before: restores read it from the page cache (--cold reads it from disk)."
    });
    let writes_only = cells
        .iter()
        .any(|c| c.restore.lazy_working_set_writes_only.is_some());
    if writes_only {
        restores.note("lazy-working-set, writes only: the same guest's file saved right after with its access log off (--access-log-off-too), restored the same way: the baseline of the access log.");
    }
    restores.note("verified: the digest matched, the guest's stamp checks found no stale page through a whole pass after, and its vCPUs ran.");
    for s in &skipped {
        restores.note(format!("skipped {s}"));
    }
    let categories: Vec<String> = cells.iter().map(Cell::label).collect();
    let mut groups: Vec<String> = RestoreMode::ALL
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    if writes_only {
        groups.push(WRITES_ONLY.into());
    }
    let bars = |title: &str, y: &str, f: fn(&RestoreCell) -> f64| Bars {
        title: title.into(),
        y_label: y.into(),
        categories: categories.clone(),
        groups: groups.clone(),
        values: cells
            .iter()
            .map(|c| {
                let named = c.named().into_iter().map(|(_, r)| Bar::Value(f(r)));
                let extra = c.restore.lazy_working_set_writes_only.as_ref();
                let extra = writes_only.then(|| extra.map_or(Bar::NotRun, |r| Bar::Value(f(r))));
                named.chain(extra).collect()
            })
            .collect(),
        references: Vec::new(),
        reference_label: String::new(),
    };
    Report {
        name: "snapshot".into(),
        tables: vec![saves, restores],
        charts: vec![
            bars(
                "time to the guest's working set, by restore mode",
                "working set resident (ms)",
                |r| r.working_set_ms,
            )
            .into(),
            bars(
                "time to the first guest instruction, by restore mode",
                "first instruction (ms)",
                |r| r.first_instruction_ms,
            )
            .into(),
        ],
        results: Results {
            backend,
            cells,
            skipped,
        },
    }
}
