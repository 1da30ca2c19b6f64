//! `minivmm receive`: wait for a migrated VM, run it on, report.

use super::vcpu_trace::VcpuTrace;
use super::{consoles, flush, merge, parse_backing, status_name, vm_report};
use ferry_engine::local::{await_local, listen_local, receive_local_as, LocalOptions};
use ferry_engine::precopy::Placement;
use ferry_engine::snapshot::{self, RestoreMode, RestoreOptions};
use ferry_engine::transport::{Listen, TlsConfig};
use ferry_engine::vmm::{receive_as, Backing, GuestRam, StreamHeader, Vm, VmError};
use ferry_engine::{await_migration, listen, ReceiveOptions};
use minivmm::layout::MAX_VCPUS;
use minivmm::linux::PowerRequest;
use minivmm::probe::{self, MiniProbe};
use minivmm::serial::ConsoleOut;
use minivmm::vm::disk_fd_name;
use minivmm::{MiniConfig, MiniVm, VMM_ID};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ReceiveArgs {
    /// Where to listen (`127.0.0.1:0` picks a port; the first stdout line
    /// says which, as `{"listening": ADDR}`).
    #[arg(long, required_unless_present_any = ["local", "from_snapshot"])]
    listen: Option<String>,
    /// Restore the VM from this snapshot file (`minivmm migrate
    /// --snapshot FILE`) instead of receiving a migration, and run it on.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["listen", "local", "tls"])]
    from_snapshot: Option<PathBuf>,
    /// With --from-snapshot: how its pages come in: eager, lazy, or
    /// lazy-working-set (the pages the guest wrote last, first).
    #[arg(long, default_value = "lazy-working-set")]
    restore: RestoreMode,
    /// Same-host live upgrade: take the VM from a `minivmm migrate --local`
    /// on this UNIX socket, mapping its memory instead of copying it.
    #[arg(long, conflicts_with_all = ["listen", "tls"])]
    local: Option<PathBuf>,
    /// Mutual TLS with the ca.pem, cert.pem and key.pem in this directory.
    #[arg(long)]
    tls: Option<PathBuf>,
    /// How long the guest runs here once it has arrived.
    #[arg(long, default_value_t = 1000)]
    run_after_ms: u64,
    /// A Linux guest is told `moved` on its console once it has arrived,
    /// and runs until it powers off: at most this long.
    #[arg(long, default_value_t = 600)]
    linux_run_limit_s: u64,
    /// Guest memory: anon or memfd.
    #[arg(long, default_value = "anon", value_parser = parse_backing)]
    backing: Backing,
    /// Write vCPU 0's console here (vCPU i's at this path with `.i`
    /// appended) instead of stdout.
    #[arg(long)]
    console: Option<PathBuf>,
    /// Sample each vCPU's run statistics (time in KVM_RUN and on a CPU,
    /// waits for one, KVM's own counters) every 100 ms from the VM's
    /// arrival to the end, as JSON lines in this file (as `minivmm
    /// migrate --vcpu-trace` writes them).
    #[arg(long)]
    vcpu_trace: Option<PathBuf>,
    /// End with the summary as one JSON line on stdout.
    #[arg(long)]
    json: bool,
    /// Testing: exit as the vCPU state arrives, as a destination that
    /// crashes before it resumes.
    #[arg(long, hide = true)]
    crash_on_restore: bool,
    /// Measuring: hold no outputs, so that a strict switchover keeps the
    /// guest paused until the digest's verdict (the baseline of the
    /// held-outputs capability).
    #[arg(long, hide = true)]
    no_output_gate: bool,
    /// Measuring: how received pages land in guest memory (auto, uffd,
    /// write; `ferry receive --placement` says what each does).
    #[arg(long, hide = true, default_value = "auto")]
    placement: Placement,
    /// Offer a migrating guest a CPU without these features (comma
    /// separated, as /proc/cpuinfo names them: `avx2,avx512f`), as a fleet's
    /// baseline CPU model does: a guest that was given one of them is
    /// refused before any memory moves, naming it.
    #[arg(long = "cpu-without", value_delimiter = ',', value_name = "FEATURES")]
    cpu_without: Vec<String>,
}

pub fn receive(a: ReceiveArgs) -> Result<(), String> {
    // A name the CPU check does not know is refused before anything waits.
    ferry_kvm::cpu_check::HostCpu::from_parts(&[], Vec::new())
        .without(&a.cpu_without)
        .map_err(|e| format!("--cpu-without: {e}"))?;
    let console = a.console.clone();
    let outs = std::sync::Mutex::new(Vec::new());
    // The consoles are made once the header says how many vCPUs come.
    let make_consoles = |config: &MiniConfig| -> Result<Vec<ConsoleOut>, VmError> {
        let made = consoles(console.as_deref(), config.vcpus).map_err(VmError::Guest)?;
        *outs.lock().unwrap_or_else(|e| e.into_inner()) = made.clone();
        Ok(made)
    };
    let arrived = match (&a.local, &a.from_snapshot) {
        (Some(path), _) => local(path, &make_consoles, a.crash_on_restore)?,
        (None, Some(file)) => from_snapshot(&a, file, &make_consoles)?,
        (None, None) => over_the_network(&a, &make_consoles)?,
    };
    let Arrived {
        mut vm,
        status,
        digest_match,
        summary,
        trace: _trace,
    } = arrived;
    let linux = vm.config().linux.is_some();
    let (mut guest_exit, mut failed) = (None, None);
    if status == "completed" && linux {
        // The checker runs on for a while once told, then powers off.
        vm.console_input(0, b"moved\n").map_err(|e| e.to_string())?;
        let limit = Duration::from_secs(a.linux_run_limit_s);
        match super::linux_run::run_until_exit(&vm, a.console.as_deref(), limit) {
            Ok(exit) => guest_exit = exit,
            Err(e) => failed = Some(e),
        }
    } else if status == "completed" {
        std::thread::sleep(Duration::from_millis(a.run_after_ms));
    }
    let health = failed.or_else(|| vm.check_health().err().map(|e| e.to_string()));
    let in_flight = vm.requests_in_flight_at_pause();
    vm.pause().map_err(|e| e.to_string())?;
    flush(&outs.lock().unwrap_or_else(|e| e.into_inner()));
    let exit_name = super::linux_run::exit_name(guest_exit);
    if linux {
        eprintln!(
            "minivmm: received ({status}), digest {}; the Linux guest then {}",
            if digest_match { "match" } else { "MISMATCH" },
            exit_name.as_deref().unwrap_or("did not power off")
        );
    } else {
        let guest =
            probe::counters(&vm).map_err(|e| format!("reading the guest's counters: {e}"))?;
        eprintln!(
            "minivmm: received ({status}), digest {}; then {} console lines and {} verified reads in all",
            if digest_match { "match" } else { "MISMATCH" },
            guest.console_lines,
            guest.reads_verified
        );
    }
    if a.json {
        let j = serde_json::json!({
            "role": "destination",
            "status": status,
            "digest_match": digest_match,
            "health": health,
            "guest_exit": exit_name,
            "summary": summary,
        });
        let mut j = merge(j, vm_report(&vm)?);
        j["requests_in_flight_at_pause"] = in_flight.into();
        println!("{j}");
    }
    match health {
        Some(h) => Err(format!("the guest failed here: {h}")),
        None if linux && status == "completed" && guest_exit != Some(PowerRequest::Off) => {
            Err(format!(
                "the Linux guest did not power off within {} s of the move",
                a.linux_run_limit_s
            ))
        }
        None => Ok(()),
    }
}

/// The VM that arrived, and how.
struct Arrived {
    vm: MiniVm,
    status: String,
    digest_match: bool,
    summary: serde_json::Value,
    /// `--vcpu-trace`'s sampler, from the VM's arrival to the end.
    trace: Option<VcpuTrace>,
}

/// The VM's configuration from the header, if it is a minivmm VM.
fn config_of(h: &StreamHeader) -> Result<MiniConfig, VmError> {
    if h.vmm != VMM_ID {
        return Err(VmError::Guest(format!("minivmm cannot run a {} VM", h.vmm)));
    }
    serde_json::from_value(h.vmm_config.clone())
        .map_err(|e| VmError::Guest(format!("not a minivmm configuration: {e}")))
}

/// The VM a migration's or a snapshot's header describes, built to take
/// its state, as `a` asks.
fn incoming_vm(
    a: &ReceiveArgs,
    h: &StreamHeader,
    make_consoles: &MakeConsoles,
) -> Result<MiniVm, VmError> {
    let config = config_of(h)?;
    let outs = make_consoles(&config)?;
    // The fill device's backend maps guest memory by its memfds.
    let backing = if config.fill {
        Backing::Memfd
    } else {
        a.backing
    };
    let mut vm = MiniVm::incoming(config, backing, outs)?;
    vm.crash_on_restore = a.crash_on_restore;
    vm.no_output_gate = a.no_output_gate;
    vm.cpu_without = a.cpu_without.clone();
    Ok(vm)
}

fn announce(at: &str) {
    println!("{}", serde_json::json!({ "listening": at }));
    eprintln!("minivmm: waiting for a migration on {at}");
}

/// Builds the consoles for the VM a header describes.
type MakeConsoles<'a> = dyn Fn(&MiniConfig) -> Result<Vec<ConsoleOut>, VmError> + 'a;

fn over_the_network(a: &ReceiveArgs, make_consoles: &MakeConsoles) -> Result<Arrived, String> {
    let addr = a.listen.as_deref().unwrap_or_default();
    let tcp = listen(addr).map_err(|e| e.to_string())?;
    let addr = tcp.local_addr().map_err(|e| e.to_string())?;
    let listener: Box<dyn Listen> = match &a.tls {
        Some(dir) => Box::new(
            TlsConfig::load(dir)
                .map_err(|e| e.to_string())?
                .listener(tcp),
        ),
        None => Box::new(tcp),
    };
    announce(&addr.to_string());
    let incoming = await_migration(&*listener, None).map_err(|e| e.to_string())?;
    let mut trace = None;
    let mut factory = |h: &StreamHeader| {
        let vm = incoming_vm(a, h, make_consoles)?;
        if let Some(path) = &a.vcpu_trace {
            trace = Some(VcpuTrace::start(path, vm.run_probes()).map_err(VmError::Guest)?);
        }
        Ok(vm)
    };
    let opts = {
        let mut o = ReceiveOptions::default();
        o.probe = Some(Arc::new(MiniProbe));
        o.placement = a.placement;
        o
    };
    let (vm, summary) = receive_as(incoming, &*listener, &mut factory, &opts)
        .map_err(|e| ferry_engine::vmm::error_chain(&e))?;
    Ok(Arrived {
        vm,
        status: status_name(summary.status),
        digest_match: summary.digest_match,
        summary: serde_json::to_value(&summary).unwrap_or_default(),
        trace,
    })
}

/// The VM a snapshot file holds, restored as `--restore` says and running;
/// once every page is in, the digest of what was placed is the snapshot's.
fn from_snapshot(
    a: &ReceiveArgs,
    file: &Path,
    make_consoles: &MakeConsoles,
) -> Result<Arrived, String> {
    eprintln!(
        "minivmm: restoring {} ({})",
        file.display(),
        a.restore.name()
    );
    let mut factory = |h: &StreamHeader| incoming_vm(a, h, make_consoles);
    let mut opts = RestoreOptions::default();
    opts.mode = a.restore;
    let (mut vm, restoring) = snapshot::restore_as(file, &mut factory, &opts)
        .map_err(|e| ferry_engine::vmm::error_chain(&e))?;
    // The guest runs while the rest of its pages come in; a damaged page
    // stops it, naming the page.
    let summary = restoring
        .finish(&mut vm)
        .map_err(|e| ferry_engine::vmm::error_chain(&e))?;
    eprintln!(
        "minivmm: restored {} in {:.0} ms to the first instruction, all pages in at {:.0} ms \
         ({} faults held a vCPU), digest {}",
        summary.mode,
        summary.first_instruction_ms,
        summary.resident_ms,
        summary.blocking_faults,
        if summary.digest_match {
            "match"
        } else {
            "not compared"
        }
    );
    Ok(Arrived {
        vm,
        status: "completed".into(),
        digest_match: summary.digest_match,
        summary: serde_json::to_value(&summary).unwrap_or_default(),
        trace: None,
    })
}

fn local(
    path: &Path,
    make_consoles: &MakeConsoles,
    crash_on_restore: bool,
) -> Result<Arrived, String> {
    let listener = listen_local(path).map_err(|e| e.to_string())?;
    announce(&path.display().to_string());
    let opts = {
        let mut o = LocalOptions::default();
        o.probe = Some(Arc::new(MiniProbe));
        o
    };
    let mut incoming = await_local(&listener, &opts).map_err(|e| e.to_string())?;
    // The source's disks, adopted rather than reopened: their paths may be
    // gone (an upgrade that replaced the images), the files are not.
    let mut handed = incoming.take_handed_fds();
    let mut disks: Vec<Option<std::fs::File>> = (0..MAX_VCPUS)
        .map(|i| match handed.take(&disk_fd_name(i)) {
            Ok(fd) => Some(std::fs::File::from(fd)),
            Err(e) => {
                if i == 0 {
                    eprintln!("minivmm: {e}; opening the disks by their paths");
                }
                None
            }
        })
        .collect();
    let mut factory = |h: &StreamHeader, ram: GuestRam| -> Result<MiniVm, VmError> {
        let config = config_of(h)?;
        let outs = make_consoles(&config)?;
        disks.truncate(config.vcpus as usize);
        let mut vm = MiniVm::on_ram(config, ram, outs, std::mem::take(&mut disks))?;
        vm.crash_on_restore = crash_on_restore;
        Ok(vm)
    };
    let received = receive_local_as(incoming, &mut factory, &opts);
    let _ = std::fs::remove_file(path);
    let (vm, summary) = received.map_err(|e| ferry_engine::vmm::error_chain(&e))?;
    Ok(Arrived {
        vm,
        status: status_name(summary.status),
        digest_match: summary.digest_match,
        summary: serde_json::to_value(&summary).unwrap_or_default(),
        trace: None,
    })
}
