//! Seeded random fleets for judging drain policies at scale, drawn from
//! fixed distributions so that no policy is tuned to them.
//!
//! ```text
//!   hosts       N on a fat-tree, racks of R (20–40, drawn per fleet), ToR
//!               uplinks oversubscribed 3:1, 25 Gbit/s NICs, 3 TiB and 512
//!               vCPUs each, one CPU model
//!   VMs         10–40 per host; memory uniform over {2, 4, 8, 16, 32, 64} GiB;
//!               one vCPU per 4 GiB (1–16); dirty rate log-uniform 1–400 MiB/s,
//!               spread over its vCPUs and all of its memory; every page data;
//!               downtime target 300 ms (ferry's default)
//!   drain       rack 0
//! ```

use crate::fleet::{Fleet, Host, Network, Vm};

const GIB: u64 = 1 << 30;
const MIB: f64 = (1u64 << 20) as f64;
/// 25 Gbit/s in bytes per second.
pub const NIC_25G: f64 = 25e9 / 8.0;

/// SplitMix64: a small, fixed generator, so a seed means one fleet on any
/// machine and any version of any crate.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform over lo..=hi.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// A fleet of `hosts` hosts drawn from `seed`, draining rack 0.
pub fn fat_tree(hosts: usize, seed: u64) -> Fleet {
    let mut rng = Rng::new(seed ^ (hosts as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let rack_size = rng.range(20, 40) as usize;
    let hosts_v: Vec<Host> = (0..hosts)
        .map(|i| Host {
            name: format!("host-{i}"),
            rack: i / rack_size,
            cpus: 512,
            memory_bytes: 3 << 40,
            nic_bytes_per_sec: NIC_25G,
            cpu_model: String::new(),
        })
        .collect();
    let mut vms = Vec::new();
    for h in 0..hosts {
        for _ in 0..rng.range(10, 40) {
            let gib = 2u64 << rng.range(0, 5);
            let vcpus = (gib / 4).clamp(1, 16) as usize;
            // Log-uniform over 1–400 MiB/s.
            let rate = MIB * 400f64.powf(rng.unit());
            vms.push(drawn_vm(vms.len(), h, gib * GIB, vcpus, rate));
        }
    }
    let drain = (0..hosts.min(rack_size)).collect();
    Fleet {
        hosts: hosts_v,
        network: Network::FatTree {
            oversubscription: 3.0,
        },
        vms,
        drain,
        caps: Default::default(),
    }
}

/// A drain small enough to solve by trying every schedule (`exact`),
/// drawn from `seed`: one host of `vms` VMs drained to two others over a
/// flat 10 Gbit/s switch; memory uniform over {1, 2, 4, 8} GiB, dirty rate
/// log-uniform 1-400 MiB/s, one or two vCPUs.
pub fn small(vms: usize, seed: u64) -> Fleet {
    let mut rng = Rng::new(seed ^ 0x736d_616c_6c00 ^ vms as u64);
    let hosts = (0..3)
        .map(|i| Host {
            name: format!("host-{i}"),
            rack: 0,
            cpus: 64,
            memory_bytes: 64 * GIB,
            nic_bytes_per_sec: 10e9 / 8.0,
            cpu_model: String::new(),
        })
        .collect();
    let vms = (0..vms)
        .map(|i| {
            let memory = GIB << rng.range(0, 3);
            let vcpus = rng.range(1, 2) as usize;
            let rate = MIB * 400f64.powf(rng.unit());
            drawn_vm(i, 0, memory, vcpus, rate)
        })
        .collect();
    Fleet {
        hosts,
        network: Network::Flat,
        vms,
        drain: vec![0],
        caps: Default::default(),
    }
}

/// VM `i` on host `host`: `memory` bytes, every page data, its dirty rate
/// spread evenly over its vCPUs and all of its memory, ferry's default
/// downtime target, no placement constraint.
fn drawn_vm(i: usize, host: usize, memory: u64, vcpus: usize, rate: f64) -> Vm {
    Vm {
        name: format!("vm-{i}"),
        host,
        memory_bytes: memory,
        data_bytes: memory,
        dirty_bytes_per_sec: vec![rate / vcpus as f64; vcpus],
        working_set_bytes: vec![memory / vcpus as u64; vcpus],
        downtime_target_ms: 300.0,
        anti_affinity: None,
        pinned: None,
        forbidden: Vec::new(),
    }
}
