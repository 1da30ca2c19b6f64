//! `minivmm run`: boot and run, console on stdout (or a file).

use super::{console, parse_backing, VmArgs};
use ferry_engine::vmm::{Backing, Vm};
use minivmm::{probe, MiniVm};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    vm: VmArgs,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Guest memory: anon or memfd.
    #[arg(long, default_value = "anon", value_parser = parse_backing)]
    backing: Backing,
    /// Write the console here instead of stdout.
    #[arg(long)]
    console: Option<PathBuf>,
}

pub fn run(a: RunArgs) -> Result<(), String> {
    let out = console(a.console.as_deref())?;
    let mut vm = MiniVm::boot(a.vm.config()?, a.backing, out.clone()).map_err(|e| e.to_string())?;
    vm.start().map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_secs_f64(a.seconds.max(0.0)));
    vm.pause().map_err(|e| e.to_string())?;
    out.flush();
    vm.check_health().map_err(|e| e.to_string())?;
    let c = probe::counters(&vm).map_err(|e| format!("reading the guest's counters: {e}"))?;
    eprintln!(
        "minivmm: ran {:.1} s: {} console lines, {} disk writes, {} reads verified, {} bad reads, {} failed requests",
        a.seconds, c.console_lines, c.writes, c.reads_verified, c.bad_reads, c.status_errors
    );
    if c.bad_reads + c.status_errors > 0 {
        return Err("the guest found bad disk reads or failed requests".into());
    }
    Ok(())
}
