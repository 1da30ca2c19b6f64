//! `ferry bench ...`.

use crate::args::{parse_size, BackendArgs, TrackingMode};
use crate::backend::BackendKind;
use crate::error::CmdError;
use clap::{Args, Subcommand};
use ferry_bench::demand_paging::{experiment as demand_paging_experiment, DemandPagingOpts};
use ferry_bench::kvm::dirty_log as dirty_log_kvm;
use ferry_bench::soft::dirty_log::{dirty_log_experiment, DirtyLogOpts};
use ferry_bench::soft::write_protect::{write_protect_experiment, WriteProtectOpts};
use ferry_bench::soft::zap::{zap_experiment, ZapOpts};
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::Program;
use ferry_memstress::{AccessOrder, Workload};
use ferry_report::Report;
use ferry_vm::PAGE_SIZE;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The experiments.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Dirty-memory pass time and get/clear dirty log cost: per KVM tracking
    /// mode (kvm), or eager split vs split on fault over 1-16 vCPUs (soft;
    /// the eager-splitting seed's two tables).
    DirtyLog(DirtyLogArgs),
    /// Zap a sparse (the iterator seed's 18 tables) and a dense table tree:
    /// present-only iteration vs full scan, loop steps and time (soft MMU).
    Zap(ZapArgs),
    /// Write-protect all memory and harvest the log for 1-64 GiB: O(1)
    /// generation bump vs walk, and the faults that follow (soft MMU).
    WriteProtect(WriteProtectArgs),
    /// The first pass of an idle guest over 1, 2 and 4 connections, with and
    /// without compression, against raw loopback TCP measured in the same run.
    Link(crate::bench::link::LinkArgs),
    /// Each convergence policy against guests that dirty faster than the
    /// link: the dirty-quota seed's table A (migration time per policy) and
    /// table B (guest runtime and progress for writer/reader mixes).
    Converge(crate::bench::converge::ConvergeArgs),
    /// Postcopy's fault path alone (no network), the annotated-faults
    /// seed's table: pages/s against vCPUs for userfaultfd variants on kvm
    /// (4K/2M, MISSING/MINOR, poll/busy, prefetch) and for the shared fault
    /// queue vs vCPU-direct exits on soft.
    DemandPaging(DemandPagingArgs),
    /// Same-host live upgrade (the memory's memfd files handed to the new
    /// process) at 1, 4 and 16 GiB: downtime and total time, with TCP
    /// precopy of the same VM in the same run for contrast. `--json` ends
    /// with `cells` (mem_gib, downtime_ms, total_ms).
    Local(crate::bench::local::LocalArgs),
    /// A write-heavy guest ping-pongs between two ends, A→B→A..., every
    /// hop verified (digest and guest stamps); `--json` ends with `hops`
    /// and `failed`.
    Soak(crate::bench::soak::SoakArgs),
    /// A guest whose device has large state that changes at a fixed rate
    /// (256 MiB, a 64 KiB block rewritten every millisecond) migrates with
    /// that state sent live and, interleaved in the same run, all at the
    /// pause: downtime against `--downtime-ms`, the prediction beside it,
    /// and the device's state compared on both ends.
    DeviceState(crate::bench::device_state::DeviceStateArgs),
    /// Draining a rack of simulated fat-trees (128 to 1,024 hosts, seeds
    /// 1-5): the planner against KubeVirt's, HCO's, Nova's and vSphere's
    /// admission, every migration on ferry's model. `--json` ends with
    /// `cells` (hosts, drained_hosts, vms, seed, policies).
    Fleet(crate::bench::fleet::FleetArgs),
}

/// Arguments of `ferry bench demand-paging`.
#[derive(Args, Debug)]
pub struct DemandPagingArgs {
    /// Backends to measure: kvm, soft or both (kvm is skipped, with a
    /// note, where /dev/kvm is absent).
    #[arg(long, value_delimiter = ',', default_value = "kvm,soft", value_parser = ["kvm", "soft"])]
    pub backends: Vec<String>,
    /// A subset that finishes in under 3 minutes: fewer cases, less memory,
    /// one run per cell.
    #[arg(long)]
    pub quick: bool,
    /// vCPU counts on kvm.
    #[arg(long = "kvm-vcpus", value_delimiter = ',', default_value = "1,2", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub kvm_vcpus: Vec<u32>,
    /// Guest memory per vCPU on kvm (multiple of 2M; default 64M, or 16M
    /// with --quick).
    #[arg(long = "mem-per-vcpu", value_parser = parse_size)]
    pub mem_per_vcpu: Option<u64>,
    /// vCPU thread counts on soft.
    #[arg(long = "soft-vcpus", value_delimiter = ',', default_value = "1,2,4,8,16,32", value_parser = clap::value_parser!(u64).range(1..=256))]
    pub soft_vcpus: Vec<u64>,
    /// Memory per vCPU thread on soft (multiple of 2M; default 16M, or 4M
    /// with --quick).
    #[arg(long = "soft-mem-per-vcpu", value_parser = parse_size)]
    pub soft_mem_per_vcpu: Option<u64>,
    /// Modelled cost in ns of a vCPU-direct fault's exit to the VMM (soft).
    #[arg(long = "exit-cost-ns", default_value_t = ferry_soft::hw_cost::SEED_EXIT_COST_NS)]
    pub exit_cost_ns: u64,
    /// Runs per cell, the median reported (default 3, or 1 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: Option<u32>,
    /// End with one JSON object on the last stdout line: the bench's
    /// name, where its outputs went, and its results.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html, the page that
    /// holds them all.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// Arguments of `ferry bench zap`.
#[derive(Args, Debug)]
pub struct ZapArgs {
    /// Timed zaps of the sparse case per mode (median reported).
    #[arg(long = "sparse-repeats", default_value_t = 2001, value_parser = clap::value_parser!(u64).range(1..))]
    pub sparse_repeats: u64,
    /// Size of the dense case (all 4 KiB leaves).
    #[arg(long = "dense-mem", default_value = "1G", value_parser = parse_size)]
    pub dense_mem: u64,
    /// Timed zaps of the dense case per mode.
    #[arg(long = "dense-repeats", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub dense_repeats: u64,
    /// End with one JSON object on the last stdout line: the bench's
    /// name, where its outputs went, and its results.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html, the page that
    /// holds them all.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// Arguments of `ferry bench write-protect`.
#[derive(Args, Debug)]
pub struct WriteProtectArgs {
    /// Guest sizes in GiB (sparse memory: page tables are real, contents implied).
    #[arg(long = "sizes-gib", value_delimiter = ',', default_value = "1,4,16,64")]
    pub sizes_gib: Vec<u64>,
    /// Pages written after write-protect-all, spread evenly over memory.
    #[arg(long = "fault-pages", default_value_t = 65536, value_parser = clap::value_parser!(u64).range(1..))]
    pub fault_pages: u64,
    /// Timed generation bumps per size (median reported).
    #[arg(long, default_value_t = 101, value_parser = clap::value_parser!(u64).range(1..))]
    pub repeats: u64,
    /// End with one JSON object on the last stdout line: the bench's
    /// name, where its outputs went, and its results.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html, the page that
    /// holds them all.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// Arguments of `ferry bench dirty-log`.
#[derive(Args, Debug)]
pub struct DirtyLogArgs {
    /// vCPUs.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub vcpus: u32,
    /// Guest memory per vCPU (multiple of 2M).
    #[arg(long = "mem-per-vcpu", default_value = "512M", value_parser = parse_size)]
    pub mem_per_vcpu: u64,
    /// Logged passes to measure.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub iterations: u32,
    /// Percentage of accesses that write.
    #[arg(long = "write-percent", default_value_t = 100, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub write_percent: u8,
    /// Page stride (512 = one page per 2 MiB, the eager-split seed's sparse test).
    #[arg(long, default_value_t = 1)]
    pub stride: u64,
    /// Modes to measure (kvm; default: all three).
    #[arg(long = "modes", value_enum, value_delimiter = ',')]
    pub modes: Vec<TrackingMode>,
    /// Skip the calibration run of the probe's bare write loop (kvm).
    #[arg(long = "no-calibration")]
    pub no_calibration: bool,
    /// vCPU counts to compare (soft backend).
    #[arg(
        long = "vcpu-counts",
        value_delimiter = ',',
        default_value = "1,2,4,8,16"
    )]
    pub vcpu_counts: Vec<u32>,
    /// Guest memory shared out among the vCPUs (soft backend).
    #[arg(long = "total-mem", default_value = "1G", value_parser = parse_size)]
    pub total_mem: u64,
    /// Modelled cost of a fault's exit to the hypervisor in ns (soft backend;
    /// 2000 = the seed's own figure, 0 = the software MMU alone).
    #[arg(long = "exit-cost-ns", default_value_t = ferry_soft::hw_cost::SEED_EXIT_COST_NS)]
    pub exit_cost_ns: u64,
    /// Modelled cost of one broadcast TLB invalidation in ns, paid one at a
    /// time by every remote flush, e.g. split on fault's break-before-make
    /// (soft backend; 2500 = the seed's own figure, 0 = none).
    #[arg(long = "tlbi-cost-ns", default_value_t = ferry_soft::hw_cost::SEED_BROADCAST_TLBI_NS)]
    pub tlbi_cost_ns: u64,
    /// Runs of each soft configuration (median reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// End with one JSON object on the last stdout line: the bench's
    /// name, where its outputs went, and its results.
    #[arg(long)]
    pub json: bool,
    /// Directory for the JSON, the charts and report.html, the page that
    /// holds them all.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

pub fn run(cmd: BenchCommand) -> Result<ExitCode, CmdError> {
    match cmd {
        BenchCommand::DirtyLog(a) if a.backend.kind() == BackendKind::Soft => dirty_log_soft(a),
        BenchCommand::DirtyLog(a) => dirty_log(a),
        BenchCommand::Zap(a) => {
            let opts = ZapOpts {
                sparse_repeats: a.sparse_repeats as usize,
                dense_bytes: a.dense_mem,
                dense_repeats: a.dense_repeats as usize,
            };
            let report = zap_experiment(&opts).map_err(|e| CmdError::Usage(e.to_string()))?;
            emit_json(&report, &a.out, a.json)
        }
        BenchCommand::Link(mut a) => {
            a.backend = crate::args::resolve_backend(&a.backend);
            let report = crate::bench::link::run(&a)?;
            let code = emit(&report, &a.out)?;
            if a.json {
                println!("{}", crate::bench::link::summary_json(&report.results));
            }
            Ok(code)
        }
        BenchCommand::Fleet(a) => {
            let report = crate::bench::fleet::run_bench(&a)?;
            let code = emit(&report, &a.out)?;
            if a.json {
                println!("{}", crate::bench::fleet::summary_json(&report.results));
            }
            Ok(code)
        }
        BenchCommand::DeviceState(a) => {
            let report = crate::bench::device_state::run(&a)?;
            emit_json(&report, &a.out, a.json)
        }
        BenchCommand::Converge(a) => {
            let report = crate::bench::converge::run(&a)?;
            let code = emit(&report, &a.out)?;
            if a.json {
                println!("{}", crate::bench::converge::summary_json(&report.results));
            }
            Ok(code)
        }
        BenchCommand::Local(mut a) => {
            a.backend = crate::args::resolve_backend(&a.backend);
            let report = crate::bench::local::run(&a)?;
            let code = emit(&report, &a.out)?;
            if a.json {
                println!("{}", crate::bench::local::summary_json(&report.results));
            }
            let all_verified = report.results.cells.iter().all(|c| c.verified);
            Ok(if all_verified {
                code
            } else {
                ExitCode::FAILURE
            })
        }
        BenchCommand::DemandPaging(a) => demand_paging(a),
        BenchCommand::Soak(mut a) => {
            a.backend = crate::args::resolve_backend(&a.backend);
            let report = crate::bench::soak::run(&a)?;
            emit(&report, &a.out)?;
            let s = &report.results;
            if a.json {
                println!("{}", crate::bench::soak::summary_json(s));
            }
            Ok(if s.failed == 0 && s.final_exit_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        BenchCommand::WriteProtect(a) => {
            let opts = WriteProtectOpts {
                sizes_gib: a.sizes_gib.clone(),
                fault_pages: a.fault_pages,
                repeats: a.repeats as usize,
            };
            let report =
                write_protect_experiment(&opts).map_err(|e| CmdError::Usage(e.to_string()))?;
            emit_json(&report, &a.out, a.json)
        }
    }
}

/// Prints a report and writes its JSON and SVG.
fn emit<T: serde::Serialize>(report: &Report<T>, out: &Path) -> Result<ExitCode, CmdError> {
    emit_json(report, out, false)
}

/// [`emit`], then with `json` one JSON object as the last stdout line: the
/// bench's name, where its outputs went, and its results (for the benches
/// whose `--json` has no summary of its own).
fn emit_json<T: serde::Serialize>(
    report: &Report<T>,
    out: &Path,
    json: bool,
) -> Result<ExitCode, CmdError> {
    print!("{}", report.render());
    let written = report.write(out)?;
    println!(
        "wrote {} and {}",
        written.json.display(),
        written.svg.display()
    );
    if json {
        let line = serde_json::json!({
            "bench": report.name,
            "json": written.json,
            "svg": written.svg,
            "results": report.results,
        });
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

fn dirty_log_soft(a: DirtyLogArgs) -> Result<ExitCode, CmdError> {
    let opts = DirtyLogOpts {
        vcpus: a.vcpu_counts.clone(),
        total_bytes: a.total_mem,
        iterations: a.iterations,
        exit_cost_ns: a.exit_cost_ns,
        tlbi_cost_ns: a.tlbi_cost_ns,
        repeats: a.repeats,
        ..DirtyLogOpts::default()
    };
    eprintln!("ferry bench dirty-log --backend soft: eager split vs split on fault ...");
    let report = dirty_log_experiment(&opts).map_err(|e| CmdError::Usage(e.to_string()))?;
    emit_json(&report, &a.out, a.json)
}

fn dirty_log(a: DirtyLogArgs) -> Result<ExitCode, CmdError> {
    let workload = Workload {
        vcpus: a.vcpus,
        bytes_per_vcpu: a.mem_per_vcpu,
        write_percent: a.write_percent,
        readers: 0,
        order: AccessOrder::Sequential,
        stride_pages: a.stride,
        rate_limit_mib_s: None,
        seed: 0x5eed,
        fill: ferry_memstress::Fill::Zero,
        ..Workload::default()
    };
    workload
        .validate()
        .map_err(|e| CmdError::Usage(e.to_string()))?;
    let config = a.backend.config(workload);
    let modes = if a.modes.is_empty() {
        vec![
            TrackingMode::Bitmap,
            TrackingMode::Clear,
            TrackingMode::Ring,
        ]
    } else {
        a.modes.clone()
    };
    let mut results = dirty_log_kvm::DirtyLogResults {
        vcpus: a.vcpus,
        bytes_per_vcpu: a.mem_per_vcpu,
        write_percent: a.write_percent,
        iterations: a.iterations,
        backing: a.backend.backing.clone(),
        modes: vec![],
    };
    if !a.no_calibration {
        eprintln!("ferry bench dirty-log: calibrating with the probe's bare write loop ...");
        let raw = dirty_log_kvm::run_mode(
            &config,
            DirtyTracking::Bitmap,
            a.iterations,
            Program::RawWrites,
        )
        .map_err(CmdError::Failed)?;
        results.modes.push(raw);
    }
    for mode in modes {
        let mut backend = a.backend.clone();
        backend.dirty_tracking = mode;
        let tracking = backend.tracking().map_err(CmdError::Usage)?;
        eprintln!("ferry bench dirty-log: measuring {} ...", tracking.name());
        results.modes.push(
            dirty_log_kvm::run_mode(&config, tracking, a.iterations, Program::Memstress)
                .map_err(CmdError::Failed)?,
        );
    }
    let report = dirty_log_kvm::report(results);
    emit_json(&report, &a.out, a.json)
}

fn demand_paging(a: DemandPagingArgs) -> Result<ExitCode, CmdError> {
    let mem = a
        .mem_per_vcpu
        .unwrap_or(if a.quick { 16 << 20 } else { 64 << 20 });
    if !mem.is_multiple_of(2 << 20) {
        return Err(CmdError::Usage(
            "--mem-per-vcpu must be a multiple of 2M".into(),
        ));
    }
    let soft_mem = a
        .soft_mem_per_vcpu
        .unwrap_or(if a.quick { 4 << 20 } else { 16 << 20 });
    if !soft_mem.is_multiple_of(2 << 20) {
        return Err(CmdError::Usage(
            "--soft-mem-per-vcpu must be a multiple of 2M".into(),
        ));
    }
    let mut kvm = a.backends.iter().any(|b| b == "kvm");
    if kvm && !ferry_kvm::kvm_available() {
        println!("SKIP: /dev/kvm cannot be opened here; demand paging on kvm not measured");
        kvm = false;
    }
    let opts = DemandPagingOpts {
        kvm,
        soft: a.backends.iter().any(|b| b == "soft"),
        kvm_vcpus: a.kvm_vcpus.clone(),
        kvm_bytes_per_vcpu: mem,
        quick: a.quick,
        soft_vcpus: a.soft_vcpus.iter().map(|&v| v as usize).collect(),
        soft_pages_per_vcpu: (soft_mem / PAGE_SIZE as u64).max(1),
        exit_cost_ns: a.exit_cost_ns,
        repeats: a.repeats.unwrap_or(if a.quick { 1 } else { 3 }),
    };
    let report = demand_paging_experiment(&opts, &mut |step| {
        eprintln!("ferry bench demand-paging: {step} ...")
    })
    .map_err(CmdError::Failed)?;
    emit_json(&report, &a.out, a.json)
}
