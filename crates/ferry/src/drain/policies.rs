//! Each policy's real drain of the same fleet, in turn: the simulator's
//! prediction of each first, the guests that stay booted once, the
//! drained host's guests booted afresh for each run, and the report
//! ([`super::report`]) at the end. `ferry drain` gives it its flags as
//! [`Drains`].

use super::exec::{self, Env, Measured};
use super::mini_fleet::MiniFleet;
use super::procs::VmProcess;
use super::report;
use crate::error::CmdError;
use crate::netns::{LinkShape, NetnsBridge};
use ferry_fleet::{policy_named, DrainOutcome};
use ferry_vm::error_chain as chain;
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

/// How long the drained host's guests run before the drain starts.
const WARMUP: Duration = Duration::from_secs(3);

/// What to drain, and how (`ferry drain`'s flags).
pub struct Drains<'a> {
    /// Each host NIC's rate in MiB/s, both ways.
    pub link_rate: u64,
    /// The NIC rate the plan and the predictions assume, MiB/s.
    pub assume_link_rate: Option<u64>,
    /// The share of each guest's dirty rate the plan and predictions assume.
    pub assume_dirty_share: Option<f64>,
    /// The policies, in this order (a name `policy_named` does not know is
    /// refused before anything runs).
    pub policies: &'a [String],
    /// The small fleet instead of the standard one.
    pub small: bool,
    /// Runs under each policy.
    pub repeat: u64,
    /// The guests' backend, resolved (`kvm` or `soft`).
    pub backend: &'a str,
    /// One JSON object as the last line of stdout, instead of the tables.
    pub json: bool,
}

/// Runs the drains `a` asks for, each policy in turn (each turn of
/// `repeat` starting one policy later), and prints the report; fails the
/// exit code if a moved guest did not verify.
pub fn run(a: &Drains) -> Result<ExitCode, CmdError> {
    let mini = if a.small {
        MiniFleet::small(a.link_rate)
    } else {
        MiniFleet::standard(a.link_rate)
    };
    let mut fleet = mini.fleet();
    if let Some(r) = a.assume_link_rate {
        for h in &mut fleet.hosts {
            h.nic_bytes_per_sec = (r << 20) as f64;
        }
    }
    if let Some(share) = a.assume_dirty_share {
        for rate in fleet
            .vms
            .iter_mut()
            .flat_map(|v| v.dirty_bytes_per_sec.iter_mut())
        {
            *rate *= share;
        }
    }
    fleet
        .validate()
        .map_err(|e| CmdError::Usage(e.to_string()))?;
    // The simulator's prediction of each policy, before anything runs.
    let mut predicted: Vec<DrainOutcome> = Vec::new();
    for name in a.policies {
        let mut p = policy_named(name)
            .ok_or_else(|| CmdError::Usage(format!("no policy called {name}")))?;
        let o = ferry_fleet::run(&fleet, p.as_mut(), 1)
            .map_err(|e| CmdError::Failed(format!("{name}: the plan cannot be met: {e}")))?;
        predicted.push(o);
    }
    let exe = std::env::current_exe()
        .map_err(|e| CmdError::Failed(format!("cannot find the ferry executable: {e}")))?;
    let dir = std::env::temp_dir().join(format!("ferry-drain-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| CmdError::Failed(format!("cannot create {}: {e}", dir.display())))?;
    let shape = LinkShape {
        rate_bytes_per_sec: Some(a.link_rate << 20),
        delay: None,
    };
    let bridge = NetnsBridge::create(mini.hosts, shape).map_err(|e| CmdError::Failed(chain(&e)))?;
    let env = Env {
        exe: &exe,
        bridge: &bridge,
        mini: &mini,
        fleet: &fleet,
        backend: a.backend,
        dir: &dir,
    };
    let failed = |e: super::DrainError| {
        CmdError::Failed(format!("{} (logs in {})", chain(&e), dir.display()))
    };
    eprintln!(
        "ferry drain: {} hosts on a bridge, NICs {} MiB/s; host{} holds {} VMs to move; {} guests in all on the {} backend",
        mini.hosts,
        a.link_rate,
        mini.drain + 1,
        fleet.to_move().len(),
        mini.guests.len(),
        a.backend
    );
    // The guests that stay run through every policy's drain.
    let mut staying = Vec::new();
    for g in mini.guests.iter().filter(|g| g.host != mini.drain) {
        staying.push(VmProcess::boot(&exe, &bridge, g, a.backend, &dir).map_err(failed)?);
    }
    // Each policy's runs, by its index in --policies.
    let mut measured: Vec<Vec<Measured>> = vec![Vec::new(); a.policies.len()];
    let n = a.policies.len();
    for round in 0..a.repeat as usize {
        for i in (0..n).map(|k| (k + round) % n) {
            let (name, prediction) = (&a.policies[i], &predicted[i]);
            let mut sources = HashMap::new();
            for v in fleet.to_move() {
                let g = &mini.guests[v];
                sources.insert(
                    v,
                    VmProcess::boot(&exe, &bridge, g, a.backend, &dir).map_err(failed)?,
                );
            }
            std::thread::sleep(WARMUP);
            eprintln!(
                "ferry drain: {name}{}: draining host{} (predicted {:.1} s)",
                if a.repeat > 1 {
                    format!(", run {} of {}", round + 1, a.repeat)
                } else {
                    String::new()
                },
                mini.drain + 1,
                prediction.makespan_s
            );
            let policy = policy_named(name)
                .ok_or_else(|| CmdError::Usage(format!("no policy called {name}")))?;
            // The planner's drain is planned again if it runs slower than planned.
            let plan = (name == "planner").then(|| prediction.clone());
            let m = exec::drain(&env, policy, plan, sources).map_err(failed)?;
            eprintln!(
                "ferry drain: {name}: {:.1} s, {} of {} moved",
                m.makespan_s,
                m.vms.iter().filter(|v| v.completed()).count(),
                m.vms.len()
            );
            measured[i].push(m);
        }
    }
    drop(staying);
    let report = report::report(&mini.fleet(), &measured, &predicted);
    if a.json {
        println!("{report}");
    } else {
        print!("{}", report::render(&report, &measured));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let wrong = measured
        .iter()
        .flatten()
        .flat_map(|m| &m.vms)
        .any(|v| v.completed() && (!v.digest_match || v.guest_mismatches.unwrap_or(0) > 0));
    Ok(if wrong {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
