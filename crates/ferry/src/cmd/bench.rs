//! `ferry bench ...`.

use super::CmdError;
use crate::args::{parse_size, BackendArgs, TrackingMode};
use crate::bench::dirty_log_kvm;
use clap::{Args, Subcommand};
use ferry_backend::{AccessOrder, Workload};
use std::path::PathBuf;
use std::process::ExitCode;

/// The experiments.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Dirty-memory pass time and get/clear dirty log cost, per tracking mode
    /// (the shape of the kernel's dirty_log_perf_test).
    DirtyLog(DirtyLogArgs),
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
    /// Modes to measure (default: all three).
    #[arg(long = "modes", value_enum, value_delimiter = ',')]
    pub modes: Vec<TrackingMode>,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Directory for the JSON and SVG outputs.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

pub fn run(cmd: BenchCommand) -> Result<ExitCode, CmdError> {
    match cmd {
        BenchCommand::DirtyLog(a) => dirty_log(a),
    }
}

fn dirty_log(a: DirtyLogArgs) -> Result<ExitCode, CmdError> {
    let workload = Workload {
        vcpus: a.vcpus,
        bytes_per_vcpu: a.mem_per_vcpu,
        write_percent: a.write_percent,
        order: AccessOrder::Sequential,
        stride_pages: a.stride,
        rate_limit_mib_s: None,
        seed: 0x5eed,
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
    for mode in modes {
        let mut backend = a.backend.clone();
        backend.dirty_tracking = mode;
        let tracking = backend.tracking().map_err(CmdError::Usage)?;
        eprintln!("ferry bench dirty-log: measuring {} ...", tracking.name());
        results.modes.push(
            dirty_log_kvm::run_mode(&config, tracking, a.iterations).map_err(CmdError::Failed)?,
        );
    }
    let report = dirty_log_kvm::report(results);
    print!("{}", report.render());
    let written = report.write(&a.out)?;
    println!(
        "wrote {} and {}",
        written.json.display(),
        written.svg.display()
    );
    Ok(ExitCode::SUCCESS)
}
