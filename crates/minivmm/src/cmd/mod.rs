//! The command line: `run`, `migrate`, `receive`, `demo` and `probe-host`.

mod demo;
mod migrate;
mod probe;
mod receive;
mod run;

use clap::{Args, Parser, Subcommand};
use ferry_engine::vmm::Backing;
use minivmm::layout::{BLOCK_BYTES, DISK_BLOCKS};
use minivmm::serial::ConsoleOut;
use minivmm::MiniConfig;
use std::path::{Path, PathBuf};

/// A small VMM built from rust-vmm crates (KVM, a 16550 serial port and
/// virtio-blk over virtio-mmio) that migrates live through ferry's engine.
/// Its guest prints numbered console lines and writes and reads back
/// numbered disk blocks; every migration checks both streams and ferry's
/// memory digest.
#[derive(Parser, Debug)]
#[command(name = "minivmm", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Boot the VM and run it for a while, console on stdout.
    Run(run::RunArgs),
    /// Boot the VM, let it run, then migrate it live to a `receive`.
    Migrate(migrate::MigrateArgs),
    /// Wait for a migrated VM, run it on, and report what it did.
    Receive(receive::ReceiveArgs),
    /// Source and destination as two processes on this host, with every
    /// check: digest, console lines, disk requests.
    Demo(demo::DemoArgs),
    /// Try what this host's KVM offers for serving devices off the vCPU
    /// threads (in-kernel irqchip, ioeventfd, irqfd) on a fresh VM.
    ProbeHost(probe::ProbeArgs),
}

/// Runs the command.
pub fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Migrate(a) => migrate::migrate(a),
        Command::Receive(a) => receive::receive(a),
        Command::Demo(a) => demo::demo(a),
        Command::ProbeHost(a) => probe::probe(a),
    }
}

/// The VM's shape, as the source gives it.
#[derive(Args, Debug, Clone)]
struct VmArgs {
    /// MiB of the data region the guest sweeps (a multiple of 2).
    #[arg(long, default_value_t = 64)]
    data_mib: u64,
    /// The disk image (created, 256 KiB, if missing). Both ends of a
    /// migration open the same file: shared storage.
    #[arg(long, default_value = "minivmm-disk.img")]
    disk: PathBuf,
    /// Data pages the guest writes per loop (its dirty rate).
    #[arg(long, default_value_t = 4)]
    sweep_pages: u32,
}

impl VmArgs {
    fn config(&self) -> Result<MiniConfig, String> {
        ensure_disk(&self.disk)?;
        let disk = std::fs::canonicalize(&self.disk)
            .map_err(|e| format!("the disk image {}: {e}", self.disk.display()))?;
        Ok(MiniConfig {
            sweep_per_loop: self.sweep_pages,
            ..MiniConfig::new(self.data_mib, disk)
        })
    }
}

/// Creates the disk image if it is not there.
fn ensure_disk(path: &Path) -> Result<(), String> {
    let bytes = DISK_BLOCKS * BLOCK_BYTES;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open the disk image {}: {e}", path.display()))?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len < bytes {
        file.set_len(bytes)
            .map_err(|e| format!("cannot size the disk image {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Parses `anon` or `memfd`.
fn parse_backing(s: &str) -> Result<Backing, String> {
    match s.parse::<Backing>()? {
        b @ (Backing::Anonymous | Backing::Memfd) => Ok(b),
        other => Err(format!(
            "minivmm backs memory with anon or memfd, not {other:?}"
        )),
    }
}

/// The console: a file, or stdout.
fn console(path: Option<&Path>) -> Result<ConsoleOut, String> {
    Ok(match path {
        Some(p) => {
            ConsoleOut::new(Box::new(std::fs::File::create(p).map_err(|e| {
                format!("cannot create the console file {}: {e}", p.display())
            })?))
        }
        None => ConsoleOut::new(Box::new(std::io::stdout())),
    })
}

/// Runs of consecutive numbers: `[[first, last], ...]`.
fn runs(seqs: &[u64]) -> Vec<[u64; 2]> {
    let mut out: Vec<[u64; 2]> = Vec::new();
    for &s in seqs {
        match out.last_mut() {
            Some(r) if s == r[1].wrapping_add(1) => r[1] = s,
            _ => out.push([s, s]),
        }
    }
    out
}

/// The numbers [`runs`] describes.
fn expand(runs: &[[u64; 2]]) -> Vec<u64> {
    runs.iter().flat_map(|&[a, b]| a..=b).collect()
}

/// The VM's sections as the summary lists them.
fn sections(vm: &minivmm::MiniVm) -> serde_json::Value {
    use ferry_engine::vmm::Vm;
    vm.state_sections()
        .iter()
        .map(|s| serde_json::json!({ "name": s.name, "version": s.version }))
        .collect()
}

/// "completed", "failed" or "held".
fn status_name(s: ferry_engine::Outcome) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}
