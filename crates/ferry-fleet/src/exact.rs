//! The best schedule of a small drain, found by trying every one, to check
//! the planner against.
//!
//! ```text
//!   schedule  every VM's destination, the order in which the VMs start,
//!             and how many share a link at once (1 or 2); in order, each
//!             starts as soon as its way has room for its share (a list
//!             schedule), under the policy that lands it soonest there
//!   judge     each one runs through the simulator, as the planner's plan
//!             does, so both are measured by one model
//!   beyond    schedules outside this family (a start held back on purpose,
//!             uneven shares) are not tried; the network's lower bound
//!             (`bound`) holds for every schedule whatever its shape
//! ```
//!
//! Destinations times orders times shares grow fast: [`MAX_VMS`] VMs at
//! most, three hosts (two destinations) give 32 x 120 x 2 schedules.

use crate::cost;
use crate::fleet::{Fleet, FleetError};
use crate::network::Reserved;
use crate::sim::{self, Policy, Start, View};
use ferry_engine::choices::ConvergeMode;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// The most VMs to move that the search takes.
pub const MAX_VMS: usize = 6;

/// The policy each VM gets at a demand, computed once per search.
type PolicyCache = Rc<RefCell<HashMap<(usize, u64), ConvergeMode>>>;

/// One list schedule, as a policy the simulator runs.
struct ListSchedule {
    order: Vec<usize>,
    dest: Vec<usize>,
    per_link: f64,
    next: usize,
    cache: PolicyCache,
}

impl Policy for ListSchedule {
    fn name(&self) -> String {
        "exact".into()
    }

    fn admit(&mut self, view: &View, placed: &[Option<usize>]) -> Vec<Start> {
        let links = view.links;
        let demand = |src: usize, dst: usize| links.way(src, dst) / self.per_link;
        let mut load = Reserved::new(links);
        for r in view.running {
            load.add(links, r.src, r.dest, demand(r.src, r.dest));
        }
        let mut starts = Vec::new();
        while let Some(&v) = self.order.get(self.next) {
            let (src, to) = (view.fleet.vms[v].host, self.dest[v]);
            let d = demand(src, to);
            let idle = view.running.is_empty() && starts.is_empty();
            if !(idle || load.fits(links, src, to, d)) || !view.fits(v, to, placed) {
                break;
            }
            load.add(links, src, to, d);
            let mode = *self
                .cache
                .borrow_mut()
                .entry((v, d.to_bits()))
                .or_insert_with(|| cost::quickest(&view.fleet.vms[v], d).0);
            starts.push(Start::capped(v, to, links.way(src, to), mode));
            self.next += 1;
        }
        starts
    }
}

/// The best list schedule found.
#[derive(Clone, Debug)]
pub struct Best {
    /// Its makespan in the simulator, seconds.
    pub makespan_s: f64,
    /// Schedules tried.
    pub tried: usize,
    /// Its start order (fleet VM indices).
    pub order: Vec<usize>,
    /// Each VM's destination, by fleet index (moving VMs only).
    pub dest: Vec<usize>,
    /// Migrations sharing a link at once.
    pub per_link: usize,
}

/// Tries every list schedule of `fleet`'s drain and returns the best;
/// refuses a drain of more than [`MAX_VMS`] VMs.
pub fn best_list_schedule(fleet: &Fleet) -> Result<Best, FleetError> {
    fleet.validate()?;
    let moving = fleet.to_move();
    if moving.len() > MAX_VMS {
        return Err(FleetError::NoRoom(format!(
            "{} VMs to move: the exhaustive search takes at most {MAX_VMS}",
            moving.len()
        )));
    }
    let choices: Vec<Vec<usize>> = moving
        .iter()
        .map(|&v| {
            (0..fleet.hosts.len())
                .filter(|&h| fleet.allows(v, h))
                .collect()
        })
        .collect();
    let room = sim::Ledger::new(fleet).free_memory;
    let cache: PolicyCache = Rc::default();
    let mut best: Option<Best> = None;
    let mut tried = 0;
    let mut pick = vec![0usize; moving.len()];
    loop {
        // One destination per VM, where they all fit at once.
        let mut dest = vec![usize::MAX; fleet.vms.len()];
        let mut used = vec![0u64; fleet.hosts.len()];
        for (i, &v) in moving.iter().enumerate() {
            let Some(&h) = choices[i].get(pick[i]) else {
                return best.ok_or_else(|| FleetError::NoRoom("no VM can go anywhere".into()));
            };
            dest[v] = h;
            used[h] += fleet.vms[v].memory_bytes;
        }
        if used.iter().zip(&room).all(|(u, r)| u <= r) {
            for order in permutations(&moving) {
                for per_link in 1..=2 {
                    let mut p = ListSchedule {
                        order: order.clone(),
                        dest: dest.clone(),
                        per_link: per_link as f64,
                        next: 0,
                        cache: Rc::clone(&cache),
                    };
                    tried += 1;
                    let Ok(o) = sim::run(fleet, &mut p, 1) else {
                        continue;
                    };
                    if o.failed == 0 && best.as_ref().is_none_or(|b| o.makespan_s < b.makespan_s) {
                        best = Some(Best {
                            makespan_s: o.makespan_s,
                            tried: 0,
                            order: order.clone(),
                            dest: dest.clone(),
                            per_link,
                        });
                    }
                }
            }
        }
        // The next combination of destinations.
        let mut i = 0;
        loop {
            if i == pick.len() {
                return best
                    .map(|b| Best { tried, ..b })
                    .ok_or_else(|| FleetError::NoRoom("no schedule moves every VM".into()));
            }
            pick[i] += 1;
            if pick[i] < choices[i].len() {
                break;
            }
            pick[i] = 0;
            i += 1;
        }
    }
}

/// Every order of `items`.
fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut all = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, first);
            all.push(p);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::permutations;

    #[test]
    fn every_order_once() {
        let p = permutations(&[1, 2, 3, 4]);
        assert_eq!(p.len(), 24);
        let mut q = p.clone();
        q.sort();
        q.dedup();
        assert_eq!(q.len(), 24);
    }
}
