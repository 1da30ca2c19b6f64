//! `minivmm`: run a small VM, migrate it with ferry's engine, or show both
//! ends of a migration in one command (`minivmm demo`).

mod cmd;

use clap::Parser;

fn main() {
    let cli = cmd::Cli::parse();
    if let Err(e) = cmd::run(cli) {
        eprintln!("minivmm: {e}");
        std::process::exit(1);
    }
}
