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

use crate::drain::exec::{self, Env, Measured};
use crate::drain::fleet::MiniFleet;
use crate::drain::procs::VmProcess;
use crate::error::CmdError;
use crate::netns::{LinkShape, NetnsBridge};
use clap::Args;
use ferry_fleet::{lower_bound, policy_named, DrainOutcome};
use ferry_report::Table;
use ferry_vm::error_chain as chain;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

/// The policies `ferry drain` can run (the first three by default).
const POLICIES: [&str; 6] = [
    "planner",
    "kubevirt",
    "kubevirt-default",
    "hco",
    "nova",
    "vsphere",
];
/// How long the drained host's guests run before the drain starts.
const WARMUP: Duration = Duration::from_secs(3);

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
    for name in &a.policies {
        let mut p = policy_named(name).expect("a listed policy");
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
        backend: &a.backend,
        dir: &dir,
    };
    let failed = |e: crate::drain::DrainError| {
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
        staying.push(VmProcess::boot(&exe, &bridge, g, &a.backend, &dir).map_err(failed)?);
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
                    VmProcess::boot(&exe, &bridge, g, &a.backend, &dir).map_err(failed)?,
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
            let policy = policy_named(name).expect("a listed policy");
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
    let report = report(&mini.fleet(), &measured, &predicted);
    if a.json {
        println!("{report}");
    } else {
        print!("{}", render(&report, &measured));
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

/// A policy's median run (the lower of the two middle ones).
fn median(runs: &[Measured]) -> &Measured {
    let mut by: Vec<&Measured> = runs.iter().collect();
    by.sort_by(|x, y| x.makespan_s.total_cmp(&y.makespan_s));
    by[(by.len() - 1) / 2]
}

/// The JSON report: each policy measured and predicted (`fleet` as built,
/// whatever the plan assumed). Counts are over every run; the makespan,
/// the VMs and the peak are the median run's.
fn report(
    fleet: &ferry_fleet::Fleet,
    measured: &[Vec<Measured>],
    predicted: &[DrainOutcome],
) -> Value {
    let mut policies = serde_json::Map::new();
    for (runs, p) in measured.iter().zip(predicted) {
        let m = median(runs);
        let all = || runs.iter().flat_map(|r| &r.vms);
        let moved = || all().filter(|v| v.completed());
        policies.insert(
            m.policy.clone(),
            json!({
                "makespan_s": m.makespan_s,
                "predicted_makespan_s": p.makespan_s,
                "predicted_over_measured": p.makespan_s / m.makespan_s.max(1e-9),
                "runs": runs.len(),
                "makespans_s": runs.iter().map(|r| r.makespan_s).collect::<Vec<_>>(),
                "migrations": all().count(),
                "failed": all().count() - moved().count(),
                "digest_mismatches": moved().filter(|v| !v.digest_match).count(),
                "guest_mismatches": moved().filter_map(|v| v.guest_mismatches).sum::<u64>(),
                "over_target": moved().filter(|v| v.downtime_ms > v.downtime_target_ms).count(),
                "peak_concurrency": m.peak_concurrency,
                "bytes_sent": m.vms.iter().map(|v| v.bytes_sent).sum::<u64>(),
                "vms": m.vms,
                "predicted_vms": p.vms,
                "replans": runs.iter().flat_map(|r| &r.replans).collect::<Vec<_>>(),
            }),
        );
    }
    let span = |name: &str| {
        measured
            .iter()
            .find(|runs| runs.first().is_some_and(|m| m.policy == name))
            .map(|runs| median(runs).makespan_s)
    };
    let shorter = match (span("planner"), span("kubevirt")) {
        (Some(p), Some(k)) => json!(1.0 - p / k),
        _ => Value::Null,
    };
    json!({
        "policies": policies,
        "lower_bound_s": lower_bound(fleet),
        "planner_shorter_than_kubevirt": shorter,
        "fleet": fleet,
    })
}

/// The report as tables: each policy's median run.
fn render(report: &Value, runs: &[Vec<Measured>]) -> String {
    let medians: Vec<&Measured> = runs.iter().map(|r| median(r)).collect();
    let mut t = Table::new(
        "ferry drain: each policy on the same fleet, measured and predicted",
        &[
            "policy",
            "makespan (s)",
            "runs (s)",
            "predicted (s)",
            "pred/meas",
            "moved",
            "failed",
            "digest mismatches",
            "over target",
            "at once",
        ],
    );
    for (m, all) in medians.iter().zip(runs) {
        let p = &report["policies"][&m.policy];
        let each: Vec<String> = all.iter().map(|r| format!("{:.1}", r.makespan_s)).collect();
        t.row(vec![
            m.policy.clone(),
            format!("{:.1}", m.makespan_s),
            each.join(", "),
            format!("{:.1}", p["predicted_makespan_s"].as_f64().unwrap_or(0.0)),
            format!(
                "{:.2}",
                p["predicted_over_measured"].as_f64().unwrap_or(0.0)
            ),
            (p["migrations"].as_u64().unwrap_or(0) - p["failed"].as_u64().unwrap_or(0)).to_string(),
            p["failed"].to_string(),
            p["digest_mismatches"].to_string(),
            p["over_target"].to_string(),
            m.peak_concurrency.to_string(),
        ]);
    }
    for m in runs.iter().flatten() {
        for r in &m.replans {
            t.note(format!(
                "{} re-planned at {:.1} s ({} VMs not started): {}; predicted end {:.1} s before, {:.1} s after",
                m.policy, r.at_s, r.replanned_vms, r.why, r.predicted_end_before_s, r.predicted_end_after_s
            ));
        }
    }
    let versus = match report["planner_shorter_than_kubevirt"].as_f64() {
        Some(x) if x >= 0.0 => format!("; the planner {:.0}% shorter than kubevirt", x * 100.0),
        Some(x) => format!("; the planner {:.0}% longer than kubevirt", -x * 100.0),
        None => String::new(),
    };
    t.note(format!(
        "no schedule can end before {:.1} s (the busiest NIC carrying every byte once){versus}",
        report["lower_bound_s"].as_f64().unwrap_or(0.0),
    ));
    let mut v = Table::new(
        "every migration (each policy's median run)",
        &[
            "policy",
            "VM",
            "to",
            "start (s)",
            "end (s)",
            "converge",
            "status",
            "downtime (ms)",
            "digest",
        ],
    );
    for m in &medians {
        let mut vms = m.vms.clone();
        vms.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        for x in vms {
            v.row(vec![
                m.policy.clone(),
                x.vm.clone(),
                x.to.clone(),
                format!("{:.1}", x.start_s),
                format!("{:.1}", x.end_s),
                x.policy.clone(),
                x.status.clone(),
                format!("{:.0}", x.downtime_ms),
                if !x.completed() {
                    "-".into()
                } else if x.digest_match {
                    "match".into()
                } else {
                    "MISMATCH".into()
                },
            ]);
        }
    }
    format!("{}{}", t.render(), v.render())
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
