//! The least time any schedule can drain a fleet in.

use crate::fleet::Fleet;
use crate::network::Links;

/// The least time any schedule needs: every byte that must leave a host
/// crosses its NIC, and every byte that must leave a wholly drained rack
/// crosses its uplink.
pub fn lower_bound(fleet: &Fleet) -> f64 {
    let links = Links::new(fleet);
    let mut per_link = vec![0.0f64; links.capacity.len()];
    let racks = fleet
        .hosts
        .iter()
        .map(|h| h.rack)
        .max()
        .map_or(0, |r| r + 1);
    let rack_drained: Vec<bool> = (0..racks)
        .map(|r| {
            fleet
                .hosts
                .iter()
                .enumerate()
                .all(|(i, h)| h.rack != r || fleet.drained(i))
        })
        .collect();
    for v in fleet.to_move() {
        let vm = &fleet.vms[v];
        let bytes = vm.data_bytes.min(vm.memory_bytes) as f64;
        per_link[links.nic_out(vm.host)] += bytes;
        let rack = fleet.hosts[vm.host].rack;
        if let (true, Some(up)) = (rack_drained[rack], links.uplink(rack)) {
            per_link[up] += bytes;
        }
    }
    per_link
        .iter()
        .zip(&links.capacity)
        .map(|(b, c)| b / c)
        .fold(0.0, f64::max)
}
