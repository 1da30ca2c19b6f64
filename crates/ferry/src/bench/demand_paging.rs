//! `ferry bench demand-paging`: postcopy's fault path alone, the
//! annotated-faults seed's table (`ferry_experiments::demand_paging`), from its
//! flags.

use super::output::emit_json;
use crate::args::parse_size;
use crate::error::CmdError;
use clap::Args;
use ferry_experiments::demand_paging::{experiment as demand_paging_experiment, DemandPagingOpts};
use ferry_vm::PAGE_SIZE;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `ferry bench demand-paging`.
#[derive(Args, Debug)]
pub struct DemandPagingArgs {
    /// Backends to measure: kvm, soft or both (kvm is skipped, with a
    /// note, where /dev/kvm is absent).
    #[arg(long, value_delimiter = ',', default_value = "kvm,soft", value_parser = ["kvm", "soft"])]
    pub backends: Vec<String>,
    /// A subset that finishes quickly: fewer cases, less memory,
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

/// Runs `ferry bench demand-paging`.
pub fn run(a: DemandPagingArgs) -> Result<ExitCode, CmdError> {
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
