//! The planner: as many migrations at once as the network carries at full
//! speed each, the hosts with the most left to send first, every VM under
//! the convergence policy ferry's model picks for the rate it will get.
//!
//! ```text
//!   demand    a migration can use at most the least of the links it
//!             crosses (NICs, and a small rack's downlink), shared by k
//!             migrations at once; k (1 or 2) is the one whose whole plan
//!             the simulator ends soonest, tried before the first start
//!   admit     while some host has VMs waiting: take the host with the most
//!             bytes left to send per migration it runs; start its largest
//!             VM whose way still has room for its demand on top of the
//!             running ones' (so each runs near its NIC's rate, and the
//!             bottleneck, a rack's uplink say, is full but not split into
//!             slivers); else that host waits
//!   target    chosen for every VM before anything moves (`destinations`):
//!             the most constrained VMs first, each to the host that takes
//!             it with the least to receive so far; a VM with nowhere to go
//!             is named then, not found stuck halfway
//!   caps      the fleet's own (`Caps`: at once in the fleet, out of and
//!             into a host) are never passed
//!   policy    the one ferry's model says lands the VM soonest at its
//!             demand within its downtime target (`cost::quickest`)
//! ```
//!
//! Why this order. A drain ends when its last host is empty. Shared evenly
//! (one migration per host at once, as Nova does), a host with four times
//! the memory of another is still sending long after the rest are done,
//! at no more than its NIC's rate, while the uplink idles. Sending most
//! from the hosts with most left keeps every host's end near the same
//! time. And a migration with a whole NIC re-sends less of what its guest
//! dirties than one with a sliver, so the same bytes cost less time.

use crate::cost;
use crate::fleet::Fleet;
use crate::network::Reserved;
use crate::sim::{Policy, Start, View};
use ferry_engine::choices::ConvergeMode;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The policy ferry's model picks for a VM at a demand, by (VM, the
/// demand's bits): each is forecast once, though the trials of
/// [`Planner::choose_per_link`] and the drain itself ask again.
type Picks = Arc<Mutex<HashMap<(usize, u64), ConvergeMode>>>;

/// The planner.
#[derive(Debug, Default)]
pub struct Planner {
    /// Each VM's destination, decided before the first migration starts.
    dest: Option<Result<Vec<Option<usize>>, String>>,
    /// Migrations that share a link's rate at once (each demands its
    /// share); `None`: chosen by trial on the first call.
    per_link: Option<usize>,
    /// The policies picked so far, shared with its trials.
    picks: Picks,
}

/// The most migrations the planner tries sharing one link.
pub const MAX_PER_LINK: usize = 2;

impl Planner {
    /// A planner that picks how many migrations share a link by trial.
    pub fn new() -> Self {
        Self::default()
    }

    /// A planner that runs `k` migrations per link at once.
    pub fn per_link(k: usize) -> Self {
        Planner {
            per_link: Some(k.max(1)),
            ..Self::default()
        }
    }

    /// The policy for VM `v` of `fleet` at `demand` bytes/s.
    fn pick(&self, fleet: &Fleet, v: usize, demand: f64) -> ConvergeMode {
        let key = (v, demand.to_bits());
        let known = self
            .picks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied();
        known.unwrap_or_else(|| {
            let (mode, _) = cost::quickest(&fleet.vms[v], demand);
            self.picks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, mode);
            mode
        })
    }

    /// The `k` of 1 to [`MAX_PER_LINK`] whose plan the simulator ends
    /// soonest (the least on a tie). One migration at a time gives each
    /// the whole link, so it re-sends least of what its guest dirties; but
    /// a migration does not fill its link end to end (its start, its last
    /// short rounds, the switchover), and a second one fills those gaps.
    /// Which wins depends on the fleet, so the planner tries each, each
    /// trial on a thread of its own (both share the destinations and the
    /// policies picked, and the drain then reuses the winner's picks).
    fn choose_per_link(&self, fleet: &Fleet) -> usize {
        let trial = |k: usize| {
            let mut p = Planner {
                dest: self.dest.clone(),
                per_link: Some(k),
                picks: Arc::clone(&self.picks),
            };
            crate::sim::run(fleet, &mut p, 1)
                .ok()
                .map(|o| (k, o.makespan_s))
        };
        let ends: Vec<Option<(usize, f64)>> = std::thread::scope(|s| {
            let threads: Vec<_> = (1..=MAX_PER_LINK)
                .map(|k| s.spawn(move || trial(k)))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap_or(None))
                .collect()
        });
        ends.into_iter()
            .flatten()
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
            .map_or(1, |(k, _)| k)
    }
}

/// Each VM to move's destination, chosen before anything moves so that
/// every VM has one: the VMs with the fewest hosts that take them first
/// (pinned ones, members of anti-affinity groups), then the largest;
/// each to the host that takes it whose NIC and rack downlink have the
/// least to receive so far, relative to their rates. A VM that no host
/// can take, once the others have theirs, is named with why.
pub fn destinations(fleet: &Fleet) -> Result<Vec<Option<usize>>, String> {
    let links = crate::network::Links::new(fleet);
    let hosts = fleet.hosts.len();
    let mut free: Vec<i128> = fleet
        .hosts
        .iter()
        .map(|h| i128::from(h.memory_bytes))
        .collect();
    let mut cpus: Vec<i64> = fleet.hosts.iter().map(|h| i64::from(h.cpus)).collect();
    for vm in &fleet.vms {
        free[vm.host] -= i128::from(vm.memory_bytes);
        cpus[vm.host] -= i64::from(vm.vcpus());
    }
    let mut placed: Vec<Option<usize>> = vec![None; fleet.vms.len()];
    // Where each anti-affinity group's VMs are, or will be.
    let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
    for (v, vm) in fleet.vms.iter().enumerate() {
        if let Some(g) = &vm.anti_affinity {
            if !fleet.drained(vm.host) {
                groups
                    .entry(g.as_str())
                    .or_default()
                    .push(fleet.vms[v].host);
            }
        }
    }
    let takes =
        |v: usize, h: usize, free: &[i128], cpus: &[i64], groups: &HashMap<&str, Vec<usize>>| {
            let vm = &fleet.vms[v];
            !fleet.drained(h)
                && h != vm.host
                && free[h] >= i128::from(vm.memory_bytes)
                && cpus[h] >= i64::from(vm.vcpus())
                && fleet.hosts[h].cpu_model == fleet.hosts[vm.host].cpu_model
                && !vm.forbidden.contains(&h)
                && vm.pinned.as_ref().is_none_or(|p| p.contains(&h))
                && vm
                    .anti_affinity
                    .as_ref()
                    .is_none_or(|g| !groups.get(g.as_str()).is_some_and(|at| at.contains(&h)))
        };
    let mut order = fleet.to_move();
    let choices: Vec<usize> = (0..fleet.vms.len())
        .map(|v| {
            (0..hosts)
                .filter(|&h| takes(v, h, &free, &cpus, &groups))
                .count()
        })
        .collect();
    order.sort_by_key(|&v| {
        (
            choices[v],
            fleet.vms[v].anti_affinity.is_none(),
            std::cmp::Reverse(fleet.vms[v].memory_bytes),
            v,
        )
    });
    // Bytes each link is to receive, over its rate.
    let mut inbound = vec![0.0f64; links.capacity.len()];
    for v in order {
        let vm = &fleet.vms[v];
        let load = |h: usize| {
            let nic = inbound[hosts + h] / links.capacity[hosts + h];
            let rack = links
                .downlink(fleet.hosts[h].rack)
                .map_or(0.0, |l| inbound[l] / links.capacity[l]);
            nic.max(rack)
        };
        let best = (0..hosts)
            .filter(|&h| takes(v, h, &free, &cpus, &groups))
            .min_by(|&a, &b| {
                load(a)
                    .total_cmp(&load(b))
                    .then(free[b].cmp(&free[a]))
                    .then(a.cmp(&b))
            });
        let Some(h) = best else {
            let why = if choices[v] == 0 {
                "no host takes it (room, vCPUs, CPU model, pins and anti-affinity counted)"
            } else {
                "the hosts that would take it are full once the VMs with fewer choices have theirs"
            };
            return Err(format!("VM {}: {why}", vm.name));
        };
        placed[v] = Some(h);
        free[h] -= i128::from(vm.memory_bytes);
        cpus[h] -= i64::from(vm.vcpus());
        if let Some(g) = &vm.anti_affinity {
            groups.entry(g.as_str()).or_default().push(h);
        }
        let bytes = vm.data_bytes.min(vm.memory_bytes) as f64;
        inbound[hosts + h] += bytes;
        if let Some(l) = links.downlink(fleet.hosts[h].rack) {
            inbound[l] += bytes;
        }
    }
    Ok(placed)
}

impl Policy for Planner {
    fn name(&self) -> String {
        "planner".into()
    }

    fn why_stuck(&self) -> Option<String> {
        match &self.dest {
            Some(Err(why)) => Some(why.clone()),
            _ => None,
        }
    }

    fn admit(&mut self, view: &View, _placed: &[Option<usize>]) -> Vec<Start> {
        let fleet = view.fleet;
        if self.dest.is_none() {
            self.dest = Some(destinations(fleet));
        }
        if !matches!(self.dest, Some(Ok(_))) {
            return Vec::new();
        }
        if self.per_link.is_none() {
            self.per_link = Some(self.choose_per_link(fleet));
        }
        let per_link = self.per_link.unwrap_or(1) as f64;
        let Some(Ok(dest)) = &self.dest else {
            return Vec::new();
        };
        let links = view.links;
        // What each link already carries, by demand: its share of the
        // least capacity on each running migration's way.
        let demand = |src: usize, dst: usize| links.way(src, dst) / per_link;
        let mut load = Reserved::new(links);
        for r in view.running {
            load.add(links, r.src, r.dest, demand(r.src, r.dest));
        }
        // Migrations out of and into each host, for the platform's caps.
        let (mut out, mut inb): (HashMap<usize, usize>, HashMap<usize, usize>) = Default::default();
        for r in view.running {
            *out.entry(r.src).or_default() += 1;
            *inb.entry(r.dest).or_default() += 1;
        }
        let caps = &fleet.caps;
        let below =
            |cap: Option<usize>, n: Option<&usize>| cap.is_none_or(|c| n.copied().unwrap_or(0) < c);
        // Each source host's waiting VMs, largest first.
        let mut queue: HashMap<usize, Vec<usize>> = HashMap::new();
        for &v in view.waiting {
            queue.entry(fleet.vms[v].host).or_default().push(v);
        }
        for q in queue.values_mut() {
            q.sort_by_key(|&v| (std::cmp::Reverse(fleet.vms[v].memory_bytes), v));
        }
        let left = |q: &Vec<usize>| q.iter().map(|&v| fleet.vms[v].memory_bytes).sum::<u64>();
        let mut starts = Vec::new();
        let mut blocked: Vec<usize> = Vec::new();
        loop {
            if !below(caps.per_cluster, Some(&(view.running.len() + starts.len()))) {
                break;
            }
            let next = queue
                .iter()
                .filter(|(h, q)| {
                    !q.is_empty()
                        && !blocked.contains(h)
                        && below(caps.outbound_per_host, out.get(h))
                })
                .max_by(|(a, qa), (b, qb)| {
                    let ka = left(qa) as f64 / (out.get(a).copied().unwrap_or(0) + 1) as f64;
                    let kb = left(qb) as f64 / (out.get(b).copied().unwrap_or(0) + 1) as f64;
                    ka.total_cmp(&kb).then(b.cmp(a))
                })
                .map(|(h, _)| *h);
            let Some(src) = next else { break };
            let nothing_runs = view.running.is_empty() && starts.is_empty();
            // Its largest VM whose way has room for its demand; beside one
            // of its own already running, the one least like that in size,
            // so that the two do not start and end together: one's start
            // and last rounds, which leave the link idle, overlap the
            // other's bulk.
            let fits = |&v: &usize| {
                let Some(to) = dest[v] else { return false };
                if !below(caps.inbound_per_host, inb.get(&to)) {
                    return false;
                }
                nothing_runs || load.fits(links, src, to, demand(src, to))
            };
            let beside = view
                .running
                .iter()
                .map(|r| r.vm)
                .chain(starts.iter().map(|s: &Start| s.vm))
                .rfind(|&r| fleet.vms[r].host == src)
                .map(|r| fleet.vms[r].memory_bytes as f64);
            let pick = match beside {
                None => queue[&src].iter().position(fits),
                // The one least like it in size (the larger on a tie).
                Some(size) => queue[&src]
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| fits(v))
                    .map(|(i, &v)| (i, (fleet.vms[v].memory_bytes as f64 - size).abs()))
                    .fold(None, |best: Option<(usize, f64)>, (i, d)| match best {
                        Some((_, bd)) if bd >= d => best,
                        _ => Some((i, d)),
                    })
                    .map(|(i, _)| i),
            };
            let Some(i) = pick else {
                blocked.push(src);
                continue;
            };
            let v = queue.get_mut(&src).expect("its queue").remove(i);
            let to = dest[v].expect("picked with a destination");
            let d = demand(src, to);
            load.add(links, src, to, d);
            *out.entry(src).or_default() += 1;
            *inb.entry(to).or_default() += 1;
            let mode = self.pick(fleet, v, d);
            // It may take the whole way while the others sharing it start
            // or finish; its demand only paces admission.
            starts.push(Start::capped(v, to, links.way(src, to), mode));
        }
        starts
    }
}
