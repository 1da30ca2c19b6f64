//! `ferry drain --netns`: drain a host of a small fleet built on this
//! machine, for real, under the planner and under KubeVirt's admission, and
//! hold each measured makespan against the simulator's prediction.
//!
//! ```text
//!   build    the hosts (network namespaces on a bridge, NICs shaped with
//!            tbf) and the guests that stay (hosts 2-4)
//!   each     boot the drained host's guests afresh; drain it under the
//!   policy   policy (`drain::exec`); keep every VM's time, downtime and
//!            digest, and each destination's own checks of its guest
//!   report   per policy: measured and predicted makespan, failures,
//!            digests, VMs over their downtime target
//! ```
//!
//! This parses the flags; [`crate::drain::policies`] runs the drains.

use crate::drain::policies::{self, Drains};
use crate::error::CmdError;
use clap::Args;
use std::process::ExitCode;

/// The policies `ferry drain` can run (the first three by default).
const POLICIES: [&str; 6] = [
    "planner",
    "kubevirt",
    "kubevirt-default",
    "hco",
    "nova",
    "vsphere",
];

/// Arguments of `ferry drain`.
#[derive(Args, Debug)]
#[command(after_help = "\
The fleet (see --small for a quick one):
  4 hosts on one bridge, each NIC shaped to --link-rate both ways;
  host1, drained: 8 VMs of 1 vCPU, four of 256 MiB and four of 512 MiB,
  writing 0, 16, 64 and 128 MiB/s (each rate once per size);
  host2-4: 4 VMs of 256 MiB each, writing 8 MiB/s.

Policies, each on the same fleet in turn, the drained host's guests booted
afresh for each:
  planner           ferry's plan: destinations chosen up front, 1 or 2
                    migrations a link (whichever the simulator ends sooner),
                    each VM under the convergence policy that lands it
                    soonest; planned again if it runs slower than planned
  kubevirt          KubeVirt's admission (5 per cluster, 2 out of a node, all
                    created at once, target by free memory), each migration
                    under ferry's default convergence: the schedule alone
  kubevirt-default  the same admission with KubeVirt's migration defaults: no
                    auto-converge, cancelled after 150 s per GiB
  hco, nova,        on request: HCO's 1 out of a node, Nova's 1 per host,
  vsphere           vSphere's 8 a host each way (as `ferry plan --compare`)

Needs root, iproute2 (ip, tc) and /dev/kvm (or --backend soft). Each run's
namespaces carry its pid and are deleted when it ends.")]
pub struct DrainArgs {
    /// Build the fleet on this machine: each host a network namespace on
    /// one bridge (the only fleet `ferry drain` drives so far).
    #[arg(long, required = true)]
    pub netns: bool,
    /// Each host NIC's rate in MiB/s, both ways (tc tbf).
    #[arg(long = "link-rate", value_name = "MIB_S", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(8..=100_000))]
    pub link_rate: u64,
    /// The NIC rate the plan and the predictions assume, MiB/s (default:
    /// --link-rate). Assume more than the link gives to see the planner's
    /// drain measure the NIC and plan again once it runs slower than
    /// planned.
    #[arg(long = "assume-link-rate", value_name = "MIB_S",
          value_parser = clap::value_parser!(u64).range(8..=100_000))]
    pub assume_link_rate: Option<u64>,
    /// The share of each guest's real dirty rate the plan and the
    /// predictions assume (default 1: the rate each guest is set to).
    /// Assume less (0.25) to see the planner's drain measure the guests
    /// still waiting and plan again once it runs slower than planned.
    #[arg(long = "assume-dirty-share", value_name = "SHARE", value_parser = parse_share)]
    pub assume_dirty_share: Option<f64>,
    /// The policies to drain under, in this order.
    #[arg(long, value_delimiter = ',', default_value = "planner,kubevirt,kubevirt-default",
          value_parser = POLICIES)]
    pub policies: Vec<String>,
    /// A small fleet instead: 3 hosts, 3 VMs of 64-128 MiB to move (a quick
    /// check; the default fleet is the one to judge).
    #[arg(long)]
    pub small: bool,
    /// Drain this many times under each policy, the policies' order turned
    /// each round (so none always goes first); the report gives each
    /// policy's median run and every run's makespan.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=20))]
    pub repeat: u64,
    /// The guests' backend.
    #[arg(long, default_value = "auto", value_parser = crate::args::BACKENDS)]
    pub backend: String,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `ferry drain`.
pub fn run(mut a: DrainArgs) -> Result<ExitCode, CmdError> {
    a.backend = crate::args::resolve_backend(&a.backend);
    policies::run(&Drains {
        link_rate: a.link_rate,
        assume_link_rate: a.assume_link_rate,
        assume_dirty_share: a.assume_dirty_share,
        policies: &a.policies,
        small: a.small,
        repeat: a.repeat,
        backend: &a.backend,
        json: a.json,
    })
}

/// `--assume-dirty-share`: a share from 0 to 10.
fn parse_share(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| (0.0..=10.0).contains(v))
        .ok_or_else(|| {
            format!("'{s}': want a share from 0 to 10 (0.25: a quarter of each guest's rate)")
        })
}
