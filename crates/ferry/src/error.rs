//! The error every subcommand, experiment and report of the CLI returns.
//! It sits at the bottom of the CLI's modules, so that the code a
//! subcommand shares with the control socket and the experiments (the
//! migration driver, the prediction, the report) can return it without
//! reaching up into the subcommands.

/// Errors a subcommand reports; `main` prints the whole chain.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// Arguments that parse but make no sense together.
    #[error("{0}")]
    Usage(String),
    /// The VM failed.
    #[error(transparent)]
    Backend(#[from] ferry_vm::VmError),
    /// Writing a report failed.
    #[error(transparent)]
    Report(#[from] ferry_report::ReportError),
    /// Something else, already described.
    #[error("{0}")]
    Failed(String),
}
