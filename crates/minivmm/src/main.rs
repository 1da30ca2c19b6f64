//! `minivmm`: run a small VM, migrate it with ferry's engine, or show both
//! ends of a migration in one command (`minivmm demo`).

mod cmd;

use clap::Parser;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MINIVMM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = cmd::Cli::parse();
    if let Err(e) = cmd::run(cli) {
        eprintln!("minivmm: {e}");
        std::process::exit(1);
    }
}
