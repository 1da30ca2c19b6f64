//! Zap experiment: present-only iteration vs full scan (the iterator seed).
//!
//! The sparse case rebuilds the seed's "hello" VM: address space 0 holds 7
//! tables (root, PDPT, two PDs, three PTs) with 8 present entries, address
//! space 1 only its root; both are zapped as `__tdp_mmu_zap_root` does, one
//! pass per level. A full scan takes 18 × 512 = 9216 loop steps. The dense case
//! zaps a guest whose memory is all mapped with 4 KiB leaves, where skipping
//! cannot help and must not hurt much.

use crate::{machine_note, median, ns, time};
use ferry_report::{ratio, Plot, Report, Series, Table};
use ferry_soft::config::{Iteration, LeafSize, Mechanisms};
use ferry_soft::error::SoftError;
use ferry_soft::mmu::Mmu;
use ferry_soft::ops::WalkStats;
use ferry_soft::sparse;
use ferry_vm::Gfn;
use serde::Serialize;

/// Options of the zap experiment.
#[derive(Clone, Debug, Serialize)]
pub struct ZapOpts {
    /// Timed zaps of the sparse case per iteration mode (median reported).
    pub sparse_repeats: usize,
    /// Size of the dense case (all 4 KiB leaves).
    pub dense_bytes: u64,
    /// Timed zaps of the dense case per iteration mode.
    pub dense_repeats: usize,
}

impl Default for ZapOpts {
    fn default() -> Self {
        ZapOpts {
            sparse_repeats: 2001,
            dense_bytes: 1 << 30,
            dense_repeats: 5,
        }
    }
}

/// One case under one iteration mode.
#[derive(Clone, Debug, Serialize)]
pub struct ZapCase {
    /// Case name.
    pub case: String,
    /// Iteration mode.
    pub iteration: Iteration,
    /// Tables before the zap.
    pub tables: u64,
    /// Present entries before the zap.
    pub present: u64,
    /// Loop steps per pass, address space by address space (as,level order).
    pub passes: Vec<WalkStats>,
    /// Total loop steps.
    pub steps: u64,
    /// Median nanoseconds per zap of everything.
    pub zap_ns: f64,
}

/// Results of the zap experiment.
#[derive(Clone, Debug, Serialize)]
pub struct ZapResults {
    /// Options used.
    pub opts: ZapOpts,
    /// Every case in both modes.
    pub cases: Vec<ZapCase>,
}

fn mech(iteration: Iteration) -> Mechanisms {
    Mechanisms {
        iteration,
        leaf: LeafSize::K4,
        ..Mechanisms::default()
    }
}

/// Maps the hello VM's shape into `as0` (`as1` stays an empty root).
fn build_hello(as0: &Mmu) -> Result<(), SoftError> {
    for gfn in [0x10, 0x210, 0x4_0010] {
        as0.translate(None, Gfn(gfn), false)?;
    }
    as0.zap_range(0x4_0010, 0x4_0011); // leaves its PT present but empty
    Ok(())
}

fn sparse_case(iteration: Iteration, repeats: usize) -> Result<ZapCase, SoftError> {
    let as0 = Mmu::new(1 << 20, 0, mech(iteration))?;
    let as1 = Mmu::new(1 << 20, 0, mech(iteration))?;
    build_hello(&as0)?;
    let (c0, c1) = (as0.census(), as1.census());
    let mut passes = Vec::new();
    let mut failure = None;
    let d = median(repeats, || {
        if let Err(e) = build_hello(&as0) {
            failure = Some(e);
        }
        let ((p0, p1), d) = time(|| (as0.zap_all(), as1.zap_all()));
        passes = p0.iter().chain(p1.iter()).copied().collect();
        d
    });
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(ZapCase {
        case: "sparse: seed hello VM, 2 address spaces".into(),
        iteration,
        tables: c0.tables + c1.tables,
        present: c0.present + c1.present,
        steps: passes.iter().map(|p| p.steps).sum(),
        passes,
        zap_ns: ns(d),
    })
}

fn dense_case(iteration: Iteration, bytes: u64, repeats: usize) -> Result<ZapCase, SoftError> {
    let mut census = None;
    let mut passes = Vec::new();
    let mut failure = None;
    let d = median(repeats, || {
        let m = match sparse::fully_mapped(bytes, 1, false, mech(iteration), 0) {
            Ok(m) => m,
            Err(e) => {
                failure = Some(e);
                return Default::default();
            }
        };
        census.get_or_insert_with(|| m.census());
        let (p, d) = time(|| m.zap_all());
        passes = p.to_vec();
        d
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let c = census.unwrap_or_default();
    Ok(ZapCase {
        case: format!("dense: {} GiB of 4 KiB leaves", bytes >> 30),
        iteration,
        tables: c.tables,
        present: c.present,
        steps: passes.iter().map(|p| p.steps).sum(),
        passes,
        zap_ns: ns(d),
    })
}

/// Runs the zap experiment.
pub fn zap_experiment(opts: &ZapOpts) -> Result<Report<ZapResults>, SoftError> {
    if opts.dense_bytes < (2 << 20) || !opts.dense_bytes.is_multiple_of(2 << 20) {
        return Err(SoftError::Options(
            "dense size must be a multiple of 2 MiB".into(),
        ));
    }
    let mut cases = Vec::new();
    for it in [Iteration::FullScan, Iteration::PresentOnly] {
        cases.push(sparse_case(it, opts.sparse_repeats)?);
    }
    for it in [Iteration::FullScan, Iteration::PresentOnly] {
        cases.push(dense_case(it, opts.dense_bytes, opts.dense_repeats)?);
    }

    let mut seed = Table::new(
        "Zap of the seed's sparse case, per root and level (loops = iterator steps)",
        &[
            "zap root(as, level)",
            "loops: full scan",
            "loops: present-only",
            "entries",
        ],
    );
    for (k, (full, present)) in cases[0].passes.iter().zip(&cases[1].passes).enumerate() {
        seed.row(vec![
            format!("({}, {})", k / 4, k % 4 + 1),
            full.steps.to_string(),
            present.steps.to_string(),
            present.changed.to_string(),
        ]);
    }
    seed.row(vec![
        "total".into(),
        cases[0].steps.to_string(),
        cases[1].steps.to_string(),
        cases[1]
            .passes
            .iter()
            .map(|p| p.changed)
            .sum::<u64>()
            .to_string(),
    ]);
    seed.note("seed: 9216 loops become 303 for 18 tables (about 13 ns a loop)");

    let mut summary = Table::new(
        "Zap: present-only iteration vs full scan",
        &[
            "case",
            "tables",
            "present",
            "steps full",
            "steps present",
            "time full (µs)",
            "time present (µs)",
            "time ratio",
            "ns/step full",
        ],
    );
    for pair in cases.chunks(2) {
        let (f, p) = (&pair[0], &pair[1]);
        summary.row(vec![
            f.case.clone(),
            f.tables.to_string(),
            f.present.to_string(),
            f.steps.to_string(),
            p.steps.to_string(),
            format!("{:.2}", f.zap_ns / 1e3),
            format!("{:.2}", p.zap_ns / 1e3),
            ratio(f.zap_ns, p.zap_ns),
            format!("{:.2}", f.zap_ns / f.steps.max(1) as f64),
        ]);
    }
    let entered: u64 = cases[1].passes.iter().map(|p| p.tables).sum();
    summary.note(format!(
        "present-only: every step visits a present entry; steps {} <= present entries {} + tables entered over the 8 passes {} = {}; the first pass alone takes exactly one step per present entry ({})",
        cases[1].steps,
        cases[1].present,
        entered,
        cases[1].present + entered,
        cases[1].passes[0].steps
    ));
    summary.note(format!(
        "medians of {} (sparse) and {} (dense) zaps; zap time includes freeing the tables; {}",
        opts.sparse_repeats,
        opts.dense_repeats,
        machine_note(1)
    ));
    let plot = Plot {
        title: "Zap loop steps per pass".into(),
        x_label: "pass (address space × 4 + level)".into(),
        y_label: "loop steps".into(),
        log_y: true,
        references: Vec::new(),
        series: cases[..2]
            .iter()
            .map(|c| Series {
                label: format!("{:?}", c.iteration),
                points: c
                    .passes
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (i as f64 + 1.0, p.steps.max(1) as f64))
                    .collect(),
            })
            .collect(),
    };
    Ok(Report {
        name: "zap".into(),
        tables: vec![seed, summary],
        results: ZapResults {
            opts: opts.clone(),
            cases,
        },
        charts: vec![plot.into()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_zap_experiment_reproduces_the_seed_counts() {
        let r = zap_experiment(&ZapOpts {
            sparse_repeats: 3,
            dense_bytes: 4 << 20,
            dense_repeats: 1,
        })
        .unwrap();
        let c = &r.results.cases;
        assert_eq!(c[0].steps, 9216, "full scan of 18 tables");
        assert_eq!(c[0].tables, 8);
        let entered: u64 = c[1].passes.iter().map(|p| p.tables).sum();
        assert!(c[1].steps <= c[1].present + entered);
        assert_eq!(c[1].passes[0].steps, c[1].present);
        assert!(r.render().contains("9216"));
    }
}
