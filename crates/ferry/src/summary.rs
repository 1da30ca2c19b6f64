//! Printing a migration summary: a table for people, one JSON line for machines.

use ferry_engine::choices::Compression;
use ferry_engine::{MigrationSummary, RoundKind};
use ferry_report::Table;

/// The summary as the JSON object `--json` prints: the engine's summary, with
/// `rounds` as a count and the per-round records under `round_stats`.
pub fn json(summary: &MigrationSummary) -> serde_json::Value {
    let mut v = serde_json::to_value(summary).expect("summary serializes");
    if let Some(obj) = v.as_object_mut() {
        let rounds = obj.remove("rounds").unwrap_or_default();
        let count = rounds.as_array().map_or(0, |r| r.len());
        obj.insert("rounds".into(), count.into());
        obj.insert("round_stats".into(), rounds);
    }
    v
}

/// "none", or the setting and how the batches went, e.g.
/// "auto: 12 raw, 0 lz4, 388 zstd batches; 3.1x".
fn compression(s: &MigrationSummary) -> String {
    let [raw, lz4, zstd] = s.batches_by_codec;
    if s.compression == Compression::None {
        return "none".into();
    }
    let (page_bytes, wire): (u64, u64) = s
        .rounds
        .iter()
        .fold((0, 0), |(r, w), x| (r + x.raw_bytes, w + x.bytes));
    let ratio = page_bytes as f64 / wire.max(1) as f64;
    format!(
        "{}: {raw} raw, {lz4} lz4, {zstd} zstd batches; {ratio:.1}x",
        s.compression
    )
}

/// "off", or pages sent as deltas and what they cost.
fn delta(s: &MigrationSummary) -> String {
    let Some(d) = &s.delta else {
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
        .throttle_timeline
        .iter()
        .filter_map(|t| Some((t.quota_bytes?, t.quota_interval_ms?)))
        .collect();
    let limits: Vec<u64> = s
        .throttle_timeline
        .iter()
        .filter_map(|t| t.limit_bytes_per_sec)
        .collect();
    if let (Some(first), Some(min)) = (s.throttle_timeline.first(), limits.iter().min()) {
        out += &format!(
            ": dirty limit from round {}, down to {}/s per vCPU ({} steps)",
            first.round,
            ferry_vm::types::human_bytes(*min),
            s.throttle_timeline.len()
        );
    } else if let (Some(first), Some(&(min, per_ms))) = (
        s.throttle_timeline.first(),
        quotas
            .iter()
            .min_by(|a, b| (a.0 as f64 / a.1).total_cmp(&(b.0 as f64 / b.1))),
    ) {
        out += &format!(
            ": dirty quota from round {}, the largest vCPU's down to {} per {per_ms:.0} ms ({} steps)",
            first.round,
            ferry_vm::types::human_bytes(min),
            s.throttle_timeline.len()
        );
    } else if let (Some(first), Some(last)) =
        (s.throttle_timeline.first(), s.throttle_timeline.last())
    {
        out += &format!(
            ": vCPUs throttled from round {}, {}% up to {}% ({} steps)",
            first.round,
            first.percent,
            last.percent,
            s.throttle_timeline.len()
        );
    } else {
        out += ": no throttle needed";
    }
    for e in &s.escalations {
        out += &format!("; after round {}: {}", e.round, e.what);
    }
    for e in &s.operator_changes {
        out += &format!("; in round {}: {}", e.round, e.what);
    }
    let postcopy = s.rounds.iter().any(|r| r.kind == RoundKind::Postcopy);
    if s.status == ferry_engine::Outcome::Completed && !s.converged && !postcopy {
        out += "; did NOT converge: the round cap forced the stop-and-copy";
    }
    out
}

/// The policy that ran, as the CLI spells it (`default` before one was
/// chosen).
fn policy_name(s: &MigrationSummary) -> String {
    s.converge
        .map_or_else(|| "default".into(), |c| c.to_string())
}

/// What the prediction said for the policy that ran.
fn predicted(s: &MigrationSummary) -> String {
    let Some(p) = &s.predicted else {
        return "not asked (--predict)".into();
    };
    let Some(f) = p.policies.iter().find(|f| s.converge == Some(f.policy)) else {
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
    if s.vcpu_shares.is_empty() {
        return "not measured".into();
    }
    let each: Vec<String> = s
        .vcpu_shares
        .iter()
        .enumerate()
        .map(|(v, x)| format!("vCPU{v} {:.0}% / {:.0}%", x.runtime_pct, x.progress_pct))
        .collect();
    each.join(", ")
}

/// The summary as text tables.
pub fn render(s: &MigrationSummary) -> String {
    let [rounds, totals] = tables(s);
    format!("{}\n{}", rounds.render(), totals.render())
}

/// The summary's tables: each round, and the migration's results.
pub fn tables(s: &MigrationSummary) -> [Table; 2] {
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
    for r in &s.rounds {
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
            format!("{} / {}", s.backend, s.dirty_tracking),
        ),
        (
            "wire / connections",
            format!(
                "v{}, 1 main + {} data{}",
                s.wire_version,
                s.connections,
                if s.tls { ", mutual TLS" } else { "" }
            ),
        ),
        ("compression", compression(s)),
        ("delta re-sends", delta(s)),
        ("mode", mode(s)),
        ("convergence", convergence(s)),
        ("guest runtime / progress", vcpu_shares(s)),
        ("predicted", predicted(s)),
        ("total time", format!("{:.1} ms", s.total_ms)),
        ("downtime", downtime(s)),
        ("bytes sent", ferry_vm::types::human_bytes(s.bytes_sent)),
        (
            "sent once, not twice",
            if s.spared_pages > 0 {
                format!(
                    "{} pages dirtied ahead of the send cursor (harvests within rounds)",
                    s.spared_pages
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
                or_dash(s.mismatches_before),
                or_dash(s.mismatches_after)
            ),
        ),
        ("guest passes on destination", or_dash(s.dest_passes_after)),
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
    for step in &s.throttle_timeline {
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
    if s.throttle_timeline.is_empty() {
        t.note("the policy changed no throttle");
    }
    t
}

/// A count where it is known, `-` where nobody measured it.
fn or_dash(n: Option<u64>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

/// The measured downtime, with what the switchover rule predicted for it.
fn downtime(s: &MigrationSummary) -> String {
    if s.predicted_downtime_ms > 0.0 && s.converged {
        format!(
            "{:.1} ms (predicted at the switchover: {:.1} ms)",
            s.downtime_ms, s.predicted_downtime_ms
        )
    } else {
        format!("{:.1} ms", s.downtime_ms)
    }
}
