//! The links a migration's bytes cross, and how flows share them.
//!
//! ```text
//!   links   each host's NIC out and in; on a fat-tree, each rack's uplink
//!           and downlink at (rack NIC rates) / oversubscription
//!   path    source NIC out, destination NIC in, and, between racks, the
//!           source rack's uplink and the destination rack's downlink
//!   share   max-min fair (TCP's long-run share, progressive filling): every
//!           flow grows at the same pace until a link it crosses is full or
//!           it reaches its own cap
//! ```

use crate::fleet::{Fleet, Network};

/// The links of a fleet's network.
#[derive(Clone, Debug)]
pub struct Links {
    /// Each link's capacity, bytes per second.
    pub capacity: Vec<f64>,
    hosts: usize,
    racks: usize,
    fat_tree: bool,
    rack_of: Vec<usize>,
}

impl Links {
    /// The links of `fleet`.
    pub fn new(fleet: &Fleet) -> Self {
        let hosts = fleet.hosts.len();
        let rack_of: Vec<usize> = fleet.hosts.iter().map(|h| h.rack).collect();
        let racks = rack_of.iter().max().map_or(0, |r| r + 1);
        let mut capacity: Vec<f64> = Vec::with_capacity(2 * hosts + 2 * racks);
        for h in &fleet.hosts {
            capacity.push(h.nic_bytes_per_sec); // out
        }
        for h in &fleet.hosts {
            capacity.push(h.nic_bytes_per_sec); // in
        }
        let fat_tree = match fleet.network {
            Network::FatTree { oversubscription } => {
                let mut per_rack = vec![0.0; racks];
                for h in &fleet.hosts {
                    per_rack[h.rack] += h.nic_bytes_per_sec;
                }
                let uplinks: Vec<f64> = per_rack.iter().map(|n| n / oversubscription).collect();
                capacity.extend(&uplinks); // up
                capacity.extend(&uplinks); // down
                true
            }
            Network::Flat => false,
        };
        Links {
            capacity,
            hosts,
            racks,
            fat_tree,
            rack_of,
        }
    }

    /// The links a migration from host `src` to host `dst` crosses.
    pub fn path(&self, src: usize, dst: usize) -> Vec<usize> {
        let mut p = vec![src, self.hosts + dst];
        let (rs, rd) = (self.rack_of[src], self.rack_of[dst]);
        if self.fat_tree && rs != rd {
            p.push(2 * self.hosts + rs);
            p.push(2 * self.hosts + self.racks + rd);
        }
        p
    }

    /// The uplink of rack `r`, if the network has one.
    pub fn uplink(&self, r: usize) -> Option<usize> {
        (self.fat_tree && r < self.racks).then_some(2 * self.hosts + r)
    }

    /// The downlink of rack `r`, if the network has one.
    pub fn downlink(&self, r: usize) -> Option<usize> {
        (self.fat_tree && r < self.racks).then_some(2 * self.hosts + self.racks + r)
    }

    /// Host `h`'s NIC, outward.
    pub fn nic_out(&self, h: usize) -> usize {
        h
    }

    /// The least capacity on the way from `src` to `dst`: the most one
    /// migration between them can take.
    pub fn way(&self, src: usize, dst: usize) -> f64 {
        self.path(src, dst)
            .iter()
            .map(|&l| self.capacity[l])
            .fold(f64::INFINITY, f64::min)
    }
}

/// What a policy has reserved on each link for the migrations it runs or
/// starts, each by its demand (bytes/s).
#[derive(Clone, Debug)]
pub struct Reserved(Vec<f64>);

impl Reserved {
    /// Nothing reserved on any of `links`.
    pub fn new(links: &Links) -> Self {
        Reserved(vec![0.0; links.capacity.len()])
    }

    /// Whether every link from `src` to `dst` has room for `demand` more.
    pub fn fits(&self, links: &Links, src: usize, dst: usize, demand: f64) -> bool {
        links
            .path(src, dst)
            .iter()
            .all(|&l| self.0[l] + demand <= links.capacity[l] * (1.0 + 1e-9))
    }

    /// Reserves `demand` on every link from `src` to `dst`.
    pub fn add(&mut self, links: &Links, src: usize, dst: usize, demand: f64) {
        for l in links.path(src, dst) {
            self.0[l] += demand;
        }
    }
}

/// Each flow's max-min fair rate: `paths[i]` are the links flow i
/// crosses, `caps[i]` its own cap (`f64::INFINITY`: none).
pub fn max_min_fair(capacity: &[f64], paths: &[Vec<usize>], caps: &[f64]) -> Vec<f64> {
    let n = paths.len();
    let mut rate = vec![0.0; n];
    let mut frozen = vec![false; n];
    let mut left = capacity.to_vec();
    let mut crossing = vec![0usize; capacity.len()];
    loop {
        crossing.iter_mut().for_each(|c| *c = 0);
        for (i, p) in paths.iter().enumerate() {
            if !frozen[i] {
                p.iter().for_each(|&l| crossing[l] += 1);
            }
        }
        let by_links = (0..capacity.len())
            .filter(|&l| crossing[l] > 0)
            .map(|l| left[l].max(0.0) / crossing[l] as f64)
            .fold(f64::INFINITY, f64::min);
        let by_caps = (0..n)
            .filter(|&i| !frozen[i])
            .map(|i| caps[i] - rate[i])
            .fold(f64::INFINITY, f64::min);
        let step = by_links.min(by_caps);
        if !step.is_finite() {
            break;
        }
        for (i, p) in paths.iter().enumerate() {
            if !frozen[i] {
                rate[i] += step;
                p.iter().for_each(|&l| left[l] -= step);
            }
        }
        let mut any = false;
        for (i, p) in paths.iter().enumerate() {
            if frozen[i] {
                continue;
            }
            let full = p.iter().any(|&l| left[l] <= capacity[l] * 1e-9);
            if full || rate[i] >= caps[i] * (1.0 - 1e-9) {
                frozen[i] = true;
                any = true;
            }
        }
        if !any || frozen.iter().all(|&f| f) {
            break;
        }
    }
    rate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_share_a_link_evenly_and_a_capped_flow_leaves_the_rest() {
        // Two flows over a link of 10, one capped at 2.
        let r = max_min_fair(&[10.0], &[vec![0], vec![0]], &[f64::INFINITY, 2.0]);
        assert_eq!(r, [8.0, 2.0]);
        let r = max_min_fair(&[10.0], &[vec![0], vec![0]], &[f64::INFINITY; 2]);
        assert_eq!(r, [5.0, 5.0]);
    }

    #[test]
    fn a_flow_held_elsewhere_leaves_its_share_to_the_others() {
        // Links 0 (cap 10) and 1 (cap 2): flow a crosses both, b only 0.
        let r = max_min_fair(&[10.0, 2.0], &[vec![0, 1], vec![0]], &[f64::INFINITY; 2]);
        assert!(
            (r[0] - 2.0).abs() < 1e-9 && (r[1] - 8.0).abs() < 1e-9,
            "{r:?}"
        );
    }
}
