//! `ferry bench dirty-log`: on kvm, each KVM dirty-tracking mode's pass
//! time and log cost (`ferry_experiments::kvm::dirty_log`); on soft, eager split
//! against split on fault (`ferry_experiments::soft::dirty_log`). Its flags, and
//! the VM they describe.

use super::output::emit_json;
use crate::args::{parse_size, BackendArgs, TrackingMode};
use crate::backend::BackendKind;
use crate::error::CmdError;
use clap::Args;
use ferry_experiments::kvm::dirty_log as dirty_log_kvm;
use ferry_experiments::soft::dirty_log::{dirty_log_experiment, DirtyLogOpts};
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::Program;
use ferry_memstress::{AccessOrder, Workload};
use std::path::PathBuf;
use std::process::ExitCode;

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

/// Runs `ferry bench dirty-log` on the backend it names.
pub fn run(a: DirtyLogArgs) -> Result<ExitCode, CmdError> {
    if a.backend.kind() == BackendKind::Soft {
        dirty_log_soft(a)
    } else {
        dirty_log(a)
    }
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
