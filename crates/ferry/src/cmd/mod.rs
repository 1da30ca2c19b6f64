//! Subcommands.

mod bench;
mod run;

use clap::Subcommand;
use std::process::ExitCode;

/// Errors a subcommand reports; `main` prints the whole chain.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// Arguments that parse but make no sense together.
    #[error("{0}")]
    Usage(String),
    /// The VM failed.
    #[error(transparent)]
    Backend(#[from] ferry_backend::BackendError),
    /// Writing a report failed.
    #[error(transparent)]
    Report(#[from] ferry_report::ReportError),
    /// Something else, already described.
    #[error("{0}")]
    Failed(String),
}

/// The ferry subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a VM with the memstress guest and print its progress.
    Run(run::RunArgs),
    /// Run an experiment (dirty-log, zap, write-protect).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// Runs a subcommand.
pub fn run(command: Command) -> Result<ExitCode, CmdError> {
    match command {
        Command::Run(a) => run::run(a),
        Command::Bench(b) => bench::run(b),
    }
}
