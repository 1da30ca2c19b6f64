//! Printing a migration summary: a table for people, one JSON line for machines.

use ferry_engine::choices::Compression;
use ferry_engine::{MigrationSummary, RoundKind};
use ferry_report::Table;

/// What the destination said of the guest after the switchover (the last
/// line `ferry receive --json` printed). The engine's summary ends at the
/// Commit, so only a caller that hears from the destination, as `ferry
/// demo` does, has these; `ferry migrate` reports them as absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DestinationChecks {
    /// Errors the guest's own checks counted on the destination.
    pub mismatches: Option<u64>,
    /// Passes the guest completed on the destination.
    pub passes: Option<u64>,
}

/// The summary as the JSON object `--json` prints: the engine's summary, with
/// `rounds` as a count and the per-round records under `round_stats`, and
/// what the destination said after the switchover (`mismatches_after`,
/// `dest_passes_after`), where it said it.
pub fn json(summary: &MigrationSummary, after: &DestinationChecks) -> serde_json::Value {
    let mut v = serde_json::to_value(summary).expect("summary serializes");
    if let Some(obj) = v.as_object_mut() {
        let rounds = obj.remove("rounds").unwrap_or_default();
        let count = rounds.as_array().map_or(0, |r| r.len());
        obj.insert("rounds".into(), count.into());
        obj.insert("round_stats".into(), rounds);
        if let Some(n) = after.mismatches {
            obj.insert("mismatches_after".into(), n.into());
        }
        if let Some(n) = after.passes {
            obj.insert("dest_passes_after".into(), n.into());
        }
    }
    v
}

/// "none", or the setting and how the batches went, e.g.
/// "auto: 12 raw, 0 lz4, 388 zstd batches; 3.1x".
fn compression(s: &MigrationSummary) -> String {
    let [raw, lz4, zstd] = s.link.batches_by_codec;
    if s.link.compression == Compression::None {
        return "none".into();
    }
    let (page_bytes, wire): (u64, u64) = s
        .memory
        .rounds
        .iter()
        .fold((0, 0), |(r, w), x| (r + x.raw_bytes, w + x.bytes));
    let ratio = page_bytes as f64 / wire.max(1) as f64;
    format!(
        "{}: {raw} raw, {lz4} lz4, {zstd} zstd batches; {ratio:.1}x",
        s.link.compression
    )
}

/// "off", or pages sent as deltas and what they cost.
fn delta(s: &MigrationSummary) -> String {
    let Some(d) = &s.link.delta else {
        return "off".into();
    };
    let whole = d.pages * 4096;
    format!(
        "{} of {} re-sent pages as deltas ({} instead of {}), {} cache",
        d.pages,
        d.pages + d.misses,
        ferry_vm::types::human_bytes(d.bytes),
        ferry_vm::types::human_bytes(whole),
        ferry_vm::types::human_bytes(d.cache_bytes)
    )
}

/// The mode, and what postcopy did if the migration switched to it.
fn mode(s: &MigrationSummary) -> String {
    let Some(p) = s.postcopy.as_ref().filter(|p| p.missing_pages > 0) else {
        return format!("{}: no postcopy switch", s.mode);
    };
    let precopy = s
        .memory
        .rounds
        .iter()
        .filter(|r| r.kind != RoundKind::Postcopy)
        .count();
    let path = match p.fault_path.as_str() {
        "vcpu exit" => format!(" (vCPUs asked themselves: {} fault exits)", p.vcpu_exits),
        "" => String::new(),
        path => format!(" (faults through {path})"),
    };
    let recovered = match p.recoveries {
        0 => String::new(),
        n => format!("; the connections broke and were recovered {n} time(s)"),
    };
    format!(
        "{}: postcopy after {precopy} precopy round(s), {} pages missing at switchover; \
         {} page requests{path}, vCPUs blocked {:.1} ms{}, all pages in {:.1} ms after resume{recovered}",
        s.mode,
        p.missing_pages,
        p.page_requests,
        p.block_ms,
        each_blocked(p),
        p.postcopy_ms
    )
}

/// Each thread's own wait, vCPUs by index: " (vCPU 0 3.1 ms, vCPU 1 0.4 ms)".
fn each_blocked(p: &ferry_engine::PostcopyReport) -> String {
    if p.blocked.is_empty() {
        return String::new();
    }
    let each: Vec<String> = p
        .blocked
        .iter()
        .map(|b| {
            let who = blocked_label(b.vcpu.map(u64::from), u64::from(b.thread), &b.name);
            format!("{who} {:.1} ms", b.blocked_ms)
        })
        .collect();
    format!(" ({})", each.join(", "))
}

/// Who waited for pages: a vCPU by index, a kernel worker as KVM's async
/// page fault for a vCPU it does not name, another thread by id and name.
pub fn blocked_label(vcpu: Option<u64>, thread: u64, name: &str) -> String {
    match vcpu {
        Some(v) => format!("vCPU {v}"),
        None if name.starts_with("kworker") => {
            // The kernel appends the workqueue it last ran: not this wait's.
            let worker = name.split('-').next().unwrap_or(name);
            format!("{worker} (KVM async page fault, for a vCPU)")
        }
        None if name.is_empty() => format!("thread {thread} (not a vCPU)"),
        None => format!("thread {thread} {name} (not a vCPU)"),
    }
}

/// The policy, the throttle it reached, and any escalation.
fn convergence(s: &MigrationSummary) -> String {
    let mut out = policy_name(s);
    let quotas: Vec<(u64, f64)> = s
        .convergence
        .throttle_timeline
        .iter()
        .filter_map(|t| Some((t.quota_bytes?, t.quota_interval_ms?)))
        .collect();
    let limits: Vec<u64> = s
        .convergence
        .throttle_timeline
        .iter()
        .filter_map(|t| t.limit_bytes_per_sec)
        .collect();
    if let (Some(first), Some(min)) = (s.convergence.throttle_timeline.first(), limits.iter().min())
    {
        out += &format!(
            ": dirty limit from round {}, down to {}/s per vCPU ({} steps)",
            first.round,
            ferry_vm::types::human_bytes(*min),
            s.convergence.throttle_timeline.len()
        );
    } else if let (Some(first), Some(&(min, per_ms))) = (
        s.convergence.throttle_timeline.first(),
        quotas
            .iter()
            .min_by(|a, b| (a.0 as f64 / a.1).total_cmp(&(b.0 as f64 / b.1))),
    ) {
        out += &format!(
            ": dirty quota from round {}, the largest vCPU's down to {} per {per_ms:.0} ms ({} steps)",
            first.round,
            ferry_vm::types::human_bytes(min),
            s.convergence.throttle_timeline.len()
        );
    } else if let (Some(first), Some(last)) = (
        s.convergence.throttle_timeline.first(),
        s.convergence.throttle_timeline.last(),
    ) {
        out += &format!(
            ": vCPUs throttled from round {}, {}% up to {}% ({} steps)",
            first.round,
            first.percent,
            last.percent,
            s.convergence.throttle_timeline.len()
        );
    } else {
        out += ": no throttle needed";
    }
    for e in &s.convergence.escalations {
        out += &format!("; after round {}: {}", e.round, e.what);
    }
    for e in &s.convergence.operator_changes {
        out += &format!("; in round {}: {}", e.round, e.what);
    }
    let postcopy = s
        .memory
        .rounds
        .iter()
        .any(|r| r.kind == RoundKind::Postcopy);
    if s.status == ferry_engine::Outcome::Completed && !s.converged && !postcopy {
        out += "; did NOT converge: the round cap forced the stop-and-copy";
    }
    out
}

/// The policy that ran, as the CLI spells it (`default` before one was
/// chosen).
fn policy_name(s: &MigrationSummary) -> String {
    s.convergence
        .converge
        .map_or_else(|| "default".into(), |c| c.to_string())
}

/// What the prediction said for the policy that ran.
fn predicted(s: &MigrationSummary) -> String {
    let Some(p) = &s.convergence.predicted else {
        return "not asked (--predict)".into();
    };
    let Some(f) = p
        .policies
        .iter()
        .find(|f| s.convergence.converge == Some(f.policy))
    else {
        return format!("recommended {}", p.recommended);
    };
    format!(
        "{}: {}, {:.1} s, {:.0} ms downtime, {:.0}% runtime (recommended: {}{})",
        f.policy,
        if f.converges {
            "converges"
        } else {
            "does NOT converge"
        },
        f.total_ms / 1e3,
        f.downtime_ms,
        f.runtime_pct,
        p.recommended,
        if p.link_known {
            ""
        } else {
            "; link rate assumed"
        }
    )
}

/// Each vCPU's runtime and progress during the migration.
fn vcpu_shares(s: &MigrationSummary) -> String {
    if s.convergence.vcpu_shares.is_empty() {
        return "not measured".into();
    }
    let each: Vec<String> = s
        .convergence
        .vcpu_shares
        .iter()
        .enumerate()
        .map(|(v, x)| format!("vCPU{v} {:.0}% / {:.0}%", x.runtime_pct, x.progress_pct))
        .collect();
    each.join(", ")
}

/// The summary as text tables.
pub fn render(s: &MigrationSummary, after: &DestinationChecks) -> String {
    let [rounds, totals] = tables(s, after);
    format!("{}\n{}", rounds.render(), totals.render())
}

/// The summary's tables: each round, and the migration's results.
pub fn tables(s: &MigrationSummary, after: &DestinationChecks) -> [Table; 2] {
    let mut rounds = Table::new(
        "rounds",
        &[
            "round",
            "kind",
            "pages",
            "zero",
            "MiB sent",
            "ms",
            "dirty pages/s",
            "MB/s",
        ],
    );
    for r in &s.memory.rounds {
        rounds.row(vec![
            r.round.to_string(),
            format!("{:?}", r.kind).to_lowercase(),
            r.pages.to_string(),
            r.zero_pages.to_string(),
            format!("{:.1}", r.bytes as f64 / (1 << 20) as f64),
            format!("{:.1}", r.ms),
            format!("{:.0}", r.dirty_rate_pages_s),
            format!("{:.0}", r.bandwidth_mb_s),
        ]);
    }
    let mut totals = Table::new("migration", &["", "result"]);
    let status = format!("{:?}", s.status).to_lowercase();
    let rows = [
        ("status", status),
        (
            "backend / dirty tracking",
            format!("{} / {}", s.backend, s.memory.dirty_tracking),
        ),
        (
            "wire / connections",
            format!(
                "v{}, 1 main + {} data{}",
                s.link.wire_version,
                s.link.connections,
                if s.link.tls { ", mutual TLS" } else { "" }
            ),
        ),
        ("compression", compression(s)),
        ("delta re-sends", delta(s)),
        ("mode", mode(s)),
        ("convergence", convergence(s)),
        ("guest runtime / progress", vcpu_shares(s)),
        ("predicted", predicted(s)),
        ("total time", format!("{:.1} ms", s.total_ms)),
        ("downtime", downtime_and_settle(s)),
        (
            "bytes sent",
            ferry_vm::types::human_bytes(s.link.bytes_sent),
        ),
        (
            "sent once, not twice",
            if s.memory.spared_pages + s.memory.deferred_pages > 0 {
                format!(
                    "{} pages dirtied ahead of the send cursor (harvests within rounds): \
                     {} sent in their round, {} the full pass left for the next",
                    s.memory.spared_pages + s.memory.deferred_pages,
                    s.memory.spared_pages,
                    s.memory.deferred_pages
                )
            } else {
                "none (--harvest-within-rounds spares pages dirtied ahead of the cursor)".into()
            },
        ),
        (
            "digest check",
            if !s.digest_checked {
                "not reached".into()
            } else if s.digest_match {
                "match".into()
            } else {
                "MISMATCH".into()
            },
        ),
        (
            "guest mismatches before / after",
            format!(
                "{} / {}",
                or_dash(s.guest.mismatches_before),
                or_dash(after.mismatches)
            ),
        ),
        ("guest passes on destination", or_dash(after.passes)),
    ];
    for (k, v) in rows {
        totals.row(vec![k.to_string(), v]);
    }
    if let Some(e) = &s.error {
        totals.note(format!("error: {e}"));
    }
    [rounds, totals]
}

/// Each throttle change the policy made, as a table.
pub fn throttle_changes(s: &MigrationSummary) -> Table {
    let mut t = Table::new(
        "throttle changes",
        &[
            "s",
            "after round",
            "time throttle %",
            "quota per vCPU",
            "dirty limit per vCPU",
        ],
    );
    let mib = |b: f64| format!("{:.1} MiB/s", b / (1u64 << 20) as f64);
    for step in &s.convergence.throttle_timeline {
        let quota = match (step.quota_bytes, step.quota_interval_ms) {
            (Some(q), Some(ms)) if ms > 0.0 => mib(q as f64 * 1e3 / ms),
            _ => "-".into(),
        };
        t.row(vec![
            format!("{:.2}", step.at_ms / 1e3),
            step.round.to_string(),
            step.percent.to_string(),
            quota,
            step.limit_bytes_per_sec
                .map_or("-".into(), |l| mib(l as f64)),
        ]);
    }
    if s.convergence.throttle_timeline.is_empty() {
        t.note("the policy changed no throttle");
    }
    t
}

/// The measured downtime, and the settle before it where the guest was
/// held.
fn downtime_and_settle(s: &MigrationSummary) -> String {
    match s.switchover.settle_ms > 0.0 {
        true => format!(
            "{} (the held guest first ran free {:.1} ms, dirtying {} pages)",
            downtime(s),
            s.switchover.settle_ms,
            s.switchover.settle_pages
        ),
        false => downtime(s),
    }
}

/// A count where it is known, `-` where nobody measured it.
fn or_dash(n: Option<u64>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

/// The measured downtime, with what the switchover rule predicted for it.
fn downtime(s: &MigrationSummary) -> String {
    if s.switchover.predicted_downtime_ms > 0.0 && s.converged {
        format!(
            "{:.1} ms (predicted at the switchover: {:.1} ms)",
            s.downtime_ms, s.switchover.predicted_downtime_ms
        )
    } else {
        format!("{:.1} ms", s.downtime_ms)
    }
}
