//! `ferry bench converge`: how each convergence policy copes with a guest
//! that dirties memory faster than the link, in the dirty-quota seed's two
//! tables, measured in one run.
//!
//! ```text
//!   cell  = (memory m, vCPUs n, write rate l per vCPU, write %, link b)
//!   run   = `ferry demo --json --converge P --bandwidth b ...` in a fresh process
//!           pair, killed at the cell's time limit (40 s up to 256 MiB, 60 s above)
//!   converged = completed, verified, and what was left fitted the downtime
//!           target (not forced by the round cap), within the time limit
//!   table A: t per policy, and the last policy against the one before it
//!   table B: the seed's mixes (writers and readers in one VM): each policy's
//!           guest runtime and progress, averaged over vCPUs
//!   table C: what the demo predicted before it started, against what it measured
//! ```
//!
//! The link is a bandwidth cap on loopback (`--bandwidth`), the same token
//! bucket a real migration uses; or, with `--netns`, two hosts on one
//! machine: each demo's source and destination in network namespaces of
//! their own, over a veth pair shaped to b with tc (`ferry demo --netns
//! --link-rate b`), and the engine measures the link instead of capping
//! itself.

use crate::child::die_with_parent;
use crate::error::CmdError;
use clap::Args;
use ferry_report::{Chart, Report, Table};
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod charts;

/// Arguments of `ferry bench converge`.
#[derive(Args, Debug)]
pub struct ConvergeArgs {
    /// Backend of the migrated guests.
    #[arg(long, default_value = "soft", value_parser = ["kvm", "soft"])]
    pub backend: String,
    /// Policies to compare (default: none, auto, dirty-limit and quota; kvm
    /// guests run with the dirty ring, which meters the last two).
    #[arg(long, value_delimiter = ',', value_parser = ["none", "auto", "dirty-limit", "quota"])]
    pub policies: Vec<String>,
    /// A subset: one cell of table A and table B's three mixes, without the
    /// `none` baseline (which never converges in them), in a few minutes.
    #[arg(long)]
    pub quick: bool,
    /// Table A cells of your own instead of the default grid, each
    /// MEM,VCPUS,RATE,WRITE%,LINK: e.g. `--cell 1G,2,max,100,512` (RATE in
    /// MiB/s per vCPU or `max`, LINK in MiB/s). Repeat for more.
    #[arg(long = "cell", value_parser = parse_cell)]
    pub cells: Vec<CellSpec>,
    /// Leave out table B (the writer/reader mixes).
    #[arg(long = "skip-mixes")]
    pub skip_mixes: bool,
    /// Run every demo as two hosts on one machine: source and destination in
    /// network namespaces of their own, over a veth pair shaped to the
    /// cell's link with tc (needs root and iproute2). Default: a bandwidth
    /// cap on loopback.
    #[arg(long)]
    pub netns: bool,
    /// Run every migration with `--harvest-within-rounds` (a page dirtied
    /// ahead of the send cursor is sent once, not again).
    #[arg(long = "harvest-within-rounds")]
    pub harvest_within_rounds: bool,
    /// Print one JSON object with `cells` as the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts (and a timeline SVG per run) and
    /// report.html, the page that holds them all.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// One workload and link.
#[derive(Clone, Debug, Serialize)]
pub struct CellSpec {
    /// Table B's mix name, or "" for a table A cell.
    pub mix: String,
    /// Guest memory in MiB (all vCPUs).
    pub mem_mib: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Write rate cap per vCPU in MiB/s (`None`: as fast as it can).
    pub rate_mib_s: Option<u64>,
    /// Percentage of accesses that write.
    pub write_percent: u8,
    /// vCPUs that only read (the last ones).
    pub readers: u32,
    /// Link bandwidth in MiB/s.
    pub link_mib_s: u64,
}

impl CellSpec {
    fn a(mem_mib: u64, vcpus: u32, rate: Option<u64>, write_percent: u8, link: u64) -> Self {
        CellSpec {
            mix: String::new(),
            mem_mib,
            vcpus,
            rate_mib_s: rate,
            write_percent,
            readers: 0,
            link_mib_s: link,
        }
    }

    fn time_limit(&self) -> Duration {
        Duration::from_secs(if self.mem_mib <= 256 { 40 } else { 60 })
    }

    fn rate(&self) -> String {
        self.rate_mib_s
            .map_or_else(|| "max".to_string(), |r| r.to_string())
    }
}

/// One policy's run of a cell.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// The policy.
    pub policy: String,
    /// See the module docs.
    pub converged: bool,
    /// The migration completed with matching digests and no guest stamp
    /// mismatch (false also where it did not finish).
    pub verified: bool,
    /// Why it did not converge, if it did not.
    pub why_not: Option<String>,
    /// Migration time, ms (the time limit if it was cut off).
    pub total_ms: f64,
    /// Downtime, ms.
    pub downtime_ms: f64,
    /// Bytes on the wire.
    pub bytes_sent: u64,
    /// Precopy rounds, the final one included.
    pub rounds: usize,
    /// Guest runtime %, averaged over vCPUs.
    pub runtime_pct: f64,
    /// Guest progress %, averaged over vCPUs.
    pub progress_pct: f64,
    /// The timeline SVG of this run.
    pub timeline: Option<PathBuf>,
    /// The demo's JSON summary of this run.
    pub summary: Option<PathBuf>,
    /// What the demo's prediction said for this policy: converges, total ms.
    pub predicted: Option<(bool, f64)>,
}

/// A cell and its runs.
#[derive(Clone, Debug, Serialize)]
pub struct CellResult {
    /// The workload and link.
    pub cell: CellSpec,
    /// One per policy, in the order asked.
    pub results: Vec<RunResult>,
}

/// Everything measured.
#[derive(Debug, Serialize)]
pub struct ConvergeResults {
    /// Backend of the guests.
    pub backend: String,
    /// What the link was.
    pub link: String,
    /// Whether the migrations harvested within rounds.
    pub harvest_within_rounds: bool,
    /// Policies compared.
    pub policies: Vec<String>,
    /// Every cell, table A's first.
    pub cells: Vec<CellResult>,
}

/// Parses `--cell MEM,VCPUS,RATE,WRITE%,LINK`.
fn parse_cell(s: &str) -> Result<CellSpec, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let [mem, vcpus, rate, write, link] = parts.as_slice() else {
        return Err(format!(
            "'{s}': want MEM,VCPUS,RATE,WRITE%,LINK, e.g. 256M,1,max,100,128"
        ));
    };
    let mem = crate::args::parse_size(mem)?;
    let vcpus: u32 = vcpus
        .parse()
        .ok()
        .filter(|v| (1..=64).contains(v))
        .ok_or_else(|| format!("vCPUs '{vcpus}': want 1 to 64"))?;
    let rate = match *rate {
        "max" => None,
        r => Some(
            r.parse::<u64>()
                .ok()
                .filter(|&r| r > 0)
                .ok_or_else(|| format!("rate '{r}': want MiB/s per vCPU or max"))?,
        ),
    };
    let write: u8 = write
        .parse()
        .ok()
        .filter(|w| *w <= 100)
        .ok_or_else(|| format!("write percent '{write}': want 0 to 100"))?;
    let link: u64 = link
        .parse()
        .ok()
        .filter(|&l| l > 0)
        .ok_or_else(|| format!("link '{link}': want MiB/s"))?;
    let per_vcpu = mem / u64::from(vcpus);
    if per_vcpu == 0 || per_vcpu % (2 << 20) != 0 {
        return Err(format!(
            "memory {mem} over {vcpus} vCPUs: want a multiple of 2 MiB per vCPU"
        ));
    }
    Ok(CellSpec::a(mem >> 20, vcpus, rate, write, link))
}

/// Table A's cells: the issue's default grid, or one cell with `quick`.
fn grid(quick: bool) -> Vec<CellSpec> {
    if quick {
        return vec![CellSpec::a(256, 1, None, 100, 128)];
    }
    let mut cells = Vec::new();
    for rate in [Some(50), Some(200), None] {
        for link in [32, 128, 512] {
            cells.push(CellSpec::a(256, 1, rate, 100, link));
        }
    }
    for rate in [Some(50), Some(200), None] {
        for link in [128, 512] {
            cells.push(CellSpec::a(1024, 2, rate, 100, link));
        }
    }
    for (mem, vcpus) in [(256, 1), (1024, 2)] {
        for rate in [Some(50), Some(200), None] {
            cells.push(CellSpec::a(mem, vcpus, rate, 10, 128));
        }
    }
    cells
}

/// Table B's mixes: 4 vCPUs sweeping 64 MiB each as fast as they can, some
/// writing and the rest reading, over a 128 MiB/s link.
fn mixes() -> Vec<CellSpec> {
    [
        ("write-intensive", 1),
        ("read-write-balanced", 2),
        ("read-intensive", 3),
    ]
    .into_iter()
    .map(|(mix, readers)| CellSpec {
        mix: mix.into(),
        readers,
        ..CellSpec::a(256, 4, None, 100, 128)
    })
    .collect()
}

/// The policies the backend serves, in the order compared.
fn default_policies(_backend: &str) -> Vec<String> {
    // kvm runs its guests with the dirty ring, which meters the per-vCPU
    // policies there.
    ["none", "auto", "dirty-limit", "quota"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Whether `r` was cut off at its cell's time limit (rather than forced
/// to stop by the round cap, or not verified).
fn cut_off(r: &RunResult) -> bool {
    r.why_not
        .as_deref()
        .is_some_and(|w| w.starts_with("not finished in"))
}

/// Runs `ferry demo` for one cell and policy, killing it at the time limit.
fn run_one(
    a: &ConvergeArgs,
    cell: &CellSpec,
    policy: &str,
    timeline: &Path,
) -> Result<RunResult, CmdError> {
    let exe = std::env::current_exe()
        .map_err(|e| CmdError::Failed(format!("cannot find the ferry executable: {e}")))?;
    let mut cmd = Command::new(exe);
    die_with_parent(&mut cmd);
    let per_vcpu = format!("{}M", cell.mem_mib / u64::from(cell.vcpus));
    cmd.args(["demo", "--json", "--warmup", "0.5", "--backend", &a.backend]);
    if a.harvest_within_rounds {
        cmd.arg("--harvest-within-rounds");
    }
    if a.backend == "kvm" {
        cmd.args(["--dirty-tracking", "ring"]);
    }
    cmd.args([
        "--vcpus",
        &cell.vcpus.to_string(),
        "--mem-per-vcpu",
        &per_vcpu,
    ])
    .args(["--write-percent", &cell.write_percent.to_string()])
    .args(["--readers", &cell.readers.to_string()])
    .args(if a.netns {
        &["--netns", "--link-rate"][..]
    } else {
        &["--bandwidth"][..]
    })
    .arg(cell.link_mib_s.to_string())
    .args(["--converge", policy, "--run-after", "0.2"])
    .args(["--give-up-after", &cell.time_limit().as_secs().to_string()]);
    match cell.rate_mib_s {
        Some(r) => cmd.args(["--rate-limit", &r.to_string()]),
        None => cmd.arg("--unthrottled"),
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| CmdError::Failed(format!("cannot run ferry demo: {e}")))?;
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    // The demo gives up at the limit by itself (and still reports how the
    // guest fared); this is for a demo that hangs past it.
    let deadline = Instant::now() + cell.time_limit() + Duration::from_secs(30);
    let cut_off = loop {
        match child.try_wait() {
            Ok(Some(_)) => break false,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break true;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(CmdError::Failed(format!("waiting for ferry demo: {e}"))),
        }
    };
    let text = reader.join().unwrap_or_default();
    let limit_ms = cell.time_limit().as_secs_f64() * 1e3;
    let mut r = RunResult {
        policy: policy.into(),
        converged: false,
        verified: false,
        why_not: None,
        total_ms: limit_ms,
        downtime_ms: 0.0,
        bytes_sent: 0,
        rounds: 0,
        runtime_pct: 0.0,
        progress_pct: 0.0,
        timeline: None,
        summary: None,
        predicted: None,
    };
    if cut_off {
        r.why_not = Some("ferry demo still ran 30 s after its time limit, and was killed".into());
        return Ok(r);
    }
    let Ok(j) = ferry_harness::output::last_line_json(&text) else {
        r.why_not = Some("ferry demo printed no summary".into());
        return Ok(r);
    };
    let verified =
        j["status"] == "completed" && j["digest_match"] == true && j["guest_mismatches"] == 0;
    r.total_ms = j["total_ms"].as_f64().unwrap_or(limit_ms);
    r.downtime_ms = j["downtime_ms"].as_f64().unwrap_or(0.0);
    r.bytes_sent = j["bytes_sent"].as_u64().unwrap_or(0);
    r.rounds = j["round_stats"].as_array().map_or(0, |a| a.len());
    let shares = j["vcpu_shares"].as_array().cloned().unwrap_or_default();
    let mean = |key: &str| {
        let sum: f64 = shares.iter().filter_map(|s| s[key].as_f64()).sum();
        sum / shares.len().max(1) as f64
    };
    r.predicted = j["predicted"]["policies"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["policy"] == policy))
        .map(|p| {
            (
                p["converges"] == true,
                p["total_ms"].as_f64().unwrap_or(0.0),
            )
        });
    r.runtime_pct = mean("runtime_pct");
    r.progress_pct = mean("progress_pct");
    r.verified = verified;
    r.converged = verified && j["converged"] == true;
    let gave_up = j["error"]
        .as_str()
        .is_some_and(|e| e.contains("--give-up-after"));
    r.why_not = if gave_up {
        r.total_ms = limit_ms;
        Some(format!("not finished in {} s", cell.time_limit().as_secs()))
    } else if !verified {
        Some(format!(
            "not verified: {}",
            j["error"]
                .as_str()
                .unwrap_or("digest or guest stamps differ")
        ))
    } else if !r.converged {
        Some("the round cap forced the stop-and-copy".into())
    } else {
        None
    };
    let title = format!(
        "{} MiB, {} vCPU(s), {} MiB/s per vCPU, {}% writes, {} MiB/s link: {policy}",
        cell.mem_mib,
        cell.vcpus,
        cell.rate(),
        cell.write_percent,
        cell.link_mib_s
    );
    ferry_report::Chart::from(crate::timeline::of(&j, title)).write_svg(timeline)?;
    r.timeline = Some(timeline.to_path_buf());
    // The demo's whole summary beside its timeline: the prediction's input,
    // every round and throttle step, for a reader checking a cell.
    let summary = timeline.with_extension("json");
    std::fs::write(&summary, text.lines().last().unwrap_or_default())
        .map_err(|e| CmdError::Failed(format!("cannot write {}: {e}", summary.display())))?;
    r.summary = Some(summary);
    Ok(r)
}

/// Runs the experiment.
pub fn run(a: &ConvergeArgs) -> Result<Report<ConvergeResults>, CmdError> {
    let policies = if a.policies.is_empty() {
        default_policies(&a.backend)
    } else {
        a.policies.clone()
    };
    std::fs::create_dir_all(&a.out)
        .map_err(|e| CmdError::Failed(format!("cannot create {}: {e}", a.out.display())))?;
    let table_a = if a.cells.is_empty() {
        grid(a.quick)
    } else {
        a.cells.clone()
    };
    let table_b = if a.skip_mixes { Vec::new() } else { mixes() };
    let specs: Vec<CellSpec> = table_a.into_iter().chain(table_b).collect();
    let mut cells = Vec::new();
    for (i, cell) in specs.into_iter().enumerate() {
        let mut results = Vec::new();
        for p in &policies {
            if a.quick && p == "none" && policies.len() > 1 {
                // Unthrottled, the quick cells never converge (40 s each)
                // and every vCPU runs all the time: nothing to compare, and
                // --quick must stay short.
                continue;
            }
            eprintln!(
                "ferry bench converge: cell {} ({} MiB, {} vCPU(s), {} MiB/s, {}% writes, {} reader(s), link {} MiB/s), {p} ...",
                i + 1,
                cell.mem_mib,
                cell.vcpus,
                cell.rate(),
                cell.write_percent,
                cell.readers,
                cell.link_mib_s
            );
            let svg = a
                .out
                .join(format!("converge-{}-cell{}-{p}.svg", a.backend, i + 1));
            results.push(run_one(a, &cell, p, &svg)?);
        }
        cells.push(CellResult { cell, results });
    }
    Ok(report(a, policies, cells))
}

/// What b is, in words.
fn link_kind(netns: bool) -> &'static str {
    match netns {
        true => "a veth pair between two network namespaces, shaped with tc tbf",
        false => "a bandwidth cap on loopback",
    }
}

/// `t` in seconds, "unconverged", or "NOT VERIFIED" where the migration
/// finished but its digest or the guest's stamps disagreed (a bug, never
/// to be mistaken for a slow cell).
fn time_cell(r: &RunResult) -> String {
    if r.converged {
        format!("{:.2}", r.total_ms / 1e3)
    } else if r
        .why_not
        .as_deref()
        .is_some_and(|w| w.starts_with("not verified"))
    {
        "NOT VERIFIED".into()
    } else {
        "unconverged".into()
    }
}

/// The baselines the last policy is compared with: every other one but
/// `none` (which slows nothing).
fn baselines(policies: &[String]) -> Vec<String> {
    let n = policies.len().saturating_sub(1);
    policies[..n]
        .iter()
        .filter(|p| *p != "none")
        .cloned()
        .collect()
}

/// The longest migration of a cell, ms.
fn longest_run_ms(results: &[RunResult]) -> f64 {
    results.iter().map(|r| r.total_ms).fold(0.0, f64::max)
}

/// `r`'s guest runtime % over `span` ms: its runtime while it migrated,
/// and all of the time after (the guest runs free once its migration ends).
fn runtime_over(r: &RunResult, span: f64) -> f64 {
    if span <= 0.0 {
        return r.runtime_pct;
    }
    let after = (span - r.total_ms).max(0.0);
    (r.runtime_pct * r.total_ms + 100.0 * after) / span
}

/// How much shorter the last policy's migration was than `base`'s.
fn diff_cell(results: &[RunResult], base: &str) -> String {
    let (Some(b), Some(new)) = (results.iter().find(|r| r.policy == base), results.last()) else {
        return "N/A".into();
    };
    if b.converged && new.converged {
        format!("{:.1}", 100.0 * (b.total_ms - new.total_ms) / b.total_ms)
    } else {
        "N/A".into()
    }
}

fn report(
    a: &ConvergeArgs,
    policies: Vec<String>,
    cells: Vec<CellResult>,
) -> Report<ConvergeResults> {
    let last = policies.last().cloned().unwrap_or_default();
    let bases = baselines(&policies);
    let last_two = match policies.as_slice() {
        [.., x, y] => format!("diff % ({y} vs {x})"),
        _ => "diff %".into(),
    };
    let mut cols: Vec<String> = ["m (MiB)", "n", "l (MiB/s)", "w %", "b (MiB/s)"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    cols.extend(policies.iter().map(|p| format!("t {p} (s)")));
    cols.extend(policies.iter().map(|p| format!("downtime {p} (ms)")));
    cols.extend(bases.iter().map(|b| format!("diff % ({last} vs {b})")));
    let col_refs: Vec<&str> = cols.iter().map(String::as_str).collect();
    let mut table_a = Table::new(
        format!("A. Live migration performance ({} backend)", a.backend),
        &col_refs,
    );
    let mut b_cols = vec!["case".to_string()];
    b_cols.extend(policies.iter().map(|p| format!("runtime % ({p})")));
    b_cols.extend(policies.iter().map(|p| format!("progress % ({p})")));
    b_cols.push(last_two.replace("diff %", "runtime diff %"));
    b_cols.extend(
        policies
            .iter()
            .map(|p| format!("runtime % over the longest ({p})")),
    );
    let b_refs: Vec<&str> = b_cols.iter().map(String::as_str).collect();
    let mut table_b = Table::new(
        format!("B. Guest performance ({} backend)", a.backend),
        &b_refs,
    );
    for c in &cells {
        let s = &c.cell;
        if s.mix.is_empty() {
            let mut row = vec![
                s.mem_mib.to_string(),
                s.vcpus.to_string(),
                s.rate(),
                s.write_percent.to_string(),
                s.link_mib_s.to_string(),
            ];
            // A policy --quick skipped shows as "-".
            let of = |p: &String| c.results.iter().find(|r| &r.policy == p);
            row.extend(policies.iter().map(|p| of(p).map_or("-".into(), time_cell)));
            row.extend(policies.iter().map(|p| match of(p) {
                Some(r) if r.converged => format!("{:.0}", r.downtime_ms),
                _ => "-".into(),
            }));
            row.extend(bases.iter().map(|b| diff_cell(&c.results, b)));
            table_a.row(row);
        } else {
            let mut row = vec![format!(
                "{} ({}W/{}R)",
                s.mix,
                s.vcpus - s.readers,
                s.readers
            )];
            // A policy --quick skipped shows as "-".
            let of = |p: &String, f: &dyn Fn(&RunResult) -> f64| {
                c.results
                    .iter()
                    .find(|r| &r.policy == p)
                    .map_or_else(|| "-".to_string(), |r| format!("{:.1}", f(r)))
            };
            row.extend(policies.iter().map(|p| of(p, &|r| r.runtime_pct)));
            row.extend(policies.iter().map(|p| of(p, &|r| r.progress_pct)));
            row.push(match c.results.as_slice() {
                [.., x, y] if x.runtime_pct > 0.0 => {
                    format!(
                        "{:.1}",
                        100.0 * (y.runtime_pct - x.runtime_pct) / x.runtime_pct
                    )
                }
                _ => "N/A".into(),
            });
            let span = longest_run_ms(&c.results);
            row.extend(policies.iter().map(|p| of(p, &|r| runtime_over(r, span))));
            table_b.row(row);
        }
    }
    let mut table_c = Table::new(
        format!("C. Prediction against measurement ({} backend)", a.backend),
        &[
            "cell",
            "policy",
            "predicted",
            "measured",
            "predicted / measured",
        ],
    );
    for (i, c) in cells.iter().enumerate() {
        for r in &c.results {
            let Some((converges, ms)) = r.predicted else {
                continue;
            };
            let said = if converges {
                format!("{:.2} s", ms / 1e3)
            } else {
                "unconverged".into()
            };
            let limit = c.cell.time_limit().as_secs_f64() * 1e3;
            let ratio = match (converges, r.converged) {
                (true, true) => format!("{:.2}", ms / r.total_ms),
                (false, false) => "agree".into(),
                (true, false) if ms > limit => "agree: past the time limit".into(),
                // Cut off at the limit: measured > limit, so the ratio is
                // at most ms / limit, and within the band if that is.
                (true, false) if cut_off(r) && ms >= 0.8 * limit => {
                    format!("≤ {:.2}: cut off at the limit", ms / limit)
                }
                (true, false) => "wrong: did not converge".into(),
                (false, true) => "wrong: it converged".into(),
            };
            table_c.row(vec![
                (i + 1).to_string(),
                r.policy.clone(),
                said,
                time_cell(r),
                ratio,
            ]);
        }
    }
    table_c.note("predicted: what the demo's prediction (a 1 s sample of each vCPU's dirtying with tracking on, then 0.3 s of its burst under a throttle; the policies run over a model of the rounds) said before the migration started; agree: both say it does not converge (or the prediction's time is past the cell's limit); ≤ r: the run was cut off at the cell's time limit while the prediction had it converge at r × the limit, within 0.8 of it; wrong: the prediction said the opposite of what happened.");
    table_a.note(format!("m memory, n vCPUs, l write rate per vCPU (max: as fast as the guest can), w share of accesses that write, b link ({}). t: total migration time; unconverged: not finished in the time limit (40 s up to 256 MiB, 60 s above), or the round cap forced the stop-and-copy; NOT VERIFIED: finished, but the digest or the guest's stamps disagreed (`why_not` in the JSON says which). Every run is a fresh `ferry demo` process pair, digest and guest stamps checked.", link_kind(a.netns)));
    table_a.note(format!(
        "diff % ({last} vs X): how much shorter the migration was under {last} than under X; N/A where either did not converge."
    ));
    table_b.note("4 vCPUs x 64 MiB as fast as they can, the writers first, over a 128 MiB/s link. runtime: share of the migration a vCPU was not asleep on a throttle; progress: its page-access rate during the migration over its rate just before; both averaged over vCPUs. runtime over the longest: the same share over the span of the cell's longest migration, a vCPU counted as running once its own migration has ended (a policy that finishes sooner sets the guest free sooner).");
    table_b.note(format!(
        "{} vCPU threads on a host with {} core(s), plus the migration's threads: where threads exceed cores, they also wait for a core.",
        4,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));
    let mut table_d = Table::new(
        format!("D. Each run ({} backend)", a.backend),
        &["cell", "policy", "timeline", "summary"],
    );
    let file = |p: &Option<PathBuf>| {
        p.as_ref()
            .and_then(|p| p.file_name())
            .map_or_else(|| "-".into(), |n| n.to_string_lossy().into_owned())
    };
    for (i, c) in cells.iter().enumerate() {
        for r in &c.results {
            table_d.row(vec![
                (i + 1).to_string(),
                r.policy.clone(),
                file(&r.timeline),
                file(&r.summary),
            ]);
        }
    }
    table_d.note("Beside this page: each run's timeline (its rounds, throttle and pause on one time axis) and its whole summary as `ferry demo --json` printed it, the prediction's input included.");
    let mut figures: Vec<Chart> = Vec::new();
    if cells.iter().any(|c| c.cell.mix.is_empty()) {
        figures.push(charts::table_a(&a.backend, &policies, &cells).into());
    }
    if cells.iter().any(|c| !c.cell.mix.is_empty()) {
        figures.push(charts::table_b(&a.backend, &policies, &cells).into());
    }
    Report {
        name: format!("converge-{}", a.backend),
        tables: vec![table_a, table_b, table_c, table_d],
        results: ConvergeResults {
            backend: a.backend.clone(),
            link: link_kind(a.netns).into(),
            harvest_within_rounds: a.harvest_within_rounds,
            policies,
            cells,
        },
        charts: figures,
    }
}

/// The `--json` line: every cell with a result per policy.
pub fn summary_json(r: &ConvergeResults) -> serde_json::Value {
    let cells: Vec<serde_json::Value> = r
        .cells
        .iter()
        .map(|c| {
            let span = longest_run_ms(&c.results);
            let results: serde_json::Map<String, serde_json::Value> = c
                .results
                .iter()
                .map(|x| {
                    let v = serde_json::json!({
                        "runtime_over_longest_pct": runtime_over(x, span),
                        "converged": x.converged,
                        "total_ms": x.total_ms,
                        "downtime_ms": x.downtime_ms,
                        "runtime_pct": x.runtime_pct,
                        "progress_pct": x.progress_pct,
                        "why_not": x.why_not,
                        "verified": x.verified,
                        "predicted_converges": x.predicted.map(|p| p.0),
                        "predicted_total_ms": x.predicted.map(|p| p.1),
                    });
                    (x.policy.clone(), v)
                })
                .collect();
            serde_json::json!({"cell": c.cell, "results": results})
        })
        .collect();
    serde_json::json!({"backend": r.backend, "cells": cells})
}

/// `ferry bench converge`: runs it, prints its tables and writes its files
/// ([`super::output`]), and with `--json` ends with its summary line.
pub fn run_and_print(a: &ConvergeArgs) -> Result<ExitCode, CmdError> {
    let report = run(a)?;
    let code = super::output::emit(&report, &a.out)?;
    if a.json {
        println!("{}", summary_json(&report.results));
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(policy: &str, total_ms: f64) -> RunResult {
        RunResult {
            policy: policy.into(),
            converged: true,
            verified: true,
            why_not: None,
            total_ms,
            downtime_ms: 100.0,
            bytes_sent: 1,
            rounds: 3,
            runtime_pct: 50.0,
            progress_pct: 60.0,
            timeline: None,
            summary: None,
            predicted: Some((true, total_ms)),
        }
    }

    #[test]
    fn a_policy_quick_skipped_shows_as_a_dash_in_every_table() {
        let args = ConvergeArgs {
            backend: "soft".into(),
            policies: Vec::new(),
            quick: true,
            cells: Vec::new(),
            skip_mixes: false,
            netns: false,
            harvest_within_rounds: false,
            json: false,
            out: PathBuf::from("unused"),
        };
        let policies = vec!["none".to_string(), "quota".to_string()];
        let cells: Vec<CellResult> = grid(true)
            .into_iter()
            .chain(mixes())
            .map(|cell| CellResult {
                cell,
                results: vec![run("quota", 2000.0)],
            })
            .collect();
        let r = report(&args, policies, cells);
        let a = r.tables[0].render();
        let row = a.lines().find(|l| l.contains(" 256 |")).expect(&a);
        let fields: Vec<&str> = row.split('|').map(str::trim).collect();
        // m, n, l, w, b, then t none, t quota, downtime none, downtime quota.
        assert_eq!(&fields[6..10], ["-", "2.00", "-", "100"], "{a}");
        assert!(r.tables[1].render().contains("50.0"));
        // Table A's chart: `none` was not run, quota has its bar; table B's
        // has quota's runtime in each mix.
        let ferry_report::Chart::Bars(a) = &r.charts[0] else {
            panic!("table A is not bars")
        };
        assert_eq!(
            a.values[0],
            [ferry_report::Bar::NotRun, ferry_report::Bar::Value(2.0)]
        );
        assert_eq!(r.charts[0].marks(), 1);
        assert_eq!(r.charts[1].marks(), 3);
    }

    /// A guest whose migration ends sooner runs free for the rest of the
    /// longest migration's span.
    #[test]
    fn runtime_over_the_longest_counts_the_time_after_as_running() {
        let (short, long) = (run("quota", 2000.0), run("dirty-limit", 4000.0));
        let span = longest_run_ms(&[short.clone(), long.clone()]);
        assert_eq!(span, 4000.0);
        assert_eq!(
            runtime_over(&short, span),
            75.0,
            "50% of 2 s, then 2 s free"
        );
        assert_eq!(
            runtime_over(&long, span),
            50.0,
            "the longest is its own span"
        );
        assert_eq!(runtime_over(&short, 0.0), 50.0, "no span: as measured");
    }
}
