//! `ferry bench zap`: the iterator seed's zap of a sparse and a dense table
//! tree on the soft MMU (`ferry_experiments::soft::zap`), from its flags.

use super::output::emit_json;
use crate::args::parse_size;
use crate::error::CmdError;
use clap::Args;
use ferry_experiments::soft::zap::{zap_experiment, ZapOpts};
use std::path::PathBuf;
use std::process::ExitCode;

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

/// Runs `ferry bench zap`.
pub fn run(a: ZapArgs) -> Result<ExitCode, CmdError> {
    let opts = ZapOpts {
        sparse_repeats: a.sparse_repeats as usize,
        dense_bytes: a.dense_mem,
        dense_repeats: a.dense_repeats as usize,
    };
    let report = zap_experiment(&opts).map_err(|e| CmdError::Usage(e.to_string()))?;
    emit_json(&report, &a.out, a.json)
}
