//! The command line: `run`, `migrate`, `receive`, `demo` and `probe-host`.

mod bench_qemu;
mod demo;
mod demo_linux;
mod guest;
mod line_log;
mod linux_run;
mod migrate;
mod probe;
mod receive;
mod run;
mod stamps;
mod vcpu_trace;

use clap::{Args, Parser, Subcommand};
use ferry_engine::vmm::Backing;
use minivmm::blk::Notify;
use minivmm::layout::{BLOCK_BYTES, DISK_BLOCKS};
use minivmm::serial::{console_path, ConsoleOut};
use minivmm::MiniConfig;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A small VMM built from rust-vmm crates (KVM, 16550 serial ports and
/// virtio-blk over virtio-mmio, served by an I/O thread) that migrates
/// live through ferry's engine. Each vCPU's guest prints numbered console
/// lines on its own port and writes and reads back numbered blocks on its
/// own disk; every migration checks both streams of every vCPU and
/// ferry's memory digest.
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
    /// Benchmarks: `bench qemu`, the same Linux guest moved by ferry and
    /// by QEMU.
    Bench(bench_qemu::BenchArgs),
    /// Try what this host's KVM offers for serving devices off the vCPU
    /// threads (in-kernel irqchip, ioeventfd, irqfd) on a fresh VM.
    ProbeHost(probe::ProbeArgs),
    /// Serve the fill device's vhost-user backend on a socket (what
    /// `minivmm-vhost` runs; minivmm starts it itself for --vhost).
    VhostBackend(VhostBackendArgs),
}

#[derive(Args, Debug)]
struct VhostBackendArgs {
    /// The UNIX socket to listen on.
    #[arg(long)]
    socket: PathBuf,
}

/// Runs the command.
pub fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Migrate(a) => migrate::migrate(a),
        Command::Receive(a) => receive::receive(a),
        Command::Demo(a) => demo::demo(a),
        Command::Bench(a) => bench_qemu::bench(a),
        Command::ProbeHost(a) => probe::probe(a),
        Command::VhostBackend(a) => {
            minivmm::fill::backend::run(&a.socket).map_err(|e| e.to_string())
        }
    }
}

/// The VM's shape, as the source gives it.
#[derive(Args, Debug, Clone)]
struct VmArgs {
    /// vCPUs (1 to 4), each with its own serial port, disk and slice of
    /// the data. More vCPUs than host cores time-share them.
    #[arg(long, default_value_t = 2)]
    vcpus: u32,
    /// How the guest's disk notifications reach the I/O thread: ioeventfd
    /// (KVM signals it, no exit to userspace), exit (the vCPU's exit
    /// handler signals it), or inline (served on the vCPU's own exit, no
    /// I/O thread).
    #[arg(long, default_value = "ioeventfd")]
    notify: Notify,
    /// writethrough: a disk write completes once on storage (fdatasync),
    /// so requests take a disk's time and are in flight while the vCPUs
    /// run; writeback: once in the host's page cache.
    #[arg(long, default_value = "writethrough", value_parser = parse_cache, action = clap::ArgAction::Set)]
    cache: bool,
    /// Add the fill device: a virtio device served by a vhost-user backend
    /// process (minivmm-vhost) that writes guest memory through its own
    /// mapping of it (needs --backing memfd).
    #[arg(long)]
    vhost: bool,
    /// Testing: do not collect the fill backend's writes through the
    /// vhost-user dirty log (the digest must then catch the pages missed).
    #[arg(long, hide = true)]
    no_vhost_dirty_log: bool,
    /// How KVM tracks the guest's writes: ring (each vCPU's dirty ring,
    /// which meters each vCPU, so the migration's default policy is the
    /// seed's per-vCPU quota) or bitmap (one log for the VM: auto-converge
    /// at best). Falls back to bitmap where KVM has no ring.
    #[arg(long, default_value = "ring", value_parser = ["ring", "bitmap"])]
    dirty_log: String,
    /// MiB of the data region the guest sweeps (a multiple of 2).
    #[arg(long, default_value_t = 64)]
    data_mib: u64,
    /// vCPU 0's disk image (created, 256 KiB, if missing); vCPU i's is
    /// this path with `.i` appended. Both ends of a migration open the same
    /// files: shared storage.
    #[arg(long, default_value = "minivmm-disk.img")]
    disk: PathBuf,
    /// Data pages the guest writes per loop (its dirty rate).
    #[arg(long, default_value_t = 4)]
    sweep_pages: u32,
    #[command(flatten)]
    guest: guest::GuestArgs,
}

impl VmArgs {
    fn config(&self) -> Result<MiniConfig, String> {
        let max = minivmm::layout::MAX_VCPUS;
        if !(1..=max).contains(&self.vcpus) {
            return Err(format!(
                "--vcpus {}: minivmm runs 1 to {max} vCPUs, one per COM port",
                self.vcpus
            ));
        }
        // A Linux guest's checker writes its records around 8 MiB.
        let disk_bytes = match self.guest.is_linux() {
            true => LINUX_DISK_BYTES,
            false => DISK_BLOCKS * BLOCK_BYTES,
        };
        ensure_disk(&self.disk, disk_bytes)?;
        let disk = std::fs::canonicalize(&self.disk)
            .map_err(|e| format!("the disk image {}: {e}", self.disk.display()))?;
        let mut config = MiniConfig::new(self.vcpus, self.data_mib, disk);
        config.sweep_per_loop = self.sweep_pages;
        config.notify = self.notify;
        config.writethrough = self.cache;
        config.fill = self.vhost;
        config.fill_dirty_log = !self.no_vhost_dirty_log;
        config.dirty_ring = self.dirty_log == "ring";
        for i in 1..self.vcpus {
            ensure_disk(&config.disk_path(i), disk_bytes)?;
        }
        self.guest.apply(&mut config)?;
        Ok(config)
    }
}

/// Bytes of a Linux guest's disks.
const LINUX_DISK_BYTES: u64 = 8 << 20;

/// Creates the disk image if it is not there, at least `bytes` long.
fn ensure_disk(path: &Path, bytes: u64) -> Result<(), String> {
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

/// Parses `writethrough` (true) or `writeback`.
fn parse_cache(s: &str) -> Result<bool, String> {
    match s {
        "writethrough" => Ok(true),
        "writeback" => Ok(false),
        _ => Err(format!("{s:?}: use writethrough or writeback")),
    }
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

/// The consoles of `vcpus` vCPUs: files (vCPU i's at
/// [`console_path`]), or stdout, each line tagged with its vCPU when there
/// are several.
fn consoles(path: Option<&Path>, vcpus: u32) -> Result<Vec<ConsoleOut>, String> {
    (0..vcpus)
        .map(|i| {
            Ok(match path {
                Some(p) => {
                    let p = console_path(p, i);
                    ConsoleOut::new(Box::new(std::fs::File::create(&p).map_err(|e| {
                        format!("cannot create the console file {}: {e}", p.display())
                    })?))
                }
                None if vcpus == 1 => ConsoleOut::new(Box::new(std::io::stdout())),
                None => ConsoleOut::new(Box::new(Tagged {
                    tag: format!("cpu{i}| "),
                    line: Vec::new(),
                })),
            })
        })
        .collect()
}

/// Stdout, a whole line at a time behind a tag, so that vCPUs' lines do
/// not interleave byte by byte.
struct Tagged {
    tag: String,
    line: Vec<u8>,
}

impl Write for Tagged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            self.line.push(b);
            if b == b'\n' {
                let mut out = std::io::stdout().lock();
                out.write_all(self.tag.as_bytes())?;
                out.write_all(&self.line)?;
                self.line.clear();
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

/// Flushes every console.
fn flush(consoles: &[ConsoleOut]) {
    consoles.iter().for_each(ConsoleOut::flush);
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
        .map(|s| {
            serde_json::json!({
                "name": s.name,
                "version": s.version,
                "instances": s.instances,
                "subsections": s.subsections,
            })
        })
        .collect()
}

/// What both ends report of the VM's devices and guest, in their JSON.
fn vm_report(vm: &minivmm::MiniVm) -> Result<serde_json::Value, String> {
    use ferry_engine::vmm::Vm;
    // A Linux guest's counters are its checker's, on its console; the
    // memory minivmm's own guest keeps them in is the kernel's.
    let (per_vcpu, guest) = match vm.config().linux {
        Some(_) => (serde_json::Value::Null, serde_json::Value::Null),
        None => {
            let per_vcpu = (0..vm.vcpus())
                .map(|i| minivmm::probe::vcpu_counters(vm, i))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("reading the guest's counters: {e}"))?;
            let guest = minivmm::probe::counters(vm)
                .map_err(|e| format!("reading the guest's counters: {e}"))?;
            (serde_json::json!(per_vcpu), serde_json::json!(guest))
        }
    };
    let disk_runs: Vec<Vec<[u64; 2]>> = vm.disk_journals().iter().map(|j| runs(j)).collect();
    Ok(serde_json::json!({
        "vcpus": vm.vcpus(),
        "notify": vm.config().notify,
        "writethrough": vm.config().writethrough,
        "irqchip": vm.config().irqchip,
        "interrupts_raised": vm.interrupts_raised(),
        "vhost": vm.config().fill,
        "vhost_failure": vm.fill_failure(),
        "sections": sections(vm),
        "guest_kind": if vm.config().linux.is_some() { "linux" } else { "program" },
        "guest": guest,
        "guest_per_vcpu": per_vcpu,
        "disk_runs": disk_runs,
        "requests_in_flight_at_pause": vm.requests_in_flight_at_pause(),
        "notify_exits": vm.notify_exits(),
        "throttle_per_vcpu": vm.run_stats().iter().map(run_stats_json).collect::<Vec<_>>(),
    }))
}

/// What the throttle and KVM_RUN did to one vCPU, as the summary and
/// `--vcpu-trace` give it: its throttle sleeps and their sum, the longest
/// it was kept from running at a stretch, its KVM_RUN returns, its time in
/// KVM_RUN, and KVM's own counters (those it counted at all).
fn run_stats_json(r: &minivmm::RunStats) -> serde_json::Value {
    serde_json::json!({
        "sleeps": r.sleeps,
        "slept_ms": r.slept.as_secs_f64() * 1e3,
        "longest_out_of_run_ms": r.longest_out_of_run.as_secs_f64() * 1e3,
        "kvm_run_returns": r.kvm_run_returns,
        "ring_full_exits": r.ring_full_exits,
        "interrupted": r.interrupted,
        "in_run_ms": r.in_run.as_secs_f64() * 1e3,
        "kvm": r.kvm.iter().filter(|(_, &v)| v != 0).collect::<std::collections::BTreeMap<_, _>>(),
    })
}

/// Adds the fields of `extra` to the object `j`.
fn merge(mut j: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(j), serde_json::Value::Object(extra)) = (j.as_object_mut(), extra) {
        j.extend(extra);
    }
    j
}

/// "completed", "failed" or "held".
fn status_name(s: ferry_engine::Outcome) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}
