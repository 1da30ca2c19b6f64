//! Subcommands.

mod bench;
mod certs;
mod ctl;
mod demo;
mod drain;
mod migrate;
mod plan;
mod receive;
mod restore;
mod run;
mod snapshot;

use crate::error::CmdError;
use clap::Subcommand;
use std::process::ExitCode;

/// The ferry subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Migrate a busy guest between two processes on this machine and show how
    /// it went (the main job in one command).
    Demo(demo::DemoArgs),
    /// Run a VM with the memstress guest and print its progress.
    Run(run::RunArgs),
    /// Receive a migration: listen, load the guest, resume it, verify it.
    Receive(receive::ReceiveArgs),
    /// Boot a VM with the memstress guest and migrate it to a `ferry receive`.
    Migrate(migrate::MigrateArgs),
    /// Save a running VM to a file while it runs, through its control
    /// socket (`ferry run --control`, `ferry receive --control`, `ferry
    /// restore --control`).
    Snapshot(snapshot::SnapshotArgs),
    /// Restore a VM from a snapshot file (eagerly, lazily, or lazily with
    /// its working set first) and run it on, served as `ferry run` serves.
    Restore(restore::RestoreArgs),
    /// Talk to a `ferry run --control` socket in QMP's terms: query, set
    /// parameters, migrate, cancel, and follow events.
    Ctl(ctl::CtlArgs),
    /// Write a throwaway CA and certificate for --tls-dir (tests and demos).
    Certs(certs::CertsArgs),
    /// Plan draining hosts: each VM's destination, start, convergence
    /// policy and bandwidth, and when the last one is done, on ferry's
    /// model of each migration (`--compare`: against KubeVirt's, HCO's,
    /// Nova's and vSphere's admission).
    Plan(plan::PlanArgs),
    /// Drain a host of a small fleet built on this machine (network
    /// namespaces on a bridge, shaped NICs), for real, under the planner
    /// and KubeVirt's admission, against the simulator's prediction.
    Drain(drain::DrainArgs),
    /// Run an experiment (dirty-log, zap, write-protect).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// Runs a subcommand.
pub fn run(command: Command) -> Result<ExitCode, CmdError> {
    match command {
        Command::Demo(a) => demo::run(a),
        Command::Run(a) => run::run(a),
        Command::Receive(a) => receive::run(a),
        Command::Migrate(a) => migrate::run(a),
        Command::Snapshot(a) => snapshot::run(a),
        Command::Restore(a) => restore::run(a),
        Command::Ctl(a) => ctl::run(a),
        Command::Certs(a) => certs::run(a),
        Command::Plan(a) => plan::run_plan(a),
        Command::Drain(a) => drain::run(a),
        Command::Bench(b) => bench::run(b),
    }
}
