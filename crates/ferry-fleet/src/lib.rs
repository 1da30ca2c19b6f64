//! Draining a host or a rack as fast as the network allows.
//!
//! An operator asks "when is this rack empty, and did every VM make it",
//! not "how long does one migration take". The platforms answer with
//! admission caps alone (`admission`). The planner (`planner`) schedules
//! on ferry's own per-migration model instead, which knows each VM's dirty
//! rate and what each convergence policy does with it, and on the network's
//! links. One simulator (`sim`) runs every policy on the same fleet, each
//! migration following ferry's model under the bandwidth it actually gets.
//! `export` writes the planner's plan as objects a platform applies
//! (KubeVirt's migrations and migration policies, in waves).

pub mod admission;
pub mod bound;
pub mod cost;
pub mod exact;
pub mod export;
pub mod fleet;
pub mod generate;
pub mod network;
pub mod planner;
pub mod sim;

pub use admission::Admission;
pub use bound::lower_bound;
pub use fleet::{Caps, Fleet, FleetError, Host, Network, Vm};
pub use planner::Planner;
pub use sim::{run, DrainOutcome, Policy, VmOutcome};

/// Every policy, the planner first, then the baselines.
pub fn policies() -> Vec<Box<dyn Policy>> {
    let mut p: Vec<Box<dyn Policy>> = vec![Box::new(Planner::new())];
    p.extend(
        Admission::all()
            .into_iter()
            .map(|a| Box::new(a) as Box<dyn Policy>),
    );
    p
}

/// The policy called `name`: one of [`policies`], or `kubevirt-default`
/// (KubeVirt's admission with its own migration defaults).
pub fn policy_named(name: &str) -> Option<Box<dyn Policy>> {
    if name == "kubevirt-default" {
        return Some(Box::new(Admission::kubevirt_default()));
    }
    policies().into_iter().find(|p| p.name() == name)
}
