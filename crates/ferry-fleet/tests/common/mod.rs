//! Fleets the tests share: hosts and VMs by a few numbers, and two racks
//! of three hosts with the first drained.

#![allow(dead_code)]

use ferry_fleet::{Fleet, Host, Network, Vm};

pub const GIB: u64 = 1 << 30;
pub const MIB: f64 = (1u64 << 20) as f64;

pub fn host(i: usize, rack: usize, memory_gib: u64) -> Host {
    Host {
        name: format!("h{i}"),
        rack,
        cpus: 64,
        memory_bytes: memory_gib * GIB,
        nic_bytes_per_sec: 1e9,
        cpu_model: String::new(),
    }
}

pub fn vm(i: usize, host: usize, gib: u64, dirty_mib_s: f64) -> Vm {
    Vm {
        name: format!("vm{i}"),
        host,
        memory_bytes: gib * GIB,
        data_bytes: gib * GIB,
        dirty_bytes_per_sec: vec![dirty_mib_s * MIB / 2.0; 2],
        working_set_bytes: vec![gib * GIB / 2; 2],
        downtime_target_ms: 300.0,
        anti_affinity: None,
        pinned: None,
        forbidden: Vec::new(),
    }
}

/// Two racks of three hosts, 3:1 uplinks; rack 0's three hosts drained,
/// eight VMs on them of 1-4 GiB dirtying 0-200 MiB/s.
pub fn two_racks() -> Fleet {
    let hosts = (0..6).map(|i| host(i, i / 3, 64)).collect();
    let vms = (0..8)
        .map(|i| {
            vm(
                i,
                i % 3,
                1 + (i as u64 % 4),
                [0.0, 10.0, 50.0, 200.0][i % 4],
            )
        })
        .collect();
    Fleet {
        hosts,
        network: Network::FatTree {
            oversubscription: 3.0,
        },
        vms,
        drain: vec![0, 1, 2],
        caps: Default::default(),
    }
}
