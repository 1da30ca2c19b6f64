//! Dirty-log experiment: eager huge-page splitting vs split on fault,
//! reproducing both tables of the eager-splitting seed
//! (`dirty_log_perf_test -s anonymous_hugetlb_2mb`).
//!
//! Guest memory is sparse (tables real, contents implied) and mapped with
//! 2 MiB leaves by a populate pass before dirty logging starts. Each vCPU
//! then runs passes over its region through its TLB and the MMU:
//!
//! ```text
//!  write-only, 2 MiB stride   one write per 2 MiB page: every access hits a new huge page
//!  read-heavy, 4 KiB stride   every page, 1 write in 10 accesses
//! ```
//!
//! Split on fault (baseline): the first write to a huge page breaks it
//! (break-before-make: a remote TLB flush every vCPU must acknowledge) and
//! maps only that 4 KiB page, so later reads of its 511 neighbours fault too.
//! Eager: all huge leaves were split when logging started (timed separately).
//! A fault can be given a modelled exit cost (a VM exit and re-entry on
//! hardware) and a remote flush a modelled broadcast-TLBI cost (hw_cost.rs);
//! the table says which.

use crate::{machine_note, ns, time};
use ferry_memstress::next_rand32;
use ferry_report::{ratio, Plot, Report, Series, Table};
use ferry_soft::config::{LeafSize, Mechanisms, SplitMode};
use ferry_soft::error::SoftError;
use ferry_soft::guest_mem::{HostView, VcpuMem};
use ferry_soft::hw_cost::{SEED_BROADCAST_TLBI_NS, SEED_EXIT_COST_NS};
use ferry_soft::mmu::{Mmu, MmuStats};
use ferry_vm::DirtyPages;
use serde::Serialize;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Options of the dirty-log experiment.
#[derive(Clone, Debug, Serialize)]
pub struct DirtyLogOpts {
    /// vCPU counts to run.
    pub vcpus: Vec<u32>,
    /// Read-heavy pattern: guest memory shared out among the vCPUs (at least
    /// 2 MiB per vCPU).
    pub total_bytes: u64,
    /// Write-only 2 MiB-stride pattern: memory per vCPU, as the seed's `-b 1G`
    /// (sparse memory, and one access per 2 MiB, keep this cheap).
    pub write_bytes_per_vcpu: u64,
    /// Dirty-logging passes after the populate pass.
    pub iterations: u32,
    /// Modelled cost of one fault's exit to the hypervisor, in ns (0 = none).
    pub exit_cost_ns: u64,
    /// Modelled cost of one broadcast TLB invalidation, in ns (0 = none).
    pub tlbi_cost_ns: u64,
    /// Runs of each configuration; the table shows the median first pass.
    pub repeats: u32,
}

impl Default for DirtyLogOpts {
    fn default() -> Self {
        DirtyLogOpts {
            vcpus: vec![1, 2, 4, 8, 16],
            total_bytes: 1 << 30,
            write_bytes_per_vcpu: 1 << 30,
            iterations: 3,
            exit_cost_ns: SEED_EXIT_COST_NS,
            tlbi_cost_ns: SEED_BROADCAST_TLBI_NS,
            repeats: 5,
        }
    }
}

/// One row of a seed table: (vCPUs, split on fault, eager).
type SeedRow = (u32, f64, f64);

/// The seed's times for the vCPU counts it shares with this experiment:
/// table 1 in ms, table 2 in s.
const SEED_TABLES: [(Pattern, [SeedRow; 5]); 2] = [
    (
        Pattern::WriteStride2M,
        [
            (1, 3.34, 1.85),
            (2, 3.51, 1.92),
            (4, 3.93, 1.99),
            (8, 5.78, 1.97),
            (16, 10.06, 2.08),
        ],
    ),
    (
        Pattern::ReadHeavy,
        [
            (1, 0.65, 0.09),
            (2, 0.70, 0.09),
            (4, 0.71, 0.09),
            (8, 0.72, 0.10),
            (16, 0.76, 0.10),
        ],
    ),
];

/// The seed's eager-split speed-up at `vcpus`, if its table has that row.
pub fn seed_ratio(pattern: Pattern, vcpus: u32) -> Option<f64> {
    let (_, rows) = SEED_TABLES.iter().find(|(p, _)| *p == pattern)?;
    let &(_, on_fault, eager) = rows.iter().find(|(n, _, _)| *n == vcpus)?;
    Some(on_fault / eager)
}

/// The access pattern of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Pattern {
    /// One write per 2 MiB page (seed table 1).
    WriteStride2M,
    /// Every 4 KiB page, 1 write in 10 accesses (seed table 2).
    ReadHeavy,
}

impl Pattern {
    fn stride(self) -> u64 {
        match self {
            Pattern::WriteStride2M => 512,
            Pattern::ReadHeavy => 1,
        }
    }
    fn write_threshold(self) -> u64 {
        match self {
            Pattern::WriteStride2M => 1 << 32,
            Pattern::ReadHeavy => (1u64 << 32) / 10,
        }
    }
}

/// One (pattern, vCPUs, split mode) run.
#[derive(Clone, Debug, Serialize)]
pub struct DirtyLogRun {
    /// Access pattern.
    pub pattern: Pattern,
    /// vCPUs.
    pub vcpus: u32,
    /// Split mode.
    pub split: SplitMode,
    /// Nanoseconds to enable dirty logging (eager splitting happens here).
    pub enable_ns: f64,
    /// Wall-clock nanoseconds of each dirty-logging pass (all vCPUs done).
    pub pass_ns: Vec<f64>,
    /// Nanoseconds per harvest (exchange + write-protect), per pass.
    pub harvest_ns: Vec<f64>,
    /// Faults taken by the vCPUs per pass.
    pub faults: Vec<u64>,
    /// MMU counters at the end.
    pub mmu: MmuStats,
}

/// Results of the dirty-log experiment.
#[derive(Clone, Debug, Serialize)]
pub struct DirtyLogResults {
    /// Options used.
    pub opts: DirtyLogOpts,
    /// Every run.
    pub runs: Vec<DirtyLogRun>,
}

/// One pass of `n` vCPUs over their regions; returns (wall time, faults).
fn pass(
    mmu: &Arc<Mmu>,
    n: u32,
    frames_per_vcpu: u64,
    stride: u64,
    threshold: u64,
    exit_cost_ns: u64,
    seed: u64,
) -> Result<(Duration, u64), SoftError> {
    let barrier = Arc::new(Barrier::new(n as usize + 1));
    let handles: Vec<_> = (0..n)
        .map(|v| {
            let mmu = Arc::clone(mmu);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || -> Result<(Instant, Instant, u64), SoftError> {
                let mut mem = VcpuMem::new(mmu, HostView::sparse(), v as usize);
                mem.set_exit_cost_ns(exit_cost_ns);
                mem.online();
                barrier.wait();
                let start = Instant::now();
                let base = u64::from(v) * frames_per_vcpu;
                let mut rng = seed ^ (u64::from(v) << 32);
                let mut page = 0;
                let mut result = Ok(());
                while page < frames_per_vcpu {
                    mem.boundary();
                    let gpa = (base + page) << 12;
                    let r = if next_rand32(&mut rng) < threshold {
                        mem.store_u64(gpa, page)
                    } else {
                        mem.load_u64(gpa).map(|_| ())
                    };
                    if let Err(e) = r {
                        result = Err(e);
                        break;
                    }
                    page += stride;
                }
                let end = Instant::now();
                mem.offline();
                result.map(|()| (start, end, mem.faults()))
            })
        })
        .collect();
    barrier.wait();
    // Wall time from the first vCPU starting to the last one finishing, taken
    // by the vCPUs themselves (this thread may not even be scheduled then).
    let mut faults = 0;
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for h in handles {
        let (start, end, f) = h
            .join()
            .map_err(|_| SoftError::Thread("dirty-log vCPU".into()))??;
        faults += f;
        first = Some(first.map_or(start, |t| t.min(start)));
        last = Some(last.map_or(end, |t| t.max(end)));
    }
    let d = match (first, last) {
        (Some(a), Some(b)) => b - a,
        _ => Duration::ZERO,
    };
    Ok((d, faults))
}

fn run(
    opts: &DirtyLogOpts,
    pattern: Pattern,
    n: u32,
    split: SplitMode,
) -> Result<DirtyLogRun, SoftError> {
    let per_vcpu = match pattern {
        Pattern::WriteStride2M => opts.write_bytes_per_vcpu,
        Pattern::ReadHeavy => opts.total_bytes / u64::from(n),
    };
    let frames_per_vcpu = (per_vcpu / 4096) / 512 * 512;
    if frames_per_vcpu == 0 {
        return Err(SoftError::Options(format!(
            "{per_vcpu} bytes per vCPU is less than one 2 MiB page"
        )));
    }
    let mech = Mechanisms {
        split,
        leaf: LeafSize::M2,
        ..Mechanisms::default()
    };
    let mmu = Arc::new(Mmu::new(frames_per_vcpu * u64::from(n), n as usize, mech)?);
    // Populate: one write per 2 MiB maps every huge page, writable.
    pass(&mmu, n, frames_per_vcpu, 512, 1 << 32, 0, 1)?;
    mmu.flush_domain().set_broadcast_cost_ns(opts.tlbi_cost_ns);
    let (enabled, enable) = time(|| mmu.start_dirty_log());
    enabled?;
    let mut r = DirtyLogRun {
        pattern,
        vcpus: n,
        split,
        enable_ns: ns(enable),
        pass_ns: Vec::new(),
        harvest_ns: Vec::new(),
        faults: Vec::new(),
        mmu: MmuStats::default(),
    };
    let mut dirty = DirtyPages::new(mmu.frames());
    for it in 0..opts.iterations {
        let (d, faults) = pass(
            &mmu,
            n,
            frames_per_vcpu,
            pattern.stride(),
            pattern.write_threshold(),
            opts.exit_cost_ns,
            u64::from(it) + 2,
        )?;
        r.pass_ns.push(ns(d));
        r.faults.push(faults);
        dirty.clear();
        let (h, hd) = time(|| mmu.harvest(&mut dirty));
        h?;
        r.harvest_ns.push(ns(hd));
    }
    r.mmu = mmu.stats();
    Ok(r)
}

/// Runs the dirty-log experiment.
pub fn dirty_log_experiment(opts: &DirtyLogOpts) -> Result<Report<DirtyLogResults>, SoftError> {
    if opts.vcpus.is_empty() || opts.iterations == 0 {
        return Err(SoftError::Options(
            "need at least one vCPU count and one iteration".into(),
        ));
    }
    let mut runs = Vec::new();
    for pattern in [Pattern::WriteStride2M, Pattern::ReadHeavy] {
        for &n in &opts.vcpus {
            for split in [SplitMode::OnFault, SplitMode::Eager] {
                let mut all = (0..opts.repeats.max(1))
                    .map(|_| run(opts, pattern, n, split))
                    .collect::<Result<Vec<_>, _>>()?;
                all.sort_by(|a, b| a.pass_ns[0].total_cmp(&b.pass_ns[0]));
                let mid = all.len() / 2;
                runs.push(all.swap_remove(mid));
            }
        }
    }
    let max_vcpus = opts.vcpus.iter().copied().max().unwrap_or(1) as usize;
    let exit = if opts.exit_cost_ns == 0 && opts.tlbi_cost_ns == 0 {
        "no modelled hardware cost (a fault costs only the soft MMU's work)".to_string()
    } else {
        format!(
            "modelled hardware costs (hw_cost.rs): {} ns VM exit per fault, {} ns broadcast \
             TLBI per remote flush, one at a time; both from the seed's 1-vCPU rows, which \
             therefore calibrate rather than test",
            opts.exit_cost_ns, opts.tlbi_cost_ns
        )
    };
    let mut tables = Vec::new();
    let mut series = Vec::new();
    for (pattern, title, unit, scale) in [
        (
            Pattern::WriteStride2M,
            "Write-only, 2 MiB stride (seed table 1)",
            "ms",
            1e6,
        ),
        (
            Pattern::ReadHeavy,
            "Read-heavy, 1 write per 10 accesses (seed table 2)",
            "ms",
            1e6,
        ),
    ] {
        let memory = match pattern {
            Pattern::WriteStride2M => format!("{} MiB per vCPU", opts.write_bytes_per_vcpu >> 20),
            Pattern::ReadHeavy => {
                format!("{} MiB shared out among the vCPUs", opts.total_bytes >> 20)
            }
        };
        let mut t = Table::new(
            format!("{title}: first dirty-logging pass, {memory}"),
            &[
                "vCPUs",
                &format!("split on fault ({unit})"),
                &format!("eager split ({unit})"),
                "ratio",
                "seed ratio",
                "faults on fault",
                "faults eager",
                "eager enable (ms)",
                "harvest on fault / eager (µs)",
            ],
        );
        let mut on_fault_pts = Vec::new();
        let mut eager_pts = Vec::new();
        for pair in runs
            .iter()
            .filter(|r| r.pattern == pattern)
            .collect::<Vec<_>>()
            .chunks(2)
        {
            let (f, e) = (pair[0], pair[1]);
            t.row(vec![
                f.vcpus.to_string(),
                format!("{:.2}", f.pass_ns[0] / scale),
                format!("{:.2}", e.pass_ns[0] / scale),
                ratio(f.pass_ns[0], e.pass_ns[0]),
                seed_ratio(pattern, f.vcpus).map_or("-".into(), |r| format!("{r:.1}x")),
                f.faults[0].to_string(),
                e.faults[0].to_string(),
                format!("{:.2}", e.enable_ns / 1e6),
                format!(
                    "{:.0} / {:.0}",
                    f.harvest_ns[0] / 1e3,
                    e.harvest_ns[0] / 1e3
                ),
            ]);
            on_fault_pts.push((f64::from(f.vcpus), f.pass_ns[0] / scale));
            eager_pts.push((f64::from(e.vcpus), e.pass_ns[0] / scale));
        }
        t.note(format!("{exit}; {}", machine_note(max_vcpus)));
        t.note(format!(
            "sparse guest; {} passes per run, the first shown \
             (median of {} runs; every pass in the JSON)",
            opts.iterations,
            opts.repeats.max(1)
        ));
        tables.push(t);
        let name = match pattern {
            Pattern::WriteStride2M => "write 2M stride",
            Pattern::ReadHeavy => "read-heavy",
        };
        series.push(Series {
            label: format!("{name}: split on fault"),
            points: on_fault_pts,
        });
        series.push(Series {
            label: format!("{name}: eager"),
            points: eager_pts,
        });
    }
    tables[0].note("seed ratio: the seed's own table (AmpereOne, 1 GiB per vCPU, one core per vCPU), e.g. 3.34 vs 1.85 ms at 1 vCPU");
    tables[1]
        .note("seed ratio: the seed's own table (1 GiB per vCPU), e.g. 0.65 vs 0.09 s at 1 vCPU");
    Ok(Report {
        name: "dirty-log".into(),
        tables,
        results: DirtyLogResults {
            opts: opts.clone(),
            runs,
        },
        charts: vec![Plot {
            title: "First dirty-logging pass: eager split vs split on fault".into(),
            x_label: "vCPUs".into(),
            y_label: "pass time (ms)".into(),
            log_y: true,
            references: Vec::new(),
            series,
        }
        .into()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_dirty_log_experiment_shows_the_fault_pattern() {
        let r = dirty_log_experiment(&DirtyLogOpts {
            vcpus: vec![1, 2],
            total_bytes: 16 << 20,
            write_bytes_per_vcpu: 16 << 20,
            iterations: 2,
            exit_cost_ns: 0,
            tlbi_cost_ns: 0,
            repeats: 1,
        })
        .unwrap();
        assert_eq!(
            seed_ratio(Pattern::WriteStride2M, 16).map(|r| (r * 10.0).round()),
            Some(48.0)
        );
        assert_eq!(seed_ratio(Pattern::ReadHeavy, 3), None);
        let runs = &r.results.runs;
        // Write-only, 1 vCPU: both fault once per 2 MiB page (8 pages).
        assert_eq!(runs[0].faults[0], 8, "on fault");
        assert_eq!(runs[1].faults[0], 8, "eager");
        assert_eq!(runs[0].mmu.fault_splits, 8);
        assert_eq!(runs[1].mmu.eager_splits, 8);
        // Read-heavy, 1 vCPU: split on fault faults on (nearly) every page,
        // eager only on writes.
        let (f, e) = (&runs[4], &runs[5]);
        assert_eq!(f.pattern, Pattern::ReadHeavy);
        assert!(
            f.faults[0] > 3 * e.faults[0],
            "{} vs {}",
            f.faults[0],
            e.faults[0]
        );
    }
}
