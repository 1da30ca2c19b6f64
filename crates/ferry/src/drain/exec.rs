//! One drain, for real. The policy is asked what to start exactly as the
//! simulator asks it (the same `Policy::admit`, given a `View` of what
//! really runs and where there is room), and each start becomes a real
//! migration: a `ferry receive` on the target host, then the source VM's
//! control socket told the policy's convergence, bandwidth and timeout,
//! and to migrate. The policy is asked again each time one ends.
//!
//! ```text
//!   admit  -> receive on the target, migrate on the source (one thread each)
//!   end    -> the summary: status, time, downtime, digest; room freed
//!   last   -> the makespan; then each destination's own guest checks
//! ```

use super::measured::MeasuredVm;
use super::mini_fleet::MiniFleet;
use super::procs::{request, Receiver, VmProcess};
use super::replan::{self, Dirtying, Moving, Replan, Span};
use super::DrainError;
use crate::netns::NetnsBridge;
use ferry_fleet::network::Links;
use ferry_fleet::sim::{Ledger, Running, Start};
use ferry_fleet::{DrainOutcome, Fleet, Planner, Policy};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest a drain waits for any migration to end before it gives up.
const QUIET_TIMEOUT: Duration = Duration::from_secs(900);
/// How often the drain looks at its running migrations between events.
const LOOK_EVERY: Duration = Duration::from_millis(500);
/// The longest a destination may run its guest checks after the drain
/// (`ferry receive` runs until every vCPU completed a pass, at most 120 s).
const REPORT_GRACE: Duration = Duration::from_secs(135);

/// Where and how a drain runs.
pub struct Env<'a> {
    /// The ferry executable.
    pub exe: &'a Path,
    /// The hosts.
    pub bridge: &'a NetnsBridge,
    /// The fleet as built.
    pub mini: &'a MiniFleet,
    /// The fleet as the policy sees it.
    pub fleet: &'a Fleet,
    /// `kvm` or `soft`.
    pub backend: &'a str,
    /// Logs and sockets.
    pub dir: &'a Path,
}

/// A real drain under one policy.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    /// The policy.
    pub policy: String,
    /// When the last migration ended, seconds.
    pub makespan_s: f64,
    /// Most migrations at once.
    pub peak_concurrency: usize,
    /// Every migration, in the order they ended.
    pub vms: Vec<MeasuredVm>,
    /// Each time the plan was made again (the planner only).
    pub replans: Vec<Replan>,
}

/// What a migration thread sends back.
struct Ended {
    vm: usize,
    reply: Result<Value, DrainError>,
}

/// Drains `env.fleet`'s drained host under `policy`; `sources` holds the
/// running VMs to move, by fleet index. With `plan` (the simulator's run of
/// the planner), a drain slower than planned is planned again
/// (`replan`).
pub fn drain(
    env: &Env,
    mut policy: Box<dyn Policy>,
    mut plan: Option<DrainOutcome>,
    mut sources: HashMap<usize, VmProcess>,
) -> Result<Measured, DrainError> {
    let fleet = env.fleet;
    // The fleet as the policy sees it: re-planning changes what it assumes.
    let mut seen = fleet.clone();
    let mut links = Links::new(&seen);
    let mut replans = Vec::new();
    let mut ledger = Ledger::new(fleet);
    let mut waiting = fleet.to_move();
    let mut running: Vec<(Running, Start, f64)> = Vec::new();
    let mut receivers: Vec<(usize, Receiver)> = Vec::new();
    let mut done: Vec<MeasuredVm> = Vec::new();
    let mut peak = 0;
    let (tx, rx) = mpsc::channel::<Ended>();
    let t0 = Instant::now();
    // The policy is asked what to start after each event, as the
    // simulator asks it, not at the looks in between.
    let mut admit = true;
    let mut last_event = Instant::now();
    // The running migrations already looked at for being late.
    let mut looked: Vec<usize> = Vec::new();
    loop {
        // Ask the policy what to start; the view borrows the state only
        // in this block.
        if std::mem::take(&mut admit) {
            let now_running: Vec<Running> = running.iter().map(|r| r.0.clone()).collect();
            let now = t0.elapsed().as_secs_f64();
            let view = ledger.view(&seen, &links, now, &now_running, &waiting);
            for s in policy.admit(&view, &ledger.placed) {
                let Some(i) = waiting.iter().position(|&w| w == s.vm) else {
                    continue;
                };
                waiting.remove(i);
                let vm = &fleet.vms[s.vm];
                ledger.start(fleet, s.vm, s.dest);
                let guest = &env.mini.guests[s.vm];
                let recv =
                    Receiver::spawn(env.exe, env.bridge, s.dest, guest, env.backend, env.dir)?;
                let control = sources
                    .get(&s.vm)
                    .map(|p| p.control.clone())
                    .ok_or_else(|| DrainError::NotRunning(vm.name.clone()))?;
                let (to, start, tx) = (recv.addr.clone(), s.clone(), tx.clone());
                let nic = seen.hosts[vm.host].nic_bytes_per_sec;
                std::thread::spawn(move || {
                    let reply = migrate(&control, &to, &start, nic);
                    let _ = tx.send(Ended {
                        vm: start.vm,
                        reply,
                    });
                });
                receivers.push((s.vm, recv));
                let r = Running {
                    vm: s.vm,
                    src: vm.host,
                    dest: s.dest,
                };
                running.push((r, s, t0.elapsed().as_secs_f64()));
            }
            peak = peak.max(running.len());
        }
        if running.is_empty() {
            if waiting.is_empty() {
                break;
            }
            let why = policy
                .why_stuck()
                .unwrap_or_else(|| "it starts none of the VMs left".into());
            return Err(DrainError::Stuck {
                policy: policy.name(),
                why,
            });
        }
        let ended = match rx.recv_timeout(LOOK_EVERY) {
            Ok(e) => Some(e),
            Err(mpsc::RecvTimeoutError::Timeout) if last_event.elapsed() < QUIET_TIMEOUT => None,
            Err(_) => return Err(DrainError::Quiet(QUIET_TIMEOUT.as_secs())),
        };
        let mut late = None;
        if let Some(ended) = ended {
            last_event = Instant::now();
            admit = true;
            let end_s = t0.elapsed().as_secs_f64();
            let i = running
                .iter()
                .position(|r| r.0.vm == ended.vm)
                .expect("a running migration ended");
            let (r, s, start_s) = running.swap_remove(i);
            let vm = &fleet.vms[r.vm];
            let m = measured(vm, &r, &s, fleet, start_s, end_s, ended.reply);
            // A VM that moved frees its source; one that did not, its target.
            if m.completed() {
                sources.remove(&r.vm);
            }
            ledger.end(fleet, r.vm, (r.src, r.dest), m.completed());
            late = plan
                .as_ref()
                .and_then(|p| replan::slower(p, &m, r.src, waiting.len()));
            done.push(m);
        }
        if late.is_none() {
            // A migration still running past its planned time says as
            // much as one that ended late (looked at once).
            let now_s = t0.elapsed().as_secs_f64();
            let overdue = plan.as_ref().and_then(|p| {
                running.iter().find_map(|(r, _, start_s)| {
                    if waiting.is_empty() || looked.contains(&r.vm) {
                        return None;
                    }
                    let from = (r.src, fleet.hosts[r.src].name.as_str());
                    let vm = &fleet.vms[r.vm].name;
                    Some((r.vm, replan::late(p, vm, from, (*start_s, now_s), false)?))
                })
            });
            if let Some((vm, l)) = overdue {
                looked.push(vm);
                late = Some(l);
            }
        }
        let new = match (late, &plan) {
            (Some(late), Some(p)) => {
                // What the running ones sent so far counts too.
                let now_s = t0.elapsed().as_secs_f64();
                let mut spans: Vec<Span> = done.iter().filter_map(Span::of).collect();
                let mut moving = Vec::new();
                for (r, _, start_s) in &running {
                    let Some(sent) = sources.get(&r.vm).and_then(|p| sent_so_far(&p.control))
                    else {
                        continue;
                    };
                    spans.push(Span {
                        from: fleet.hosts[r.src].name.clone(),
                        start_s: *start_s,
                        end_s: now_s,
                        bytes: sent,
                    });
                    moving.push(Moving {
                        vm: r.vm,
                        dest: r.dest,
                        sent,
                    });
                }
                let dirtying = dirtying(&waiting, &sources);
                replan::replan(
                    &seen,
                    p,
                    &late,
                    &spans,
                    &dirtying,
                    &ledger.placed,
                    &moving,
                    late.host,
                    waiting.len(),
                )
            }
            _ => None,
        };
        if let Some(new) = new {
            eprintln!(
                "ferry drain: re-planned at {:.1} s: {}",
                new.replan.at_s, new.replan.why
            );
            seen = new.fleet;
            links = Links::new(&seen);
            policy = Box::new(Planner::new());
            plan = Some(new.plan);
            replans.push(new.replan);
            admit = true;
        }
    }
    let makespan_s = done.iter().map(|m| m.end_s).fold(0.0, f64::max);
    // Each destination runs its guest until every vCPU has done a pass
    // there, then reports its checks.
    let deadline = Instant::now() + REPORT_GRACE;
    for (v, recv) in receivers {
        let report = recv.report(deadline);
        let name = &fleet.vms[v].name;
        if let Some(m) = done.iter_mut().find(|m| &m.vm == name) {
            let after = report.as_ref().and_then(|j| j["mismatches_after"].as_u64());
            m.dest_passes_after = report.as_ref().and_then(|j| j["passes_after"].as_u64());
            m.guest_mismatches = match (m.guest_mismatches, after) {
                (Some(b), Some(a)) => Some(b + a),
                (b, None) => b,
                (None, a) => a,
            };
        }
    }
    Ok(Measured {
        policy: policy.name(),
        makespan_s,
        peak_concurrency: peak,
        vms: done,
        replans,
    })
}

/// Sets the source's convergence, round cap and bandwidth as `s` says,
/// then migrates it to `to`; returns its summary when it ends.
fn migrate(control: &Path, to: &str, s: &Start, nic: f64) -> Result<Value, DrainError> {
    let mut set = json!({"cmd": "set"});
    if let Some(r) = s.max_rounds {
        set["max_rounds"] = r.into();
    }
    // A cap below the NIC's rate is the plan's share; at or above, the
    // NIC itself is the limit.
    if let Some(cap) = s.cap.filter(|&c| c < nic) {
        set["bandwidth_mib_s"] = ((cap / f64::from(1u32 << 20)).ceil() as u64).max(1).into();
    }
    if set.as_object().is_some_and(|o| o.len() > 1) {
        let reply = request(control, &set)?;
        if reply.get("ok") == Some(&Value::Bool(false)) {
            return Err(DrainError::Control {
                socket: control.to_path_buf(),
                why: format!("set was refused: {}", reply["error"]),
            });
        }
    }
    let mut m = json!({"cmd": "migrate", "to": to, "converge": s.mode.to_string()});
    if let Some(t) = s.give_up_after_s {
        m["give_up_after_s"] = (t.ceil() as u64).max(1).into();
    }
    request(control, &m)
}

/// Bytes a running migration has sent so far, from its source's
/// `query-migrate`.
/// Each waiting guest's dirty rate, read from its source's `status` (its
/// vCPUs' writes over 200 ms), all at once.
fn dirtying(waiting: &[usize], sources: &HashMap<usize, VmProcess>) -> Vec<Dirtying> {
    let asks: Vec<_> = waiting
        .iter()
        .filter_map(|&vm| {
            let control = sources.get(&vm)?.control.clone();
            Some((vm, std::thread::spawn(move || written(&control))))
        })
        .collect();
    asks.into_iter()
        .filter_map(|(vm, ask)| {
            let bytes_per_sec = ask.join().ok()??;
            Some(Dirtying { vm, bytes_per_sec })
        })
        .collect()
}

/// Bytes a guest writes per second, all vCPUs, as its source counts.
fn written(control: &Path) -> Option<f64> {
    let reply = request(control, &json!({"cmd": "status"})).ok()?;
    let rates = reply["rates"].as_array()?;
    let page = ferry_vm::PAGE_SIZE as f64;
    Some(
        rates
            .iter()
            .filter_map(|r| r["writes_per_s"].as_f64())
            .sum::<f64>()
            * page,
    )
}

fn sent_so_far(control: &Path) -> Option<u64> {
    let reply = request(control, &json!({"execute": "query-migrate"})).ok()?;
    reply["return"]["ram"]["transferred"].as_u64()
}

/// One migration's record from its summary (or why there is none).
fn measured(
    vm: &ferry_fleet::Vm,
    r: &Running,
    s: &Start,
    fleet: &Fleet,
    start_s: f64,
    end_s: f64,
    reply: Result<Value, DrainError>,
) -> MeasuredVm {
    let mut m = MeasuredVm {
        vm: vm.name.clone(),
        from: fleet.hosts[r.src].name.clone(),
        to: fleet.hosts[r.dest].name.clone(),
        policy: s.mode.to_string(),
        start_s,
        end_s,
        status: "failed".into(),
        downtime_ms: 0.0,
        downtime_target_ms: vm.downtime_target_ms,
        bytes_sent: 0,
        digest_match: false,
        guest_mismatches: None,
        dest_passes_after: None,
        error: None,
    };
    match reply {
        Ok(j) if j.get("ok") == Some(&Value::Bool(false)) => {
            m.error = Some(j["error"].as_str().unwrap_or("refused").to_string());
        }
        Ok(j) => {
            m.status = j["status"].as_str().unwrap_or("unknown").to_string();
            m.downtime_ms = j["downtime_ms"].as_f64().unwrap_or(0.0);
            m.bytes_sent = j["bytes_sent"].as_u64().unwrap_or(0);
            m.digest_match = j["digest_match"].as_bool().unwrap_or(false);
            m.guest_mismatches = j["mismatches_before"].as_u64();
            m.error = j["error"].as_str().map(str::to_string);
        }
        Err(e) => m.error = Some(ferry_vm::error_chain(&e)),
    }
    m
}
