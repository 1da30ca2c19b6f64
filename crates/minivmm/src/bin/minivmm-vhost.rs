//! `minivmm-vhost`: the fill device's vhost-user backend, a process of its
//! own (`minivmm::fill::backend`). minivmm starts it; it serves one VMM at
//! a time on `--socket`, and exits once no VMM has been connected for a
//! while.

use clap::Parser;
use std::path::PathBuf;

/// The vhost-user backend of minivmm's fill device: fills each buffer the
/// guest posts with the next sequence number and its check.
#[derive(Parser, Debug)]
#[command(name = "minivmm-vhost", version)]
struct Args {
    /// The UNIX socket to listen on (replaced if it exists).
    #[arg(long)]
    socket: PathBuf,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = minivmm::fill::backend::run(&args.socket) {
        eprintln!("minivmm-vhost: {e}");
        std::process::exit(1);
    }
}
