//! `ferry bench demand-paging`: postcopy's fault path alone, on both
//! backends, in the shape of the annotated-memory-faults seed's table
//! (pages/s against vCPUs, without and with the seed's mechanism).
//!
//! ```text
//!  kvm   userfaultfd: 4K vs 2M, MISSING vs MINOR, one fd vs one per vCPU,
//!        poll vs busy-poll, prefetch; each next to the baseline (4K anon
//!        MISSING, one fd, handlers sleeping in poll) from the same run
//!  soft  shared fault queue vs vCPU-direct annotated exits, 1-32 threads
//! ```
//!
//! Nothing crosses a network: every page comes from a source copy in this
//! process, so the numbers are the fault path's own.

use crate::kvm::demand_paging::{self as kvm, KvmCase, KvmCell};
use crate::soft::demand_paging::{self as soft, SoftCell};
use ferry_report::{ratio, Plot, Report, Series, Table};
use serde::Serialize;

/// What to run.
#[derive(Clone, Debug)]
pub struct DemandPagingOpts {
    /// Run the kvm cases (needs /dev/kvm).
    pub kvm: bool,
    /// Run the soft cases.
    pub soft: bool,
    /// vCPU counts for kvm.
    pub kvm_vcpus: Vec<u32>,
    /// Guest memory per vCPU on kvm (multiple of 2 MiB).
    pub kvm_bytes_per_vcpu: u64,
    /// Only the baseline, busy-poll, MINOR, prefetch and 2M cases.
    pub quick: bool,
    /// vCPU thread counts for soft.
    pub soft_vcpus: Vec<usize>,
    /// Pages per vCPU thread on soft.
    pub soft_pages_per_vcpu: u64,
    /// Modelled exit cost of a vCPU-direct fault on soft.
    pub exit_cost_ns: u64,
    /// Runs per cell; the median by pages/s is reported.
    pub repeats: u32,
}

/// Everything measured.
#[derive(Debug, Serialize)]
pub struct DemandPagingResults {
    /// The kvm cases that ran.
    pub kvm: Vec<KvmCell>,
    /// kvm cases that could not run here, with the reason.
    pub kvm_skipped: Vec<String>,
    /// The soft cells.
    pub soft: Vec<SoftCell>,
    /// The modelled cost of one vCPU exit on the soft backend, in ns.
    pub exit_cost_ns: u64,
    /// Cores of this host (more threads than this share them).
    pub host_cores: usize,
}

/// The kvm cases, baseline first.
fn kvm_cases(opts: &DemandPagingOpts) -> Vec<KvmCase> {
    let case = |backing: &str, mode: &str, per_vcpu_uffd, busy_poll, prefetch| KvmCase {
        backing: backing.into(),
        mode: mode.into(),
        per_vcpu_uffd,
        busy_poll,
        pinned: false,
        prefetch,
        vcpus: 0,
    };
    let pinned = |backing: &str, mode: &str, prefetch| KvmCase {
        pinned: true,
        ..case(backing, mode, true, false, prefetch)
    };
    let mut shapes = vec![
        case("anon", "MISSING", false, false, 1),
        case("anon", "MISSING", false, true, 1),
        pinned("anon", "MISSING", 1),
        pinned("memfd", "MINOR", 1),
        pinned("anon", "MISSING", 8),
        case("hugetlb", "MISSING", false, false, 1),
        pinned("hugetlb", "MISSING", 1),
        pinned("hugetlb", "MINOR", 1),
    ];
    if !opts.quick {
        shapes.insert(2, case("anon", "MISSING", true, false, 1));
        shapes.insert(3, case("anon", "MISSING", true, true, 1));
        shapes.insert(4, case("memfd", "MINOR", false, false, 1));
        shapes.insert(5, case("memfd", "MINOR", false, true, 1));
        shapes.push(case("hugetlb", "MISSING", false, true, 1));
    }
    let mut cases = Vec::new();
    for shape in shapes {
        for &v in &opts.kvm_vcpus {
            // One vCPU has one region: one fd per vCPU is the same case.
            if shape.per_vcpu_uffd && !shape.pinned && v == 1 {
                continue;
            }
            cases.push(KvmCase {
                vcpus: v,
                ..shape.clone()
            });
        }
    }
    cases
}

/// Runs `f` `repeats` times and keeps the run with the median pages/s.
fn median_run<T, E>(
    repeats: u32,
    rate: impl Fn(&T) -> f64,
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut runs = (0..repeats.max(1))
        .map(|_| f())
        .collect::<Result<Vec<_>, _>>()?;
    runs.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    Ok(runs.swap_remove(runs.len() / 2))
}

/// Runs the experiment.
pub fn experiment(
    opts: &DemandPagingOpts,
    progress: &mut dyn FnMut(&str),
) -> Result<Report<DemandPagingResults>, String> {
    let mut results = DemandPagingResults {
        kvm: vec![],
        kvm_skipped: vec![],
        soft: vec![],
        exit_cost_ns: opts.exit_cost_ns,
        host_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    if opts.kvm {
        for case in kvm_cases(opts) {
            progress(&format!("kvm: {} vCPU(s), {}", case.vcpus, case.label()));
            match median_run(
                opts.repeats,
                |c: &KvmCell| c.pages_per_s,
                || kvm::run_case(&case, opts.kvm_bytes_per_vcpu),
            ) {
                Ok(cell) => results.kvm.push(cell),
                // Backings this host cannot give (no huge pages reserved)
                // are reported, not fatal.
                Err(e) if case.backing != "anon" => results.kvm_skipped.push(format!(
                    "{} vCPU(s), {}: {e}",
                    case.vcpus,
                    case.label()
                )),
                Err(e) => return Err(e),
            }
        }
    }
    if opts.soft {
        for &v in &opts.soft_vcpus {
            for shared in [true, false] {
                progress(&format!(
                    "soft: {v} vCPU thread(s), {}",
                    if shared {
                        "shared queue"
                    } else {
                        "vCPU-direct"
                    }
                ));
                let cell = median_run(
                    opts.repeats,
                    |c: &SoftCell| c.pages_per_s,
                    || soft::run(v, shared, opts.soft_pages_per_vcpu, opts.exit_cost_ns),
                )
                .map_err(|e| ferry_vm::error_chain(&e))?;
                results.soft.push(cell);
            }
        }
    }
    Ok(report(results, opts))
}

fn kpps(v: f64) -> String {
    format!("{:.1}", v / 1e3)
}

fn kvm_table(r: &DemandPagingResults, opts: &DemandPagingOpts) -> Table {
    let mut cols = vec!["fault path".to_string()];
    for v in &opts.kvm_vcpus {
        cols.push(format!("{v} vCPU k pages/s"));
        cols.push(format!("{v} vCPU k/s per vCPU"));
    }
    cols.push("vs baseline".into());
    cols.push("bad pages".into());
    let cols: Vec<&str> = cols.iter().map(String::as_str).collect();
    let mut t = Table::new(
        format!(
            "demand paging (kvm, userfaultfd): {} MiB per vCPU, each page touched once in order",
            opts.kvm_bytes_per_vcpu >> 20
        ),
        &cols,
    );
    let mut labels: Vec<String> = r.kvm.iter().map(|c| c.case.label()).collect();
    labels.dedup();
    let most = *opts.kvm_vcpus.iter().max().unwrap_or(&1);
    let baseline = r
        .kvm
        .iter()
        .find(|c| c.case.vcpus == most)
        .map(|c| c.pages_per_s);
    for label in &labels {
        let cells: Vec<&KvmCell> = r.kvm.iter().filter(|c| &c.case.label() == label).collect();
        let mut row = vec![label.clone()];
        for v in &opts.kvm_vcpus {
            match cells.iter().find(|c| c.case.vcpus == *v) {
                Some(c) => {
                    row.push(kpps(c.pages_per_s));
                    row.push(kpps(c.pages_per_s_per_vcpu));
                }
                None => row.extend(["-".to_string(), "-".to_string()]),
            }
        }
        let at_most = cells.iter().find(|c| c.case.vcpus == most);
        row.push(match (at_most, baseline) {
            (Some(c), Some(b)) => ratio(c.pages_per_s, b),
            _ => "-".into(),
        });
        row.push(cells.iter().map(|c| c.bad_pages).sum::<u64>().to_string());
        t.row(row);
    }
    t.note(format!(
        "baseline = the first row (4K anon MISSING, one userfaultfd, handlers asleep in poll); \
         'vs baseline' compares {most} vCPU(s), same run"
    ));
    t.note(
        "one handler thread per vCPU; busy = handlers spin on the fd (a CPU each); \
            pinned = vCPU i and its handler (own uffd) share host CPU i; \
            prefetch N = a fault places N pages of its region (the touch order is sequential)",
    );
    t.note(
        "k pages/s counts 4 KiB pages; bad pages = contents not equal to the source after the run",
    );
    for s in &r.kvm_skipped {
        t.note(format!("skipped: {s}"));
    }
    let threads = 2 * most as usize;
    if threads > r.host_cores {
        t.note(format!(
            "{} host cores; {most} vCPU threads + {most} handler threads exceed them",
            r.host_cores
        ));
    }
    t
}

fn soft_table(r: &DemandPagingResults) -> Table {
    let mut t = Table::new(
        "demand paging (soft MMU): k pages/s, shared fault queue vs vCPU-direct annotated exits",
        &[
            "vCPU threads",
            "shared queue",
            "vCPU-direct",
            "direct / shared",
            "bad pages",
        ],
    );
    let mut counts: Vec<usize> = r.soft.iter().map(|c| c.vcpus).collect();
    counts.dedup();
    for v in counts {
        let find = |shared: bool| {
            r.soft
                .iter()
                .find(|c| c.vcpus == v && (c.delivery == "shared queue") == shared)
        };
        let (Some(s), Some(d)) = (find(true), find(false)) else {
            continue;
        };
        t.row(vec![
            v.to_string(),
            kpps(s.pages_per_s),
            kpps(d.pages_per_s),
            ratio(d.pages_per_s, s.pages_per_s),
            (s.bad_pages + d.bad_pages).to_string(),
        ]);
    }
    t.note(format!(
        "vCPU-direct pays a modelled {} ns exit per memory fault; the queue's handlers are as many as the vCPUs",
        r.exit_cost_ns
    ));
    let most = r.soft.iter().map(|c| c.vcpus).max().unwrap_or(1);
    t.note(format!(
        "{} host cores; up to {most} vCPU threads (and {most} handler threads with the queue) share them",
        r.host_cores
    ));
    t
}

/// The annotated-memory-faults seed's table: vCPUs, then its average
/// paging rate in thousands of pages/s without and with its capabilities.
const SEED_PAGES_PER_S: [(u32, f64, f64); 9] = [
    (1, 150.0, 340.0),
    (2, 191.0, 477.0),
    (4, 210.0, 809.0),
    (8, 155.0, 1239.0),
    (16, 130.0, 1595.0),
    (32, 108.0, 2299.0),
    (64, 86.0, 3482.0),
    (128, 62.0, 4134.0),
    (256, 36.0, 4012.0),
];

fn report(results: DemandPagingResults, opts: &DemandPagingOpts) -> Report<DemandPagingResults> {
    let mut tables = Vec::new();
    let mut series = Vec::new();
    if !results.soft.is_empty() {
        tables.push(soft_table(&results));
        for name in ["shared queue", "vCPU-direct"] {
            series.push(Series {
                label: format!("soft {name}"),
                points: results
                    .soft
                    .iter()
                    .filter(|c| c.delivery == name)
                    .map(|c| (c.vcpus as f64, c.pages_per_s / 1e3))
                    .collect(),
            });
        }
    }
    if !results.kvm.is_empty() {
        tables.push(kvm_table(&results, opts));
        let mut labels: Vec<String> = results.kvm.iter().map(|c| c.case.label()).collect();
        labels.dedup();
        for label in labels {
            series.push(Series {
                label: format!("kvm {label}"),
                points: results
                    .kvm
                    .iter()
                    .filter(|c| c.case.label() == label)
                    .map(|c| (f64::from(c.case.vcpus), c.pages_per_s / 1e3))
                    .collect(),
            });
        }
    }
    // The seed's curves over the vCPU counts measured here (its own go to
    // 256, on a machine with as many cores).
    let most = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let seed = |label: &str, pick: fn(&(u32, f64, f64)) -> f64| Series {
        label: label.into(),
        points: SEED_PAGES_PER_S
            .iter()
            .filter(|r| f64::from(r.0) <= most)
            .map(|r| (f64::from(r.0), pick(r)))
            .collect(),
    };
    let references = vec![
        seed("the seed, userfaultfd (published)", |r| r.1),
        seed("the seed, annotated exits (published)", |r| r.2),
    ];
    Report {
        name: "demand-paging".into(),
        tables,
        results,
        charts: vec![Plot {
            title: "postcopy page-in rate".into(),
            x_label: "vCPU threads".into(),
            y_label: "k pages/s".into(),
            log_y: true,
            references,
            series,
        }
        .into()],
    }
}
