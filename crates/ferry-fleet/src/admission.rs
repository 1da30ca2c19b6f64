//! The platforms' own ways to drain a host, as baselines: admission caps
//! and a target chosen by free memory, with no model of bandwidth, dirty
//! rate or topology.
//!
//! | policy | at once in the fleet | out of a host | into a host | source |
//! |---|---|---|---|---|
//! | `kubevirt` | 5 | 2 | - | `parallelMigrationsPerCluster`, `parallelOutboundMigrationsPerNode` |
//! | `hco` | 5 | 1 | - | HyperConverged's tuned default |
//! | `nova` | - | 1 | - | `max_concurrent_live_migrations` |
//! | `vsphere` | - | 8 | 8 | vMotion's cost model at 10 GbE |
//!
//! Every migration is created at once, in the order the VMs are listed
//! (a KubeVirt node drain makes one per VMI), and waits until the caps let
//! it start. Its target is the host with the most free memory that takes
//! it (the Kubernetes scheduler's LeastAllocated, Nova's RAM weigher, DRS's
//! memory balance). No bandwidth is reserved: each takes what it gets.
//! Each runs under ferry's default convergence, so that what differs from
//! the planner is the schedule alone.
//!
//! `kubevirt-default` is KubeVirt's admission with KubeVirt's own migration
//! defaults too: no auto-converge, no postcopy, and a completion timeout of
//! 150 s per GiB of guest memory (`completionTimeoutPerGiB`), until which
//! QEMU iterates. A VM that cannot converge is cancelled at its timeout and
//! stays on its host. It is asked for by name (`ferry drain`, `ferry plan
//! --policy`); the fleet bench judges the schedules alone.

use crate::cost::DEFAULT_POLICY;
use crate::sim::{Policy, Start, View};
use ferry_engine::choices::ConvergeMode;

/// A platform's admission.
#[derive(Clone, Debug)]
pub struct Admission {
    /// Its name.
    pub name: &'static str,
    /// Migrations at once in the fleet.
    pub per_cluster: Option<usize>,
    /// Migrations at once out of one host.
    pub outbound_per_host: Option<usize>,
    /// Migrations at once into one host.
    pub inbound_per_host: Option<usize>,
    /// The convergence policy of its migrations.
    pub mode: ConvergeMode,
    /// Seconds per GiB of guest memory before a migration is cancelled;
    /// with it, precopy iterates until then (no round cap).
    pub completion_timeout_per_gib: Option<f64>,
}

/// KubeVirt's `completionTimeoutPerGiB` default, seconds.
pub const KUBEVIRT_COMPLETION_TIMEOUT_PER_GIB: f64 = 150.0;

/// The round cap of a migration an orchestrator's timeout ends: the
/// engine's most.
const UNCAPPED_ROUNDS: u32 = *ferry_engine::tunables::MAX_ROUNDS.end() as u32;

impl Admission {
    /// KubeVirt's defaults.
    pub fn kubevirt() -> Self {
        Admission {
            name: "kubevirt",
            per_cluster: Some(5),
            outbound_per_host: Some(2),
            inbound_per_host: None,
            mode: DEFAULT_POLICY,
            completion_timeout_per_gib: None,
        }
    }

    /// KubeVirt's admission and its migration defaults: no auto-converge,
    /// 150 s per GiB before a migration is cancelled.
    pub fn kubevirt_default() -> Self {
        Admission {
            name: "kubevirt-default",
            mode: ConvergeMode::None,
            completion_timeout_per_gib: Some(KUBEVIRT_COMPLETION_TIMEOUT_PER_GIB),
            ..Self::kubevirt()
        }
    }

    /// The HyperConverged operator's: one outbound migration per node.
    pub fn hco() -> Self {
        Admission {
            name: "hco",
            outbound_per_host: Some(1),
            ..Self::kubevirt()
        }
    }

    /// Nova's: one live migration per source host.
    pub fn nova() -> Self {
        Admission {
            name: "nova",
            per_cluster: None,
            outbound_per_host: Some(1),
            inbound_per_host: None,
            mode: DEFAULT_POLICY,
            completion_timeout_per_gib: None,
        }
    }

    /// vSphere's cost model at 10 GbE: 8 vMotions per host, either way.
    pub fn vsphere() -> Self {
        Admission {
            name: "vsphere",
            per_cluster: None,
            outbound_per_host: Some(8),
            inbound_per_host: Some(8),
            mode: DEFAULT_POLICY,
            completion_timeout_per_gib: None,
        }
    }

    /// Every baseline.
    pub fn all() -> Vec<Admission> {
        vec![Self::kubevirt(), Self::hco(), Self::nova(), Self::vsphere()]
    }
}

impl Policy for Admission {
    fn name(&self) -> String {
        self.name.to_string()
    }

    fn admit(&mut self, view: &View, placed: &[Option<usize>]) -> Vec<Start> {
        let hosts = view.fleet.hosts.len();
        let mut out: Vec<usize> = (0..hosts).map(|h| view.outbound(h)).collect();
        let mut inb: Vec<usize> = (0..hosts).map(|h| view.inbound(h)).collect();
        let mut free = view.free_memory.to_vec();
        let mut cpus = view.free_cpus.to_vec();
        let mut placed = placed.to_vec();
        let mut running = view.running.len();
        let mut starts = Vec::new();
        for &v in view.waiting {
            if self.per_cluster.is_some_and(|c| running >= c) {
                break;
            }
            let src = view.fleet.vms[v].host;
            if self.outbound_per_host.is_some_and(|c| out[src] >= c) {
                continue;
            }
            let here = View {
                free_memory: &free,
                free_cpus: &cpus,
                ..*view
            };
            let dest = (0..hosts)
                .filter(|&h| self.inbound_per_host.is_none_or(|c| inb[h] < c))
                .filter(|&h| here.fits(v, h, &placed))
                .max_by_key(|&h| (free[h], std::cmp::Reverse(h)));
            let Some(dest) = dest else { continue };
            let vm = &view.fleet.vms[v];
            free[dest] -= vm.memory_bytes;
            cpus[dest] -= i64::from(vm.vcpus());
            placed[v] = Some(dest);
            out[src] += 1;
            inb[dest] += 1;
            running += 1;
            let timeout = self
                .completion_timeout_per_gib
                .map(|t| t * vm.memory_bytes as f64 / f64::from(1u32 << 30));
            starts.push(Start {
                vm: v,
                dest,
                cap: None,
                mode: self.mode,
                give_up_after_s: timeout,
                max_rounds: timeout.map(|_| UNCAPPED_ROUNDS),
            });
        }
        starts
    }
}
