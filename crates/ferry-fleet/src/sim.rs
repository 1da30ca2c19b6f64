//! One simulator for every drain policy: the planner's and the platforms'.
//!
//! ```text
//!   loop     ask the policy what to start (it sees the fleet, what runs,
//!            what waits, and each host's room); share the links between
//!            the running migrations (max-min fair, each under its cap);
//!            run each migration's model (ferry's own, `ferry_engine::
//!            converge::model`) for a step at the rate it got
//!   a start  reserves the VM's memory and vCPUs on its destination
//!   an end   frees its source's, and the policy is asked again
//! ```
//!
//! Every migration follows ferry's model under the bandwidth it actually
//! gets as flows come and go, so a policy that starts too many at once
//! pays for it here as it would on the network: each gets a small share,
//! dirties more of what it sent, and takes longer.

use crate::cost;
use crate::fleet::{Fleet, FleetError};
use crate::network::{max_min_fair, Links};
use ferry_engine::choices::ConvergeMode;
use ferry_engine::converge::model::MigrationModel;
use serde::Serialize;
use std::time::{Duration, Instant};

/// The simulator's step.
pub const STEP_SECS: f64 = 0.25;
/// What a migration costs beyond its rounds: connecting, starting dirty
/// logging, the digests and the commit, while its link carries nothing of
/// it. Measured by `ferry drain --netns` on this project's kvm host, as
/// the time a guest that writes nothing took beyond its bytes at the NIC's
/// rate (docs/fleet.md, "The simulator").
pub const SETUP_SECS: f64 = 0.25;
/// A drain still running after this long is given up.
pub const HORIZON_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// A migration to start now.
#[derive(Clone, Debug, PartialEq)]
pub struct Start {
    /// The VM (an index into the fleet's VMs).
    pub vm: usize,
    /// Where it goes.
    pub dest: usize,
    /// The most bandwidth it may take, bytes/s (`None`: what it can get).
    pub cap: Option<f64>,
    /// Its convergence policy.
    pub mode: ConvergeMode,
    /// Cancel it if it has not switched over after this many seconds (an
    /// orchestrator's completion timeout): the VM stays where it was and
    /// counts as failed. `None`: never.
    pub give_up_after_s: Option<f64>,
    /// Its round cap (`None`: the engine's default). An orchestrator that
    /// cancels on a timeout lets precopy iterate until then, as QEMU does.
    pub max_rounds: Option<u32>,
}

impl Start {
    /// A migration of `vm` to `dest` under `mode` that may take at most
    /// `cap` bytes/s, with the engine's round cap and no timeout.
    pub fn capped(vm: usize, dest: usize, cap: f64, mode: ConvergeMode) -> Self {
        Start {
            vm,
            dest,
            cap: Some(cap),
            mode,
            give_up_after_s: None,
            max_rounds: None,
        }
    }
}

/// A running migration, as a policy sees it.
#[derive(Clone, Debug)]
pub struct Running {
    /// The VM.
    pub vm: usize,
    /// From where, to where.
    pub src: usize,
    /// To where.
    pub dest: usize,
}

/// What a policy sees when asked.
pub struct View<'a> {
    /// The fleet.
    pub fleet: &'a Fleet,
    /// Its links.
    pub links: &'a Links,
    /// Seconds since the drain began.
    pub now: f64,
    /// What runs.
    pub running: &'a [Running],
    /// VMs not started yet, in fleet order.
    pub waiting: &'a [usize],
    /// Each host's free memory (reservations of running migrations taken).
    pub free_memory: &'a [u64],
    /// Each host's free vCPUs.
    pub free_cpus: &'a [i64],
}

impl View<'_> {
    /// Migrations running out of host `h`.
    pub fn outbound(&self, h: usize) -> usize {
        self.running.iter().filter(|r| r.src == h).count()
    }

    /// Migrations running into host `h`.
    pub fn inbound(&self, h: usize) -> usize {
        self.running.iter().filter(|r| r.dest == h).count()
    }

    /// Whether VM `v` may go to host `h` now: not drained, not its own,
    /// room for it, its CPU model, its pins, and no VM of its anti-affinity
    /// group there (running, arriving or placed).
    pub fn fits(&self, v: usize, h: usize, placed: &[Option<usize>]) -> bool {
        let vm = &self.fleet.vms[v];
        if !self.fleet.allows(v, h) {
            return false;
        }
        if self.free_memory[h] < vm.memory_bytes || self.free_cpus[h] < i64::from(vm.vcpus()) {
            return false;
        }
        if let Some(group) = &vm.anti_affinity {
            let clash = self.fleet.vms.iter().enumerate().any(|(o, other)| {
                o != v
                    && other.anti_affinity.as_ref() == Some(group)
                    && placed[o].unwrap_or(other.host) == h
            });
            if clash {
                return false;
            }
        }
        true
    }
}

/// A drain policy: what to start, each time something changes.
pub trait Policy {
    /// Its name in reports.
    fn name(&self) -> String;
    /// What to start now. `placed[v]` is where VM v went or goes, for VMs
    /// started so far.
    fn admit(&mut self, view: &View, placed: &[Option<usize>]) -> Vec<Start>;
    /// Why it starts nothing while VMs wait, if it knows.
    fn why_stuck(&self) -> Option<String> {
        None
    }
}

/// How one VM's migration went.
#[derive(Clone, Debug, Serialize)]
pub struct VmOutcome {
    /// The VM's name.
    pub vm: String,
    /// From and to (host names).
    pub from: String,
    /// To.
    pub to: String,
    /// Its convergence policy (serialised by name).
    pub policy: ConvergeMode,
    /// When it started and ended, seconds since the drain began.
    pub start_s: f64,
    /// When it ended.
    pub end_s: f64,
    /// Its downtime, ms.
    pub downtime_ms: f64,
    /// Its downtime target, ms.
    pub downtime_target_ms: f64,
    /// Whether what was left fitted its downtime target.
    pub converged: bool,
    /// Cancelled at its completion timeout: the VM did not move.
    pub gave_up: bool,
    /// Its mean rate, bytes/s.
    pub mean_rate: f64,
    /// The most bandwidth the policy let it take, bytes/s (`None`: what
    /// it could get).
    pub cap_bytes_per_sec: Option<f64>,
}

/// How a drain went.
#[derive(Clone, Debug, Serialize)]
pub struct DrainOutcome {
    /// The policy.
    pub policy: String,
    /// When the last migration ended, seconds.
    pub makespan_s: f64,
    /// Migrations run.
    pub migrations: usize,
    /// Migrations that did not converge (forced to a stop-and-copy over
    /// their target, or cancelled at their completion timeout).
    pub failed: usize,
    /// Migrations whose downtime passed their target.
    pub over_target: usize,
    /// Time the policy spent deciding, seconds.
    pub solve_s: f64,
    /// Most migrations at once.
    pub peak_concurrency: usize,
    /// Every VM's migration.
    pub vms: Vec<VmOutcome>,
}

struct Flow {
    vm: usize,
    src: usize,
    dest: usize,
    path: Vec<usize>,
    cap: f64,
    mode: ConvergeMode,
    model: MigrationModel,
    give_up_after_s: f64,
    /// Seconds of its setup left (it takes no bandwidth meanwhile).
    setup_left: f64,
    start: f64,
    rate: f64,
    moved: f64,
}

/// Where the hosts' room stands during a drain: each host's free memory
/// and vCPUs, and where each VM went or goes. The simulator keeps one, and
/// so does a real drain, so both free and reserve room by one rule.
#[derive(Clone, Debug)]
pub struct Ledger {
    /// Each host's free memory, bytes (running migrations' reserved).
    pub free_memory: Vec<u64>,
    /// Each host's free vCPUs.
    pub free_cpus: Vec<i64>,
    /// Where each VM went or goes, for VMs started so far.
    pub placed: Vec<Option<usize>>,
}

impl Ledger {
    /// The room before anything moves.
    pub fn new(fleet: &Fleet) -> Self {
        let mut memory: Vec<u64> = fleet.hosts.iter().map(|h| h.memory_bytes).collect();
        let mut cpus: Vec<i64> = fleet.hosts.iter().map(|h| i64::from(h.cpus)).collect();
        for vm in &fleet.vms {
            memory[vm.host] = memory[vm.host].saturating_sub(vm.memory_bytes);
            cpus[vm.host] -= i64::from(vm.vcpus());
        }
        Ledger {
            free_memory: memory,
            free_cpus: cpus,
            placed: vec![None; fleet.vms.len()],
        }
    }

    /// VM `v`'s migration to `dest` started: its room there is reserved.
    pub fn start(&mut self, fleet: &Fleet, v: usize, dest: usize) {
        let vm = &fleet.vms[v];
        self.placed[v] = Some(dest);
        self.free_memory[dest] = self.free_memory[dest].saturating_sub(vm.memory_bytes);
        self.free_cpus[dest] -= i64::from(vm.vcpus());
    }

    /// VM `v`'s migration from `src` to `dest` ended: if it `moved`, its
    /// source's room is freed; if not, it stays, and its destination's is.
    pub fn end(&mut self, fleet: &Fleet, v: usize, (src, dest): (usize, usize), moved: bool) {
        let vm = &fleet.vms[v];
        let freed = if moved {
            src
        } else {
            self.placed[v] = None;
            dest
        };
        self.free_memory[freed] += vm.memory_bytes;
        self.free_cpus[freed] += i64::from(vm.vcpus());
    }

    /// What a policy sees of it.
    pub fn view<'a>(
        &'a self,
        fleet: &'a Fleet,
        links: &'a Links,
        now: f64,
        running: &'a [Running],
        waiting: &'a [usize],
    ) -> View<'a> {
        View {
            fleet,
            links,
            now,
            running,
            waiting,
            free_memory: &self.free_memory,
            free_cpus: &self.free_cpus,
        }
    }
}

/// Runs `policy` on `fleet` until every VM on a drained host has moved.
pub fn run(fleet: &Fleet, policy: &mut dyn Policy, seed: u64) -> Result<DrainOutcome, FleetError> {
    fleet.validate()?;
    let links = Links::new(fleet);
    let mut ledger = Ledger::new(fleet);
    let mut waiting = fleet.to_move();
    let mut flows: Vec<Flow> = Vec::new();
    let mut done: Vec<VmOutcome> = Vec::new();
    let (mut now, mut solve, mut peak) = (0.0f64, Duration::ZERO, 0usize);
    let mut changed = true;
    while !waiting.is_empty() || !flows.is_empty() {
        if changed {
            let running: Vec<Running> = flows
                .iter()
                .map(|f| Running {
                    vm: f.vm,
                    src: f.src,
                    dest: f.dest,
                })
                .collect();
            let view = ledger.view(fleet, &links, now, &running, &waiting);
            let t = Instant::now();
            let starts = policy.admit(&view, &ledger.placed);
            solve += t.elapsed();
            for s in starts {
                let vm = &fleet.vms[s.vm];
                let Some(i) = waiting.iter().position(|&w| w == s.vm) else {
                    continue;
                };
                waiting.remove(i);
                ledger.start(fleet, s.vm, s.dest);
                flows.push(Flow {
                    vm: s.vm,
                    src: vm.host,
                    dest: s.dest,
                    path: links.path(vm.host, s.dest),
                    cap: s.cap.unwrap_or(f64::INFINITY),
                    mode: s.mode,
                    model: cost::model(vm, s.mode, s.max_rounds, seed.wrapping_add(s.vm as u64)),
                    give_up_after_s: s.give_up_after_s.unwrap_or(f64::INFINITY),
                    setup_left: SETUP_SECS,
                    start: now,
                    rate: 0.0,
                    moved: 0.0,
                });
            }
            if flows.is_empty() {
                if let Some(why) = policy.why_stuck() {
                    return Err(FleetError::NoRoom(format!("{}: {why}", policy.name())));
                }
                let names: Vec<&str> = waiting
                    .iter()
                    .take(5)
                    .map(|&v| fleet.vms[v].name.as_str())
                    .collect();
                return Err(FleetError::NoRoom(format!(
                    "{}: nothing runs and {} VM(s) wait ({}{}) that it will not start: no host \
                     has room for them that their constraints allow",
                    policy.name(),
                    waiting.len(),
                    names.join(", "),
                    if waiting.len() > 5 { ", ..." } else { "" }
                )));
            }
            peak = peak.max(flows.len());
            let paths: Vec<Vec<usize>> = flows.iter().map(|f| f.path.clone()).collect();
            let caps: Vec<f64> = flows
                .iter()
                .map(|f| if f.setup_left > 0.0 { 0.0 } else { f.cap })
                .collect();
            let rates = max_min_fair(&links.capacity, &paths, &caps);
            for (f, r) in flows.iter_mut().zip(rates) {
                f.rate = r;
            }
            changed = false;
        }
        if now > HORIZON_SECS {
            return Err(FleetError::NoRoom(format!(
                "{}: still draining after {} days",
                policy.name(),
                HORIZON_SECS / 86400.0
            )));
        }
        let mut i = 0;
        while i < flows.len() {
            let f = &mut flows[i];
            if f.setup_left > 0.0 {
                f.setup_left -= STEP_SECS;
                // Its share of the links from the next step on.
                changed |= f.setup_left <= 0.0;
                i += 1;
                continue;
            }
            let before = f.model.elapsed();
            let ended = f.model.advance(STEP_SECS, f.rate).cloned();
            f.moved += (f.model.elapsed() - before) * f.rate;
            let gave_up = ended.is_none() && f.model.elapsed() >= f.give_up_after_s;
            if ended.is_none() && !gave_up {
                i += 1;
                continue;
            }
            let f = flows.swap_remove(i);
            let vm = &fleet.vms[f.vm];
            let (took, downtime_ms, converged) = match &ended {
                Some(end) => (
                    SETUP_SECS + end.total_ms / 1e3,
                    end.downtime_ms,
                    end.converges,
                ),
                None => (SETUP_SECS + f.model.elapsed(), 0.0, false),
            };
            // A cancelled VM stays where it was.
            ledger.end(fleet, f.vm, (f.src, f.dest), !gave_up);
            done.push(VmOutcome {
                vm: vm.name.clone(),
                from: fleet.hosts[f.src].name.clone(),
                to: fleet.hosts[f.dest].name.clone(),
                policy: f.mode,
                start_s: f.start,
                end_s: f.start + took,
                downtime_ms,
                downtime_target_ms: vm.downtime_target_ms,
                converged,
                gave_up,
                mean_rate: f.moved / took.max(1e-9),
                cap_bytes_per_sec: f.cap.is_finite().then_some(f.cap),
            });
            changed = true;
        }
        now += STEP_SECS;
    }
    let makespan_s = done.iter().map(|o| o.end_s).fold(0.0, f64::max);
    Ok(DrainOutcome {
        policy: policy.name(),
        makespan_s,
        migrations: done.len(),
        failed: done.iter().filter(|o| !o.converged).count(),
        over_target: done
            .iter()
            .filter(|o| o.downtime_ms > o.downtime_target_ms)
            .count(),
        solve_s: solve.as_secs_f64(),
        peak_concurrency: peak,
        vms: done,
    })
}
