//! `minivmm run`: boot and run, console on stdout (or a file).

use super::{consoles, flush, parse_backing, VmArgs};
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
    /// Write vCPU 0's console here (vCPU i's at this path with `.i`
    /// appended) instead of stdout.
    #[arg(long)]
    console: Option<PathBuf>,
    /// End with what the guest and devices did as one JSON line on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: RunArgs) -> Result<(), String> {
    let config = a.vm.config()?;
    if config.fill && a.backing != ferry_engine::vmm::Backing::Memfd {
        return Err(
            "--vhost needs --backing memfd: the backend maps guest memory by its memfd".into(),
        );
    }
    let outs = consoles(a.console.as_deref(), config.vcpus)?;
    let linux = config.linux.is_some();
    let mut vm = MiniVm::boot(config, a.backing, outs.clone()).map_err(|e| e.to_string())?;
    vm.start().map_err(|e| e.to_string())?;
    if linux {
        return run_linux(vm, &a, &outs);
    }
    std::thread::sleep(Duration::from_secs_f64(a.seconds.max(0.0)));
    vm.pause().map_err(|e| e.to_string())?;
    flush(&outs);
    vm.check_health().map_err(|e| e.to_string())?;
    let c = probe::counters(&vm).map_err(|e| format!("reading the guest's counters: {e}"))?;
    eprintln!(
        "minivmm: {} vCPUs, notify by {}, ran {:.1} s: {} console lines, {} disk writes ({:.0}/s), {} reads verified, {} bad reads, {} failed requests; {} notifications exited to a vCPU thread",
        vm.vcpus(),
        vm.config().notify,
        a.seconds,
        c.console_lines,
        c.writes,
        c.writes as f64 / a.seconds.max(1e-9),
        c.reads_verified,
        c.bad_reads,
        c.status_errors,
        vm.notify_exits()
    );
    if a.json {
        println!(
            "{}",
            super::merge(
                serde_json::json!({ "seconds": a.seconds }),
                super::vm_report(&vm)?
            )
        );
    }
    if c.bad_reads + c.status_errors > 0 {
        return Err("the guest found bad disk reads or failed requests".into());
    }
    Ok(())
}

/// A Linux guest runs until it powers off (or `--seconds` pass, or a
/// vCPU stops): its own checks are on its console.
fn run_linux(
    mut vm: MiniVm,
    a: &RunArgs,
    outs: &[minivmm::serial::ConsoleOut],
) -> Result<(), String> {
    let start = std::time::Instant::now();
    let limit = Duration::from_secs_f64(a.seconds.max(0.0));
    let exit = super::linux_run::run_until_exit(&vm, a.console.as_deref(), limit);
    let _ = vm.pause();
    flush(outs);
    let exit = exit?;
    let took = start.elapsed().as_secs_f64();
    let name = super::linux_run::exit_name(exit);
    eprintln!(
        "minivmm: the Linux guest ran {took:.1} s and {}",
        name.as_deref().unwrap_or("was still running")
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "guest": "linux", "seconds": took, "guest_exit": name })
        );
    }
    match exit {
        Some(minivmm::linux::PowerRequest::Off) => Ok(()),
        Some(other) => Err(format!("the guest asked for {other:?}, not a power-off")),
        None => Err(format!(
            "the guest did not power off within {} s",
            a.seconds
        )),
    }
}
