//! The planner's plan as objects a platform applies: for KubeVirt, one
//! `VirtualMachineInstanceMigration` per VM pinned to its planned host,
//! `MigrationPolicy` objects for the bandwidth and convergence each needs,
//! and waves that say when each migration is to be created.
//!
//! ```text
//!   wave 0     the MigrationPolicies; label each VMI for its policy
//!              (`ferry.dev/migration-policy`, the command is on the policy)
//!   wave N     the migrations the plan starts together, in plan order;
//!              create wave N once every migration labelled
//!              `ferry.dev/before-wave: N` has Succeeded
//!   migration  spec.vmiName, spec.addedNodeSelector
//!              {"kubernetes.io/hostname": destination}, the downtime
//!              target and the planned times as annotations
//!   policy     one per distinct (bandwidthPerMigration, allowAutoConverge):
//!              the planner's bandwidth cap for the migration, in whole MiB/s
//! ```
//!
//! The output is a `v1` `List` in JSON, which `kubectl create -f` takes
//! whole or, with `-l ferry.dev/wave=N`, one wave at a time. The structs
//! are written to KubeVirt's OpenAPI schema (`api/openapi-spec/swagger.json`)
//! by hand rather than taken from `kube`/`k8s-openapi`, which are heavy to
//! build; `tests/export.rs` checks every object against the schema of
//! v1.6.0, the first release with `spec.addedNodeSelector`
//! (`tests/fixtures/kubevirt-swagger.md`). Nothing here needs a later one.
//!
//! **Waves.** KubeVirt runs migrations in the order its controller picks
//! (only virt-controller may set a migration's `spec.priority`; the API
//! refuses it from anyone else), so the plan's order is kept by creating
//! each migration when the plan starts it. A wave is the migrations the
//! plan starts at one moment. The plan starts them because earlier ones
//! ended: each migration is labelled `ferry.dev/before-wave: N` for the
//! first later wave that the plan starts after it ended (after its
//! pre-copy ended, when the simulator frees its way), so waiting for the
//! `before-wave: N` migrations before creating wave N keeps what runs at
//! once to what the plan runs. Every wave after the first has at least
//! one (`gates`). Waiting instead for every migration of every earlier
//! wave is as safe, only slower.
//!
//! **Convergence.** ferry plans each VM under one of its policies; KubeVirt
//! has two knobs, `allowAutoConverge` (QEMU's auto-converge: every vCPU
//! sleeps a growing share of its time) and `allowPostCopy`:
//!
//! | ferry | KubeVirt |
//! |---|---|
//! | `none` | `allowAutoConverge: false` |
//! | `auto` | `allowAutoConverge: true` (the same mechanism) |
//! | `quota`, `dirty-limit` | `allowAutoConverge: true`: KubeVirt has no per-vCPU throttle, so its auto-converge holds every vCPU, not only the writers; the guest runs less than ferry's plan for it assumed |
//! | (postcopy) | `allowPostCopy: false`: the planner only plans pre-copy |
//!
//! **Downtime.** A `VirtualMachineInstanceMigration` has no downtime field,
//! and v1.6's `MigrationPolicy` none either (v1.9 added `maxDowntimeMs`
//! behind the `MigrationStallDetection` feature gate; the API refuses it
//! without the gate). Each VM's target travels as the annotation
//! `ferry.dev/downtime-target-ms` on its migration, for the operator and
//! tools; KubeVirt does not read it. The export refuses a plan in which a
//! VM misses its target.
//!
//! **Completion timeout.** KubeVirt aborts a migration still running after
//! `completionTimeoutPerGiB` times its memory in GB (rounded up). Each
//! policy's is three times the slowest planned seconds per GB of its VMs,
//! and at least 10 s: a guard against a migration far off its plan, not a
//! deadline. (KubeVirt's default is 150 s.)

mod names;
mod objects;

use names::*;
pub use objects::*;

use crate::fleet::{Fleet, FleetError};
use crate::planner::Planner;
use crate::sim::{run, DrainOutcome};
use ferry_engine::choices::ConvergeMode;
use std::collections::BTreeMap;

/// `VirtualMachineInstanceMigration`'s group and version.
pub const KUBEVIRT_API_VERSION: &str = "kubevirt.io/v1";
/// `MigrationPolicy`'s group and version.
pub const MIGRATIONS_API_VERSION: &str = "migrations.kubevirt.io/v1alpha1";
/// The node label a migration's target is pinned with.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Label: the wave an object belongs to (`"0"`: the policies).
pub const WAVE_LABEL: &str = "ferry.dev/wave";
/// Label: this migration must have Succeeded before that wave is created.
pub const BEFORE_WAVE_LABEL: &str = "ferry.dev/before-wave";
/// Label, on each VMI (and on its migration): its `MigrationPolicy`.
pub const POLICY_LABEL: &str = "ferry.dev/migration-policy";
/// Label on everything the export makes.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Annotation: the VM's downtime target, ms (KubeVirt has no field).
pub const DOWNTIME_TARGET_ANNOTATION: &str = "ferry.dev/downtime-target-ms";
/// Annotation: the downtime the plan expects, ms.
pub const PLANNED_DOWNTIME_ANNOTATION: &str = "ferry.dev/planned-downtime-ms";
/// Annotation: when the plan starts the migration, seconds into the drain.
pub const PLANNED_START_ANNOTATION: &str = "ferry.dev/planned-start-s";
/// Annotation: when the plan has it done.
pub const PLANNED_END_ANNOTATION: &str = "ferry.dev/planned-end-s";
/// Annotation: ferry's convergence policy (on a `MigrationPolicy`: those
/// it stands for).
pub const CONVERGENCE_ANNOTATION: &str = "ferry.dev/convergence";
/// Annotation on a `MigrationPolicy`: the `kubectl label` command that
/// gives its VMIs the label it selects.
pub const LABEL_VMIS_ANNOTATION: &str = "ferry.dev/label-vmis";

/// A completion timeout is this many times the plan's time.
const TIMEOUT_MARGIN: f64 = 3.0;
/// ... and never under this, s per GB.
const TIMEOUT_FLOOR: i64 = 10;
/// Starts closer than this are one moment (the simulator's are equal).
const SAME_MOMENT_S: f64 = 1e-6;

/// Why a plan is not exported. Exported objects are applied to a live
/// cluster and move running guests, so every reason to doubt the plan
/// stops the export before anything is written, naming the VM and why:
/// a plan the planner could not make, one not the planner's, a VM that
/// misses its downtime target or does not converge, and names Kubernetes
/// would refuse.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ExportError {
    /// The planner could not plan the drain (a VM with nowhere to go, a
    /// fleet that does not hold together).
    #[error("the plan cannot be met: {0}")]
    Unplannable(#[from] FleetError),
    /// The outcome is another policy's, whose caps and targets the export
    /// cannot carry.
    #[error("only the planner's plan is exported, and this one is {0}'s")]
    NotThePlanner(String),
    /// A VM's migration does not converge: it would be forced to a
    /// stop-and-copy over its target.
    #[error(
        "the plan cannot be met: VM {vm} does not converge under {policy} \
         (stopping it would take {downtime_ms:.0} ms against a target of {target_ms:.0} ms)"
    )]
    DoesNotConverge {
        /// The VM.
        vm: String,
        /// ferry's policy for it.
        policy: ConvergeMode,
        /// The downtime it would take.
        downtime_ms: f64,
        /// Its target.
        target_ms: f64,
    },
    /// A VM's downtime passes its target.
    #[error(
        "the plan cannot be met: VM {vm} is over its downtime target under {policy} \
         ({downtime_ms:.0} ms against {target_ms:.0} ms)"
    )]
    OverTarget {
        /// The VM.
        vm: String,
        /// ferry's policy for it.
        policy: ConvergeMode,
        /// Its planned downtime.
        downtime_ms: f64,
        /// Its target.
        target_ms: f64,
    },
    /// The outcome and the fleet disagree on which VMs move.
    #[error("VM {vm}: {why}")]
    NotInPlan {
        /// The VM.
        vm: String,
        /// How they disagree.
        why: String,
    },
    /// A name Kubernetes would refuse where the export puts it.
    #[error("{what} {name:?} cannot be {role}: {rule}")]
    BadName {
        /// What it names (`VM`, `host`, `namespace`).
        what: &'static str,
        /// The name.
        name: String,
        /// Where the export puts it.
        role: &'static str,
        /// The rule it breaks.
        rule: String,
    },
    /// Two VMs or two hosts share a name.
    #[error("two {what}s are called {name:?}; {why}")]
    Duplicate {
        /// `VM` or `host`.
        what: &'static str,
        /// The name.
        name: String,
        /// Why it matters.
        why: &'static str,
    },
}

/// What to export for.
#[derive(Clone, Debug, Default)]
pub struct KubeVirtOptions {
    /// The VMIs' namespace, where their migrations go (`None`: kubectl's
    /// current one).
    pub namespace: Option<String>,
}

/// The plan as KubeVirt objects.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeVirtExport {
    /// The policies, created first (wave 0).
    pub policies: Vec<MigrationPolicy>,
    /// The migrations, wave by wave (`waves[0]` is wave 1).
    pub waves: Vec<Vec<VirtualMachineInstanceMigration>>,
}

impl KubeVirtExport {
    /// Everything, in the order to create it: the policies, then each wave.
    pub fn to_list(&self) -> List {
        let items = self
            .policies
            .iter()
            .cloned()
            .map(Object::Policy)
            .chain(self.waves.iter().flatten().cloned().map(Object::Migration))
            .collect();
        List {
            api_version: "v1".into(),
            kind: "List".into(),
            items,
        }
    }

    /// The `kubectl label` commands that put each VMI under its policy, one
    /// per policy: run them before wave 1.
    pub fn label_commands(&self) -> Vec<String> {
        self.policies
            .iter()
            .filter_map(|p| p.metadata.annotations.get(LABEL_VMIS_ANNOTATION).cloned())
            .collect()
    }
}

/// Plans `fleet` with the planner and exports the plan (the simulator's
/// `seed`, as `ferry plan` runs it).
pub fn plan_kubevirt(
    fleet: &Fleet,
    seed: u64,
    opts: &KubeVirtOptions,
) -> Result<(DrainOutcome, KubeVirtExport), ExportError> {
    let outcome = run(fleet, &mut Planner::new(), seed)?;
    let export = kubevirt(fleet, &outcome, opts)?;
    Ok((outcome, export))
}

/// One VM's migration as the plan has it.
struct Planned {
    /// The VM (an index into the fleet's VMs).
    vm: usize,
    /// Its destination.
    dest: usize,
    /// Its outcome.
    at: usize,
    /// When the simulator freed its way: its pre-copy's end.
    released_s: f64,
}

/// The planner's `outcome` for `fleet` as KubeVirt objects, or why not.
pub fn kubevirt(
    fleet: &Fleet,
    outcome: &DrainOutcome,
    opts: &KubeVirtOptions,
) -> Result<KubeVirtExport, ExportError> {
    if outcome.policy != "planner" {
        return Err(ExportError::NotThePlanner(outcome.policy.clone()));
    }
    fleet.validate()?;
    if let Some(ns) = &opts.namespace {
        dns_label(ns).map_err(|rule| ExportError::BadName {
            what: "namespace",
            name: ns.clone(),
            role: "a namespace",
            rule,
        })?;
    }
    let hosts = index_names(fleet.hosts.iter().map(|h| h.name.as_str()), "host")?;
    let vms = index_names(fleet.vms.iter().map(|v| v.name.as_str()), "VM")?;
    let mut planned: Vec<Planned> = Vec::new();
    let mut seen = vec![false; fleet.vms.len()];
    for (at, o) in outcome.vms.iter().enumerate() {
        let not_in = |why: &str| ExportError::NotInPlan {
            vm: o.vm.clone(),
            why: why.into(),
        };
        let &v = vms
            .get(o.vm.as_str())
            .ok_or_else(|| not_in("the plan moves it, but the fleet has no such VM"))?;
        if !fleet.drained(fleet.vms[v].host) {
            return Err(not_in("the plan moves it, but its host is not drained"));
        }
        if std::mem::replace(&mut seen[v], true) {
            return Err(not_in("the plan moves it twice"));
        }
        let &dest = hosts
            .get(o.to.as_str())
            .ok_or_else(|| not_in(&format!("the plan sends it to {}, not a host", o.to)))?;
        if !o.converged {
            return Err(ExportError::DoesNotConverge {
                vm: o.vm.clone(),
                policy: o.policy,
                downtime_ms: o.downtime_ms,
                target_ms: o.downtime_target_ms,
            });
        }
        if o.downtime_ms > o.downtime_target_ms {
            return Err(ExportError::OverTarget {
                vm: o.vm.clone(),
                policy: o.policy,
                downtime_ms: o.downtime_ms,
                target_ms: o.downtime_target_ms,
            });
        }
        let name = &fleet.vms[v].name;
        dns_subdomain(&migration_name(name)).map_err(|rule| ExportError::BadName {
            what: "VM",
            name: name.clone(),
            role: "a VMI's name (its migration is named ferry-NAME)",
            rule,
        })?;
        label_value(&fleet.hosts[dest].name).map_err(|rule| ExportError::BadName {
            what: "host",
            name: fleet.hosts[dest].name.clone(),
            role: "a kubernetes.io/hostname label value",
            rule,
        })?;
        planned.push(Planned {
            vm: v,
            dest,
            at,
            released_s: o.end_s - o.downtime_ms / 1e3,
        });
    }
    if let Some(v) = fleet.to_move().into_iter().find(|&v| !seen[v]) {
        return Err(ExportError::NotInPlan {
            vm: fleet.vms[v].name.clone(),
            why: "it is on a drained host, but the plan does not move it".into(),
        });
    }

    // Waves: the migrations that start at one moment, in plan order.
    planned.sort_by(|a, b| {
        let (x, y) = (&outcome.vms[a.at], &outcome.vms[b.at]);
        x.start_s.total_cmp(&y.start_s).then(a.vm.cmp(&b.vm))
    });
    let mut wave_of: Vec<usize> = Vec::with_capacity(planned.len());
    let mut wave_start: Vec<f64> = Vec::new();
    for p in &planned {
        let start = outcome.vms[p.at].start_s;
        match wave_start.last() {
            Some(&t) if start - t <= SAME_MOMENT_S => {}
            _ => wave_start.push(start),
        }
        wave_of.push(wave_start.len() - 1);
    }
    let gates = gates(&planned, &wave_of, &wave_start);

    // Policies: one per (bandwidth, auto-converge).
    let mut needs: BTreeMap<(u64, bool), Need> = BTreeMap::new();
    let mut need_of: Vec<(u64, bool)> = Vec::with_capacity(planned.len());
    for p in &planned {
        let o = &outcome.vms[p.at];
        let vm = &fleet.vms[p.vm];
        // The planner's cap (it always gives one; a plan without one
        // takes what the NIC gives).
        let cap = o
            .cap_bytes_per_sec
            .unwrap_or(fleet.hosts[vm.host].nic_bytes_per_sec);
        let mib = ((cap / MIB).floor() as u64).max(1);
        let key = (mib, o.policy != ConvergeMode::None);
        let gb = (vm.memory_bytes as f64 / 1e9).ceil().max(1.0);
        let need = needs.entry(key).or_default();
        need.secs_per_gb = need.secs_per_gb.max((o.end_s - o.start_s) / gb);
        if !need.modes.contains(&o.policy) {
            need.modes.push(o.policy);
        }
        need.vms.push(vm.name.clone());
        need_of.push(key);
    }
    let policy_name = |(mib, auto): (u64, bool)| {
        format!(
            "ferry-{}-{}",
            quantity_mib(mib).to_lowercase(),
            if auto { "auto-converge" } else { "no-throttle" }
        )
    };
    let managed = || BTreeMap::from([(MANAGED_BY_LABEL.to_string(), "ferry".to_string())]);
    let policies = needs
        .iter()
        .map(|(&key, need)| {
            let name = policy_name(key);
            let mut labels = managed();
            labels.insert(WAVE_LABEL.into(), "0".into());
            let ns = opts
                .namespace
                .as_ref()
                .map_or(String::new(), |n| format!(" -n {n}"));
            let annotations = BTreeMap::from([
                (
                    CONVERGENCE_ANNOTATION.to_string(),
                    need.modes
                        .iter()
                        .map(ConvergeMode::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
                (
                    LABEL_VMIS_ANNOTATION.to_string(),
                    format!(
                        "kubectl label vmi --overwrite{ns} {} {POLICY_LABEL}={name}",
                        need.vms.join(" ")
                    ),
                ),
            ]);
            let timeout = (TIMEOUT_MARGIN * need.secs_per_gb).ceil() as i64;
            MigrationPolicy {
                api_version: MIGRATIONS_API_VERSION.into(),
                kind: "MigrationPolicy".into(),
                metadata: ObjectMeta {
                    name: name.clone(),
                    namespace: None,
                    labels,
                    annotations,
                },
                spec: MigrationPolicySpec {
                    selectors: Selectors {
                        virtual_machine_instance_selector: Some(BTreeMap::from([(
                            POLICY_LABEL.to_string(),
                            name,
                        )])),
                        namespace_selector: None,
                    },
                    allow_auto_converge: Some(key.1),
                    bandwidth_per_migration: Some(quantity_mib(key.0)),
                    completion_timeout_per_gib: Some(timeout.max(TIMEOUT_FLOOR)),
                    allow_post_copy: Some(false),
                },
            }
        })
        .collect();

    let mut waves: Vec<Vec<VirtualMachineInstanceMigration>> = vec![Vec::new(); wave_start.len()];
    for (i, p) in planned.iter().enumerate() {
        let o = &outcome.vms[p.at];
        let vm = &fleet.vms[p.vm];
        let mut labels = managed();
        labels.insert(WAVE_LABEL.into(), (wave_of[i] + 1).to_string());
        labels.insert(POLICY_LABEL.into(), policy_name(need_of[i]));
        if let Some(w) = gates[i] {
            labels.insert(BEFORE_WAVE_LABEL.into(), (w + 1).to_string());
        }
        let annotations = BTreeMap::from([
            (
                DOWNTIME_TARGET_ANNOTATION.to_string(),
                number(vm.downtime_target_ms),
            ),
            (
                PLANNED_DOWNTIME_ANNOTATION.to_string(),
                number(o.downtime_ms),
            ),
            (PLANNED_START_ANNOTATION.to_string(), number(o.start_s)),
            (PLANNED_END_ANNOTATION.to_string(), number(o.end_s)),
            (CONVERGENCE_ANNOTATION.to_string(), o.policy.to_string()),
        ]);
        waves[wave_of[i]].push(VirtualMachineInstanceMigration {
            api_version: KUBEVIRT_API_VERSION.into(),
            kind: "VirtualMachineInstanceMigration".into(),
            metadata: ObjectMeta {
                name: migration_name(&vm.name),
                namespace: opts.namespace.clone(),
                labels,
                annotations,
            },
            spec: MigrationSpec {
                vmi_name: vm.name.clone(),
                added_node_selector: BTreeMap::from([(
                    HOSTNAME_LABEL.to_string(),
                    fleet.hosts[p.dest].name.clone(),
                )]),
            },
        });
    }
    Ok(KubeVirtExport { policies, waves })
}

const MIB: f64 = (1u64 << 20) as f64;

/// What the VMs of one policy need.
#[derive(Default)]
struct Need {
    /// The slowest planned seconds per GB of memory.
    secs_per_gb: f64,
    /// ferry's policies among them.
    modes: Vec<ConvergeMode>,
    /// The VMs.
    vms: Vec<String>,
}

/// For each planned migration, the wave (an index) it must be done before,
/// if any: the first later wave the plan starts after its release. A wave
/// after the first with none (the simulator always starts a wave because
/// something ended, so only rounding could do it) waits for the earliest
/// release among the migrations started before it and not waited for yet,
/// which is slower, never faster, than the plan.
fn gates(planned: &[Planned], wave_of: &[usize], wave_start: &[f64]) -> Vec<Option<usize>> {
    let waves = wave_start.len();
    let mut gate: Vec<Option<usize>> = planned
        .iter()
        .zip(wave_of)
        .map(|(p, &w)| {
            let first = wave_start.partition_point(|&t| t < p.released_s - SAME_MOMENT_S);
            Some(first.max(w + 1)).filter(|&g| g < waves)
        })
        .collect();
    // How many migrations gate each wave.
    let mut gated = vec![0usize; waves];
    gate.iter().flatten().for_each(|&g| gated[g] += 1);
    for w in 1..waves {
        if gated[w] > 0 {
            continue;
        }
        // Wave w-1's migrations gate only later waves, so there is one.
        let first = (0..planned.len())
            .filter(|&i| wave_of[i] < w && gate[i].is_none_or(|g| g > w))
            .min_by(|&a, &b| planned[a].released_s.total_cmp(&planned[b].released_s));
        if let Some(i) = first {
            if let Some(g) = gate[i].replace(w) {
                gated[g] -= 1;
            }
            gated[w] += 1;
        }
    }
    gate
}
