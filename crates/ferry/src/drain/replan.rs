//! Re-planning a drain that runs slower than planned. The plan rests on
//! what the fleet said: each NIC's rate, each guest's dirty rate. When a
//! migration takes well over the time the plan gave it, the drain measures
//! the drained host's NIC from the migrations done so far, and the dirty
//! rate of each guest still waiting to move. If the NIC is slower or a
//! guest dirties faster than the plan assumed, it plans the migrations not
//! yet started again on the fleet as it now stands (moved VMs on their new
//! hosts, the NIC and the guests at their measured rates): their
//! destinations, their policies and how many run at once.
//!
//! ```text
//!   trigger   a migration took over SLOW x its planned time
//!   measure   the host's bytes sent, by the migrations done and (read
//!             live from their sources) those running, over the time any
//!             of them was sending, each one's setup left out; each
//!             waiting guest's writes, read from its source (`status`)
//!   re-plan   when the NIC is under RATE_GAP x what the plan assumed, or
//!             a waiting guest writes over RATE_RISE x its assumed rate
//! ```

use super::measured::MeasuredVm;
use ferry_fleet::sim::SETUP_SECS;
use ferry_fleet::{DrainOutcome, Fleet};
use serde::Serialize;

/// A migration this much slower than planned triggers a look.
pub const SLOW: f64 = 1.25;
/// A NIC measured under this share of its assumed rate is re-planned on.
pub const RATE_GAP: f64 = 0.85;
/// A guest measured writing over this multiple of its assumed rate (and
/// by more than [`RATE_NOISE`]) is re-planned on.
pub const RATE_RISE: f64 = 1.25;
/// Differences in a dirty rate below this, bytes/s, are noise: a reader's
/// own bookkeeping, a writer's pacing.
pub const RATE_NOISE: f64 = (2u64 << 20) as f64;

/// One re-plan, as reported.
#[derive(Clone, Debug, Serialize)]
pub struct Replan {
    /// Seconds since the drain began.
    pub at_s: f64,
    /// What triggered it.
    pub why: String,
    /// The NIC rate the plan had assumed, MiB/s.
    pub assumed_nic_mib_s: f64,
    /// The NIC rate measured, MiB/s (0: nothing to measure it by yet).
    pub measured_nic_mib_s: f64,
    /// The waiting guests found dirtying faster than the plan assumed.
    pub dirtier: Vec<Dirtier>,
    /// VMs not started yet, re-planned.
    pub replanned_vms: usize,
    /// When the plan had the drain end, seconds since it began.
    pub predicted_end_before_s: f64,
    /// When the new plan has it end (the migrations still running share
    /// the NIC in it until they have sent what they had left).
    pub predicted_end_after_s: f64,
}

/// A waiting guest that writes faster than the plan assumed.
#[derive(Clone, Debug, Serialize)]
pub struct Dirtier {
    /// The VM.
    pub vm: String,
    /// Its dirty rate as the plan had it, MiB/s.
    pub assumed_mib_s: f64,
    /// As measured, MiB/s.
    pub measured_mib_s: f64,
}

/// A waiting guest's dirty rate as measured: the VM (fleet index) and
/// bytes/s.
#[derive(Clone, Copy, Debug)]
pub struct Dirtying {
    /// The VM.
    pub vm: usize,
    /// Bytes it writes per second, all vCPUs.
    pub bytes_per_sec: f64,
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
/// bytes/s; each guest in `dirtying` at its measured rate (shared over
/// its vCPUs as the fleet had it, evenly where it had none).
pub fn fleet_now(
    fleet: &Fleet,
    placed: &[Option<usize>],
    moving: &[Moving],
    host: usize,
    nic: f64,
    dirtying: &[Dirtying],
) -> Fleet {
    let mut f = fleet.clone();
    for d in dirtying {
        let Some(vm) = f.vms.get_mut(d.vm) else {
            continue;
        };
        let rates = &mut vm.dirty_bytes_per_sec;
        let total: f64 = rates.iter().sum();
        let n = rates.len().max(1) as f64;
        if rates.is_empty() {
            rates.push(d.bytes_per_sec);
        } else {
            for r in rates.iter_mut() {
                *r = if total > 0.0 {
                    *r / total * d.bytes_per_sec
                } else {
                    d.bytes_per_sec / n
                };
            }
        }
    }
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

/// A migration that took, or has taken so far, over [`SLOW`] times what
/// the plan gave it.
#[derive(Clone, Debug)]
pub struct Late {
    /// The VM.
    pub vm: String,
    /// Its source host's index.
    pub host: usize,
    /// And its name.
    pub from: String,
    /// Seconds it took (or has run).
    pub took: f64,
    /// Seconds the plan gave it.
    pub planned: f64,
    /// When it was seen late, seconds since the drain began.
    pub at_s: f64,
    /// Whether it had ended then (else it was still running).
    pub ended: bool,
}

/// `m`, which left host `host`, if it took over [`SLOW`] times its plan
/// and VMs still wait to start.
pub fn slower(plan: &DrainOutcome, m: &MeasuredVm, host: usize, waiting: usize) -> Option<Late> {
    let from = (host, m.from.as_str());
    let late = late(plan, &m.vm, from, (m.start_s, m.end_s), true)?;
    (waiting > 0 && m.completed()).then_some(late)
}

/// VM `vm`, which left host `from` at `start_s`, if at `at_s` it has run
/// over [`SLOW`] times what the plan gave it; `ended`: it ended then.
pub fn late(
    plan: &DrainOutcome,
    vm: &str,
    (host, from): (usize, &str),
    (start_s, at_s): (f64, f64),
    ended: bool,
) -> Option<Late> {
    let planned = planned_secs(plan, vm)?;
    let took = at_s - start_s;
    (took > SLOW * planned).then(|| Late {
        vm: vm.into(),
        host,
        from: from.into(),
        took,
        planned,
        at_s,
        ended,
    })
}

/// The guests of `dirtying` that write faster than `fleet` assumed.
pub fn dirtier(fleet: &Fleet, dirtying: &[Dirtying]) -> Vec<Dirtier> {
    let mib = f64::from(1u32 << 20);
    dirtying
        .iter()
        .filter_map(|d| {
            let vm = fleet.vms.get(d.vm)?;
            let assumed: f64 = vm.dirty_bytes_per_sec.iter().sum();
            let faster =
                d.bytes_per_sec > RATE_RISE * assumed && d.bytes_per_sec - assumed > RATE_NOISE;
            faster.then(|| Dirtier {
                vm: vm.name.clone(),
                assumed_mib_s: assumed / mib,
                measured_mib_s: d.bytes_per_sec / mib,
            })
        })
        .collect()
}

/// A new plan after a migration ran late, if host `host`'s NIC, measured
/// over `spans`, is slower than `fleet` assumed, or a waiting guest
/// (`dirtying`, measured) writes faster. `plan` is the plan in force;
/// `placed` where each VM went or goes; `moving` the migrations still
/// running; `waiting` how many VMs wait to start.
#[allow(clippy::too_many_arguments)]
pub fn replan(
    fleet: &Fleet,
    plan: &DrainOutcome,
    late: &Late,
    spans: &[Span],
    dirtying: &[Dirtying],
    placed: &[Option<usize>],
    moving: &[Moving],
    host: usize,
    waiting: usize,
) -> Option<NewPlan> {
    let measured = measured_nic(spans, &fleet.hosts[host].name);
    let assumed = fleet.hosts[host].nic_bytes_per_sec;
    let slow_nic = measured.filter(|&r| r < RATE_GAP * assumed);
    let dirtier = dirtier(fleet, dirtying);
    if slow_nic.is_none() && dirtier.is_empty() {
        return None;
    }
    let nic = slow_nic.unwrap_or(assumed);
    let now = fleet_now(fleet, placed, moving, host, nic, dirtying);
    let rest = ferry_fleet::run(&now, &mut ferry_fleet::Planner::new(), 1).ok()?;
    let mib = f64::from(1u32 << 20);
    let mut why = format!(
        "{} {} {:.1} s against {:.1} s planned",
        late.vm,
        if late.ended { "took" } else { "had run" },
        late.took,
        late.planned
    );
    if let Some(r) = slow_nic {
        why += &format!(
            "; {}'s NIC measured {:.0} MiB/s, the plan assumed {:.0}",
            late.from,
            r / mib,
            assumed / mib
        );
    }
    for d in &dirtier {
        why += &format!(
            "; {} dirties {:.0} MiB/s, the plan assumed {:.0}",
            d.vm, d.measured_mib_s, d.assumed_mib_s
        );
    }
    Some(NewPlan {
        replan: Replan {
            at_s: late.at_s,
            why,
            assumed_nic_mib_s: assumed / mib,
            measured_nic_mib_s: measured.unwrap_or(0.0) / mib,
            dirtier,
            replanned_vms: waiting,
            predicted_end_before_s: plan.makespan_s,
            predicted_end_after_s: late.at_s + rest.makespan_s,
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

    #[test]
    fn a_waiting_guest_dirtying_faster_than_assumed_is_named_and_planned_at_its_rate() {
        let mib = f64::from(1u32 << 20);
        let mut fleet = crate::drain::mini_fleet::MiniFleet::small(100).fleet();
        // The plan thought every guest wrote a quarter of its rate.
        for r in fleet
            .vms
            .iter_mut()
            .flat_map(|v| v.dirty_bytes_per_sec.iter_mut())
        {
            *r *= 0.25;
        }
        let by_name = |n: &str| fleet.vms.iter().position(|v| v.name == n).unwrap();
        let (reader, writer) = (by_name("vm-128m-0"), by_name("vm-128m-32"));
        let measured = [
            // A reader's own bookkeeping is noise, not dirtying.
            Dirtying {
                vm: reader,
                bytes_per_sec: 0.5 * mib,
            },
            Dirtying {
                vm: writer,
                bytes_per_sec: 32.0 * mib,
            },
        ];
        let found = dirtier(&fleet, &measured);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].vm, "vm-128m-32");
        assert_eq!(
            (found[0].assumed_mib_s, found[0].measured_mib_s),
            (8.0, 32.0)
        );
        // Within RATE_RISE of the plan: nothing to re-plan on.
        let close = [Dirtying {
            vm: writer,
            bytes_per_sec: 9.0 * mib,
        }];
        assert!(dirtier(&fleet, &close).is_empty());
        // The new plan's fleet has the guest at its measured rate.
        let placed = vec![None; fleet.vms.len()];
        let now = fleet_now(&fleet, &placed, &[], 0, 100.0 * mib, &measured);
        assert_eq!(now.vms[writer].dirty_bytes_per_sec, [32.0 * mib]);
        assert_eq!(now.vms[reader].dirty_bytes_per_sec, [0.5 * mib]);
    }
}
