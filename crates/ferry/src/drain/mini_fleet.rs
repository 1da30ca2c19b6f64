//! The fleet `ferry drain --netns` builds: a few hosts on one shaped bridge,
//! each VM a real guest whose vCPU writes at a set rate.
//!
//! ```text
//!   default   4 hosts, NICs 200 MiB/s each way
//!             host1 (drained): 8 VMs of 1 vCPU: 256 MiB and 512 MiB,
//!                              each writing 0, 16, 64 and 128 MiB/s
//!             host2-4:         4 VMs of 256 MiB each, writing 8 MiB/s
//!   --small   3 hosts; host1: 3 VMs, 128 MiB writing 0 and 32 MiB/s,
//!             64 MiB writing 16 MiB/s;
//!             host2-3: 1 VM of 64 MiB each, writing 8 MiB/s
//! ```
//!
//! A VM that writes 0 MiB/s reads its memory instead (at
//! [`super::procs::READ_MIB_S`]). Every page holds text-like data
//! (`--fill text`), so the first pass moves every byte, as a real guest's
//! memory would, and no figure rests on zero pages.

use ferry_engine::tunables::DEFAULT_DOWNTIME;
use ferry_fleet::{Caps, Fleet, Host, Network, Vm};

/// Memory each host may give guests: room for its own VMs and the
/// drained host's, as the fleet's capacity (not this machine's).
const HOST_MEMORY: u64 = 4 << 30;
/// vCPUs each host may hold in the plan.
const HOST_CPUS: u32 = 16;

/// One guest of the fleet.
#[derive(Clone, Debug)]
pub struct Guest {
    /// Its name.
    pub name: String,
    /// The host it starts on (0-based).
    pub host: usize,
    /// Its memory, MiB.
    pub memory_mib: u64,
    /// Its vCPU's write rate, MiB/s (0: it only reads).
    pub write_mib_s: u64,
}

/// A fleet to build on this machine.
#[derive(Clone, Debug)]
pub struct MiniFleet {
    /// Hosts.
    pub hosts: usize,
    /// Each NIC's rate each way, MiB/s.
    pub nic_mib_s: u64,
    /// Every guest.
    pub guests: Vec<Guest>,
    /// The host to drain.
    pub drain: usize,
}

impl MiniFleet {
    /// The issue's fleet: 4 hosts, host1's 8 VMs to move.
    pub fn standard(nic_mib_s: u64) -> Self {
        let mut guests = Vec::new();
        for size in [256, 512] {
            for rate in [0, 16, 64, 128] {
                guests.push(guest(0, size, rate));
            }
        }
        for host in 1..4 {
            guests.extend((0..4).map(|k| resident(host, k, 256, 8)));
        }
        MiniFleet {
            hosts: 4,
            nic_mib_s,
            guests,
            drain: 0,
        }
    }

    /// A quick one: 3 hosts, host1's 3 small VMs to move.
    pub fn small(nic_mib_s: u64) -> Self {
        let mut guests = vec![guest(0, 128, 0), guest(0, 128, 32), guest(0, 64, 16)];
        guests.extend((1..3).map(|host| resident(host, 0, 64, 8)));
        MiniFleet {
            hosts: 3,
            nic_mib_s,
            guests,
            drain: 0,
        }
    }

    /// The same fleet as the planner and the simulator see it.
    pub fn fleet(&self) -> Fleet {
        let nic = (self.nic_mib_s << 20) as f64;
        Fleet {
            hosts: (0..self.hosts)
                .map(|h| Host {
                    name: format!("host{}", h + 1),
                    rack: 0,
                    cpus: HOST_CPUS,
                    memory_bytes: HOST_MEMORY,
                    nic_bytes_per_sec: nic,
                    cpu_model: String::new(),
                })
                .collect(),
            network: Network::Flat,
            vms: self
                .guests
                .iter()
                .map(|g| {
                    let bytes = g.memory_mib << 20;
                    Vm {
                        name: g.name.clone(),
                        host: g.host,
                        memory_bytes: bytes,
                        data_bytes: bytes,
                        dirty_bytes_per_sec: vec![(g.write_mib_s << 20) as f64],
                        working_set_bytes: vec![bytes],
                        downtime_target_ms: DEFAULT_DOWNTIME.as_secs_f64() * 1e3,
                        anti_affinity: None,
                        pinned: None,
                        forbidden: Vec::new(),
                    }
                })
                .collect(),
            drain: vec![self.drain],
            caps: Caps::default(),
        }
    }
}

/// A guest named for its size and rate: `vm-512m-64`.
fn guest(host: usize, memory_mib: u64, write_mib_s: u64) -> Guest {
    Guest {
        name: format!("vm-{memory_mib}m-{write_mib_s}"),
        host,
        memory_mib,
        write_mib_s,
    }
}

/// Guest `k` of a host that stays: `h2-0`.
fn resident(host: usize, k: usize, memory_mib: u64, write_mib_s: u64) -> Guest {
    Guest {
        name: format!("h{}-{k}", host + 1),
        ..guest(host, memory_mib, write_mib_s)
    }
}
