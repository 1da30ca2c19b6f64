//! Re-planning a drain that runs slower than planned. The plan rests on
//! what the fleet said: each NIC's rate, each guest's dirty rate. When a
//! migration takes well over the time the plan gave it, the drain measures
//! the drained host's NIC from the migrations done so far, and if it is
//! slower than the plan assumed, plans the migrations not yet started
//! again on the fleet as it now stands (moved VMs on their new hosts, the
//! NIC at its measured rate): their destinations, their policies and how
//! many run at once.
//!
//! ```text
//!   trigger   a migration took over SLOW x its planned time
//!   measure   the host's bytes sent, by the migrations done and (read
//!             live from their sources) those running, over the time any
//!             of them was sending, each one's setup left out
//!   re-plan   when that is under RATE_GAP x what the plan assumed
//! ```

use super::exec::MeasuredVm;
use ferry_fleet::sim::SETUP_SECS;
use ferry_fleet::{DrainOutcome, Fleet};
use serde::Serialize;

/// A migration this much slower than planned triggers a look.
pub const SLOW: f64 = 1.25;
/// A NIC measured under this share of its assumed rate is re-planned on.
pub const RATE_GAP: f64 = 0.85;

/// One re-plan, as reported.
#[derive(Clone, Debug, Serialize)]
pub struct Replan {
    /// Seconds since the drain began.
    pub at_s: f64,
    /// What triggered it.
    pub why: String,
    /// The NIC rate the plan had assumed, MiB/s.
    pub assumed_nic_mib_s: f64,
    /// The NIC rate measured, MiB/s.
    pub measured_nic_mib_s: f64,
    /// VMs not started yet, re-planned.
    pub replanned_vms: usize,
    /// When the plan had the drain end, seconds since it began.
    pub predicted_end_before_s: f64,
    /// When the new plan has it end (the migrations still running share
    /// the NIC in it until they have sent what they had left).
    pub predicted_end_after_s: f64,
}

/// How long the plan gave VM `vm`, seconds, if it did.
pub fn planned_secs(plan: &DrainOutcome, vm: &str) -> Option<f64> {
    plan.vms
        .iter()
        .find(|o| o.vm == vm)
        .map(|o| o.end_s - o.start_s)
}

/// What one migration sent and when: a completed one's whole run, or a
/// running one's so far (its bytes read live from its source).
#[derive(Clone, Debug)]
pub struct Span {
    /// Its source host's name.
    pub from: String,
    /// When it started, seconds since the drain began.
    pub start_s: f64,
    /// When it ended, or now.
    pub end_s: f64,
    /// Bytes sent.
    pub bytes: u64,
}

impl Span {
    /// A completed migration's span; `None` if it did not complete.
    pub fn of(m: &MeasuredVm) -> Option<Span> {
        m.completed().then(|| Span {
            from: m.from.clone(),
            start_s: m.start_s,
            end_s: m.end_s,
            bytes: m.bytes_sent,
        })
    }
}

/// Host `from`'s NIC rate, bytes/s, as its migrations measured it: their
/// bytes over the union of the spans in which at least one was sending
/// (each span starting after its setup).
pub fn measured_nic(spans: &[Span], from: &str) -> Option<f64> {
    let mine: Vec<&Span> = spans.iter().filter(|s| s.from == from).collect();
    let bytes: u64 = mine.iter().map(|s| s.bytes).sum();
    let mut busy_spans: Vec<(f64, f64)> = mine
        .iter()
        .map(|s| ((s.start_s + SETUP_SECS).min(s.end_s), s.end_s))
        .collect();
    busy_spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut busy = 0.0;
    let mut cur: Option<(f64, f64)> = None;
    for (s, e) in busy_spans {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                busy += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = cur {
        busy += ce - cs;
    }
    (busy > 0.0 && bytes > 0).then(|| bytes as f64 / busy)
}

/// A migration still running at a re-plan: the VM, where it goes, and the
/// bytes it has sent.
#[derive(Clone, Copy, Debug)]
pub struct Moving {
    /// The VM (fleet index).
    pub vm: usize,
    /// Its destination.
    pub dest: usize,
    /// Bytes sent so far.
    pub sent: u64,
}

/// The fleet as it stands for a new plan: every VM that moved on its
/// destination; every one still moving on its source, pinned to its
/// destination, with what it has yet to send as its data (so the new
/// plan shares the NIC with it until it ends); host `host`'s NIC at `nic`
/// bytes/s.
pub fn fleet_now(
    fleet: &Fleet,
    placed: &[Option<usize>],
    moving: &[Moving],
    host: usize,
    nic: f64,
) -> Fleet {
    let mut f = fleet.clone();
    for (v, (vm, to)) in f.vms.iter_mut().zip(placed).enumerate() {
        match (moving.iter().find(|m| m.vm == v), to) {
            (Some(m), _) => {
                vm.pinned = Some(vec![m.dest]);
                vm.data_bytes = vm.data_bytes.saturating_sub(m.sent).max(4096);
            }
            (None, Some(to)) => vm.host = *to,
            (None, None) => {}
        }
    }
    f.hosts[host].nic_bytes_per_sec = nic;
    f
}

/// What a re-plan gives: the report, the fleet as it stands, and the
/// simulator's new plan of the VMs not yet started.
pub struct NewPlan {
    /// The report.
    pub replan: Replan,
    /// The fleet the new plan is on.
    pub fleet: Fleet,
    /// The new plan.
    pub plan: DrainOutcome,
}

/// How long `m` took and the plan gave it, if it took over [`SLOW`]
/// times that and VMs still wait to start.
pub fn slower(plan: &DrainOutcome, m: &MeasuredVm, waiting: usize) -> Option<(f64, f64)> {
    let planned = planned_secs(plan, &m.vm)?;
    let took = m.end_s - m.start_s;
    (waiting > 0 && m.completed() && took > SLOW * planned).then_some((took, planned))
}

/// A new plan after `m` ran slower than planned, if host `host`'s NIC,
/// measured over `spans`, is slower than `fleet` assumed. `plan` is the
/// plan in force; `placed` where each VM went or goes; `moving` the
/// migrations still running; `waiting` how many VMs wait to start.
#[allow(clippy::too_many_arguments)]
pub fn replan(
    fleet: &Fleet,
    plan: &DrainOutcome,
    m: &MeasuredVm,
    (took, planned): (f64, f64),
    spans: &[Span],
    placed: &[Option<usize>],
    moving: &[Moving],
    host: usize,
    waiting: usize,
) -> Option<NewPlan> {
    let measured = measured_nic(spans, &fleet.hosts[host].name)?;
    let assumed = fleet.hosts[host].nic_bytes_per_sec;
    if measured >= RATE_GAP * assumed {
        return None;
    }
    let now = fleet_now(fleet, placed, moving, host, measured);
    let rest = ferry_fleet::run(&now, &mut ferry_fleet::Planner::new(), 1).ok()?;
    let mib = f64::from(1u32 << 20);
    Some(NewPlan {
        replan: Replan {
            at_s: m.end_s,
            why: format!(
                "{} took {took:.1} s against {planned:.1} s planned; {}'s NIC measured {:.0} MiB/s, the plan assumed {:.0}",
                m.vm,
                m.from,
                measured / mib,
                assumed / mib
            ),
            assumed_nic_mib_s: assumed / mib,
            measured_nic_mib_s: measured / mib,
            replanned_vms: waiting,
            predicted_end_before_s: plan.makespan_s,
            predicted_end_after_s: m.end_s + rest.makespan_s,
        },
        fleet: now,
        plan: rest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(vm: &str, start_s: f64, end_s: f64, mib: u64) -> MeasuredVm {
        MeasuredVm {
            vm: vm.into(),
            from: "host1".into(),
            to: "host2".into(),
            policy: "none".into(),
            start_s,
            end_s,
            status: "completed".into(),
            downtime_ms: 0.0,
            downtime_target_ms: 300.0,
            bytes_sent: mib << 20,
            digest_match: true,
            guest_mismatches: Some(0),
            dest_passes_after: Some(1),
            error: None,
        }
    }

    #[test]
    fn the_nic_is_measured_over_the_time_any_migration_was_sending() {
        let mib = f64::from(1u32 << 20);
        // Two overlapping: 1.25-4 and 2.25-5 are busy 1.25-5 (3.75 s).
        let spans = |ms: &[MeasuredVm]| ms.iter().filter_map(Span::of).collect::<Vec<_>>();
        let two = spans(&[done("a", 1.0, 4.0, 300), done("b", 2.0, 5.0, 450)]);
        let r = measured_nic(&two, "host1").unwrap() / mib;
        assert!((r - 750.0 / 3.75).abs() < 1e-6, "{r}");
        // A gap between them is not counted.
        let apart = spans(&[done("a", 0.0, 1.25, 100), done("b", 10.0, 11.25, 100)]);
        let r = measured_nic(&apart, "host1").unwrap() / mib;
        assert!((r - 100.0).abs() < 1e-6, "{r}");
        // Failed ones and other hosts' are not counted.
        let mut failed = done("c", 0.0, 5.0, 999);
        failed.status = "failed".into();
        assert!(measured_nic(&spans(&[failed]), "host1").is_none());
        assert!(measured_nic(&two, "host9").is_none());
    }
}
