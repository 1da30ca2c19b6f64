//! What a drain starts from: hosts, the network between them, the VMs on
//! them, and which hosts to empty.
//!
//! ```text
//!   host     CPUs (vCPUs it may hold), memory, NIC rate, rack, CPU model
//!   network  flat: every host on one non-blocking switch
//!            fat-tree: hosts behind their rack's ToR, whose uplink to the
//!            spine carries (rack NICs) / oversubscription; the spine does
//!            not block
//!   VM       vCPUs, memory, the pages holding data, each vCPU's dirty rate
//!            and working set (ferry's sampler measures them), a downtime
//!            target, and where it may go (anti-affinity group, pinned or
//!            forbidden hosts)
//! ```

use serde::{Deserialize, Serialize};

/// One host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// Its name (a Kubernetes node name, say).
    pub name: String,
    /// Its rack (fat-tree only; 0 on a flat network).
    pub rack: usize,
    /// vCPUs it may hold.
    pub cpus: u32,
    /// Memory it may give guests, bytes.
    pub memory_bytes: u64,
    /// Its NIC's rate each way, bytes per second.
    pub nic_bytes_per_sec: f64,
    /// Its CPU model: a VM moves only to a host of the same model (the
    /// contract's CPU check where hosts differ).
    #[serde(default)]
    pub cpu_model: String,
}

/// The network between the hosts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Network {
    /// One non-blocking switch: only the NICs limit.
    Flat,
    /// Racks behind ToR switches whose uplinks are oversubscribed.
    FatTree {
        /// Rack NIC bandwidth over uplink bandwidth (3 for 3:1).
        oversubscription: f64,
    },
}

/// One VM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Vm {
    /// Its name.
    pub name: String,
    /// The host it runs on (an index into [`Fleet::hosts`]).
    pub host: usize,
    /// Guest memory, bytes.
    pub memory_bytes: u64,
    /// Of those, the bytes of pages that hold data (the full pass sends a
    /// zero page as a bit).
    pub data_bytes: u64,
    /// Per vCPU: bytes of clean pages dirtied per second.
    pub dirty_bytes_per_sec: Vec<f64>,
    /// Per vCPU: the most bytes it can have dirtied at once.
    pub working_set_bytes: Vec<u64>,
    /// The downtime it may take, ms.
    pub downtime_target_ms: f64,
    /// VMs of one group never share a host.
    #[serde(default)]
    pub anti_affinity: Option<String>,
    /// If set, the only hosts it may go to.
    #[serde(default)]
    pub pinned: Option<Vec<usize>>,
    /// Hosts it must not go to.
    #[serde(default)]
    pub forbidden: Vec<usize>,
}

impl Vm {
    /// Its vCPUs.
    pub fn vcpus(&self) -> u32 {
        self.dirty_bytes_per_sec.len().max(1) as u32
    }

    /// Its dirty rate, all vCPUs, bytes per second.
    pub fn dirty_rate(&self) -> f64 {
        self.dirty_bytes_per_sec.iter().sum()
    }
}

/// Limits of the platform the drain runs on, which the plan respects.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Caps {
    /// Migrations at once in the whole fleet.
    #[serde(default)]
    pub per_cluster: Option<usize>,
    /// Migrations at once out of one host.
    #[serde(default)]
    pub outbound_per_host: Option<usize>,
    /// Migrations at once into one host.
    #[serde(default)]
    pub inbound_per_host: Option<usize>,
}

/// The whole input of a drain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fleet {
    /// Every host.
    pub hosts: Vec<Host>,
    /// The network.
    pub network: Network,
    /// Every VM, on whichever host.
    pub vms: Vec<Vm>,
    /// The hosts to empty.
    pub drain: Vec<usize>,
    /// The platform's limits.
    #[serde(default)]
    pub caps: Caps,
}

/// A fleet that cannot be planned as given.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FleetError {
    /// A VM names a host that is not there.
    #[error("VM {vm} is on host {host}, but the fleet has {hosts} hosts")]
    NoSuchHost {
        /// The VM.
        vm: String,
        /// The index it names.
        host: usize,
        /// Hosts in the fleet.
        hosts: usize,
    },
    /// A host to drain is not there.
    #[error("host {0} is to be drained, but there is no such host")]
    NoSuchDrain(usize),
    /// A VM's vCPU rates and working sets differ in number.
    #[error("VM {0}: {1} dirty rates but {2} working sets (one each per vCPU)")]
    VcpuMismatch(String, usize, usize),
    /// A figure that must be positive is not.
    #[error("{0} must be above 0")]
    NotPositive(String),
    /// Nowhere to go.
    #[error("{0}")]
    NoRoom(String),
}

/// Whether `x` is a finite number above 0 (not NaN).
fn positive(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

impl Fleet {
    /// Checks that the fleet holds together: every index names something,
    /// every rate is a rate.
    pub fn validate(&self) -> Result<(), FleetError> {
        let hosts = self.hosts.len();
        for h in &self.hosts {
            if !positive(h.nic_bytes_per_sec) {
                return Err(FleetError::NotPositive(format!(
                    "host {}'s NIC rate",
                    h.name
                )));
            }
        }
        if let Network::FatTree { oversubscription } = self.network {
            if !positive(oversubscription) {
                return Err(FleetError::NotPositive("the oversubscription".into()));
            }
        }
        let caps = &self.caps;
        for (name, cap) in [
            ("caps.per_cluster", caps.per_cluster),
            ("caps.outbound_per_host", caps.outbound_per_host),
            ("caps.inbound_per_host", caps.inbound_per_host),
        ] {
            if cap == Some(0) {
                return Err(FleetError::NotPositive(name.into()));
            }
        }
        for &d in &self.drain {
            if d >= hosts {
                return Err(FleetError::NoSuchDrain(d));
            }
        }
        for vm in &self.vms {
            if vm.host >= hosts {
                return Err(FleetError::NoSuchHost {
                    vm: vm.name.clone(),
                    host: vm.host,
                    hosts,
                });
            }
            if vm.dirty_bytes_per_sec.len() != vm.working_set_bytes.len() {
                return Err(FleetError::VcpuMismatch(
                    vm.name.clone(),
                    vm.dirty_bytes_per_sec.len(),
                    vm.working_set_bytes.len(),
                ));
            }
            if vm
                .dirty_bytes_per_sec
                .iter()
                .any(|r| !(r.is_finite() && *r >= 0.0))
            {
                return Err(FleetError::NotPositive(format!(
                    "VM {}'s dirty rates (0 or above)",
                    vm.name
                )));
            }
        }
        Ok(())
    }

    /// The VMs to move: those on a drained host, in fleet order.
    pub fn to_move(&self) -> Vec<usize> {
        (0..self.vms.len())
            .filter(|&v| self.drain.contains(&self.vms[v].host))
            .collect()
    }

    /// Whether VM `v` may ever go to host `h`, room aside: not drained,
    /// not its own, its CPU model, its pins.
    pub fn allows(&self, v: usize, h: usize) -> bool {
        let vm = &self.vms[v];
        !self.drained(h)
            && h != vm.host
            && self.hosts[h].cpu_model == self.hosts[vm.host].cpu_model
            && !vm.forbidden.contains(&h)
            && vm.pinned.as_ref().is_none_or(|p| p.contains(&h))
    }

    /// Whether host `h` is drained.
    pub fn drained(&self, h: usize) -> bool {
        self.drain.contains(&h)
    }
}
