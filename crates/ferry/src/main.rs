//! `ferry`: live migration of KVM virtual machines, measured and verified.
//!
//! The subcommands are thin: each parses its arguments, builds a VM through
//! [`vms`], and hands it to the migration engine or an experiment.

mod args;
mod backend;
mod bench;
mod child;
mod cmd;
mod control;
mod demo;
mod drain;
mod driver;
mod endpoint;
mod error;
mod forecast;
mod guest_check;
mod netns;
mod plan;
mod progress_bar;
mod rates;
mod report;
mod serve;
mod signals;
mod summary;
mod timeline;
mod tls;
mod vcpu_share;
mod vms;

use clap::Parser;
use std::process::ExitCode;

/// ferry moves a running KVM virtual machine from one process (or host) to another
/// while the guest keeps running, and proves the move by digest.
///
/// Start with `ferry demo`: it boots a busy 2-vCPU guest, starts a destination
/// process on this machine, migrates over loopback and prints what happened.
/// `ferry --version`: the release, the wire versions it speaks and the
/// same-host protocol's (a migration runs between any two releases whose
/// ranges meet; see docs/compatibility.md).
fn version() -> &'static str {
    use ferry_engine::local::message as local;
    use ferry_engine::{MIN_WIRE_VERSION as MIN_VERSION, WIRE_VERSION as VERSION};
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "{} (wire {MIN_VERSION}-{VERSION}, local {}-{})",
            env!("CARGO_PKG_VERSION"),
            local::MIN_VERSION,
            local::VERSION
        )
    })
}

#[derive(Parser, Debug)]
#[command(name = "ferry", version = version(), about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Before any thread starts: every thread inherits the blocked mask.
    signals::install();
    match cmd::run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferry: error: {}", ferry_vm::error_chain(&e));
            ExitCode::from(1)
        }
    }
}
