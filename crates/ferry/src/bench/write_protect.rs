//! `ferry bench write-protect`: write-protecting all memory by a generation
//! bump against a walk, on the soft MMU (`ferry_experiments::soft::write_protect`),
//! from its flags.

use super::output::emit_json;
use crate::error::CmdError;
use clap::Args;
use ferry_experiments::soft::write_protect::{write_protect_experiment, WriteProtectOpts};
use std::path::PathBuf;
use std::process::ExitCode;

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

/// Runs `ferry bench write-protect`.
pub fn run(a: WriteProtectArgs) -> Result<ExitCode, CmdError> {
    let opts = WriteProtectOpts {
        sizes_gib: a.sizes_gib.clone(),
        fault_pages: a.fault_pages,
        repeats: a.repeats as usize,
    };
    let report = write_protect_experiment(&opts).map_err(|e| CmdError::Usage(e.to_string()))?;
    emit_json(&report, &a.out, a.json)
}
