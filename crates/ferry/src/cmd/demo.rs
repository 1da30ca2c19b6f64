//! `ferry demo`: the main job in one command. Boots a busy 2-vCPU, 1 GiB guest,
//! starts a destination `ferry receive` process on this machine, migrates over
//! loopback with a progress bar, and prints the summary.

use crate::args::{BackendArgs, PagingArgs, WorkloadArgs};
use crate::driver::{boot_and_migrate, check_policy, finish, MigrationArgs};
use crate::error::CmdError;
use crate::netns::{LinkShape, NetnsPair, DEST_ADDR};
use crate::vms;
use clap::Args;
use ferry_harness::child::{read_listen_address, wait_for, ListenError};
use ferry_harness::output::last_json;
use ferry_vm::error_chain as chain;
use std::io::{BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

/// Arguments of `ferry demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub migration: MigrationArgs,
    /// Seconds the destination runs the guest after switchover before reporting.
    #[arg(long = "run-after", default_value_t = 1.0)]
    pub run_after: f64,
    /// For tests: the destination breaks the guest's code once it resumes
    /// (`ferry receive --break-guest-after-resume`).
    #[arg(long = "break-dest-guest", hide = true)]
    pub break_dest_guest: bool,
    /// Let the guest write as fast as it can: the default. An uncapped
    /// write-heavy guest dirties memory faster than loopback can send it, and
    /// the demo shows the convergence policy (--converge) bringing it home.
    /// Give --rate-limit to cap the guest instead.
    #[arg(long, conflicts_with = "rate_limit_mib_s")]
    pub unthrottled: bool,
    /// The destination's placement and postcopy paging, as `ferry receive`
    /// takes them.
    #[command(flatten)]
    pub paging: PagingArgs,
    /// Run every connection over mutual TLS, with a throwaway CA and
    /// certificate written for this run (or the ones in --tls-dir).
    #[arg(long)]
    pub tls: bool,
    /// Two hosts on one machine: run the source and the destination in
    /// network namespaces of their own, joined by a veth pair (needs root
    /// and iproute2). Both are deleted when the demo ends.
    #[arg(long)]
    pub netns: bool,
    /// Shape the --netns link to this many MiB/s (tc tbf, both ways). Unlike
    /// --bandwidth, which caps the engine, this is the link: the engine
    /// measures it. Default: as fast as veth goes.
    #[arg(long = "link-rate", value_name = "MIB_S", requires = "netns", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub link_rate: Option<u64>,
    /// Also write this migration as a self-contained HTML page to FILE: the
    /// verdicts (digest, the guest's checks, the pause against its
    /// prediction), a timeline with one unit per panel, each round, each
    /// throttle change and the prediction. Its JSON goes beside it (FILE
    /// with .json). The page needs no network: open it from the file.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// One-way delay of the --netns link in ms (tc netem, both ways).
    #[arg(long = "link-delay-ms", value_name = "MS", requires = "netns", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub link_delay_ms: Option<u64>,
}

/// Throwaway TLS material for one demo, removed when the demo ends.
struct DemoCerts(PathBuf);

impl DemoCerts {
    fn write(names: &[String]) -> Result<Self, CmdError> {
        let dir = std::env::temp_dir().join(format!("ferry-demo-tls-{}", std::process::id()));
        // A leftover of an earlier demo with this pid is ours to replace.
        let _ = std::fs::remove_dir_all(&dir);
        ferry_engine::transport::tls::pki::write_throwaway(&dir, names)
            .map_err(|e| CmdError::Failed(chain(&e)))?;
        Ok(DemoCerts(dir))
    }
}

impl Drop for DemoCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Kills the destination process if the demo ends early.
struct Destination(Child);

impl Drop for Destination {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn run(a: DemoArgs) -> Result<ExitCode, CmdError> {
    let workload = a.workload.workload().map_err(CmdError::Usage)?;
    let config = a.backend.config(workload);
    // Refuse a guest this host cannot hold before starting anything.
    config.admit().map_err(ferry_vm::VmError::from)?;
    let mut a = a;
    // The demo shows what to expect before it starts.
    a.migration.predict = true;
    let _certs = if a.tls && a.migration.tls_dir.is_none() {
        let names = if a.netns {
            vec![DEST_ADDR.to_string()]
        } else {
            vec![]
        };
        let certs = DemoCerts::write(&names)?;
        a.migration.tls_dir = Some(certs.0.clone());
        Some(certs)
    } else {
        None
    };
    let (opts, tls) = a.migration.options()?;
    // The source VM first: a policy its backend cannot serve is refused
    // before a destination process exists.
    let mut vm = vms::create(a.backend.kind(), &config, &a.backend, vms::Role::Source)?;
    check_policy(&mut *vm, opts.converge)?;
    a.migration.link_bytes_per_sec = a.link_rate.map(|r| r << 20);
    let netns = if a.netns {
        let shape = LinkShape {
            rate_bytes_per_sec: a.link_rate.map(|r| r << 20),
            delay: a.link_delay_ms.map(Duration::from_millis),
        };
        Some(NetnsPair::create(shape).map_err(|e| CmdError::Failed(chain(&e)))?)
    } else {
        None
    };
    let mut dest = spawn_destination(&a, netns.as_ref())?;
    let (addr, dest_out) = read_listen_address_of(&mut dest)?;
    if let Some(pair) = &netns {
        // The migration's threads start from this one: all in the source's
        // namespace.
        pair.enter_source()
            .map_err(|e| CmdError::Failed(chain(&e)))?;
    }
    if !a.migration.json {
        eprintln!(
            "ferry demo: {} vCPUs x {} MiB ({}), {} backend, {} dirty tracking; destination pid {} on {addr}",
            config.workload.vcpus,
            config.workload.bytes_per_vcpu >> 20,
            mix(&config.workload),
            a.backend.kind(),
            a.backend.tracking().map_err(CmdError::Usage)?.name(),
            dest.0.id()
        );
    }
    let mut summary = boot_and_migrate(&mut *vm, &addr, &a.migration, opts, tls)?;
    // A destination that got no migration (the source failed before it
    // connected) would wait for ever: give it the stall timeout to finish
    // reporting, then stop it. One that got the guest runs it until every
    // vCPU has completed a pass there (see `guest_check`) before it reports.
    let mut grace = Duration::from_secs(a.migration.stall_timeout_s + 5);
    if summary.status == ferry_engine::Outcome::Completed {
        grace += crate::guest_check::MAX_RUN_AFTER
            + Duration::try_from_secs_f64(a.run_after).unwrap_or_default();
        eprintln!(
            "ferry demo: switched over; the destination runs the guest for {} s, then reports",
            a.run_after
        );
    }
    let exited = wait_for(&mut dest.0, grace);
    if exited.is_none() {
        let _ = dest.0.kill();
        let _ = dest.0.wait();
    }
    let guest_error = add_destination_checks(&mut summary, dest_out);
    // A guest that dies at the destination is a failed migration, however
    // well the memory moved.
    let failure = match (exited, guest_error) {
        (_, Some(e)) => Some(format!(
            "the guest failed at the destination after switchover: {e}"
        )),
        (Some(status), None) if !status.success() => {
            Some(format!("the destination exited with {status}"))
        }
        (Some(_), None) => None,
        (None, None) => Some(format!(
            "the destination was still running {} s after the migration ended; stopped it",
            grace.as_secs()
        )),
    };
    if let Some(failure) = failure {
        eprintln!("ferry demo: {failure}");
        summary.error.get_or_insert(failure);
    }
    if let Some(path) = &a.report {
        crate::report::write(path, &summary)?;
        if !a.migration.json {
            eprintln!("ferry demo: wrote {}", path.display());
        }
    }
    Ok(finish(&mut *vm, &summary, a.migration.json))
}

/// Adds what the destination's guest counted after the switchover (the last
/// line `ferry receive --json` printed) to the source's summary: the engine
/// returns at the commit, and only the destination ran the guest after it.
/// Returns what the destination said became of the guest, if it failed.
fn add_destination_checks(
    summary: &mut ferry_engine::MigrationSummary,
    mut out: impl Read,
) -> Option<String> {
    let mut text = String::new();
    let _ = out.read_to_string(&mut text);
    let j = last_json(&text)?;
    summary.dest_passes_after = j["passes_after"].as_u64();
    summary.mismatches_after = j["mismatches_after"].as_u64();
    if let (Some(before), Some(after)) = (summary.mismatches_before, summary.mismatches_after) {
        summary.guest_mismatches = Some(before.saturating_add(after));
    }
    j["guest_error"].as_str().map(str::to_string)
}

/// Each vCPU's write share and rate, grouped: "100% writes, 1 reader;
/// 200 MiB/s per vCPU".
fn mix(w: &ferry_memstress::Workload) -> String {
    let per = |f: &dyn Fn(u32) -> String| {
        let all: Vec<String> = (0..w.vcpus).map(f).collect();
        if all.iter().all(|x| *x == all[0]) {
            all[0].clone()
        } else {
            all.join("/")
        }
    };
    let writes = per(&|v| w.vcpu_write_percent(v).to_string());
    let rates = per(&|v| {
        w.vcpu_rate_limit_mib_s(v)
            .map_or("max".into(), |r| r.to_string())
    });
    format!("{writes}% writes, {rates} MiB/s per vCPU")
}

fn spawn_destination(a: &DemoArgs, netns: Option<&NetnsPair>) -> Result<Destination, CmdError> {
    let exe = std::env::current_exe()
        .map_err(|e| CmdError::Failed(format!("cannot find the ferry executable: {e}")))?;
    let mut cmd = Command::new(exe);
    crate::child::die_with_parent(&mut cmd);
    let listen = match netns {
        Some(pair) => {
            pair.run_in_dest(&mut cmd)
                .map_err(|e| CmdError::Failed(chain(&e)))?;
            format!("{DEST_ADDR}:0")
        }
        None => "127.0.0.1:0".to_string(),
    };
    cmd.args([
        "receive",
        "--listen",
        &listen,
        "--exit-after-report",
        "--json",
    ])
    .args(["--backend", &a.backend.kind().to_string()])
    .args(["--backing", &a.backend.backing])
    .args(["--run-after", &a.run_after.to_string()])
    .args(["--stall-timeout", &a.migration.stall_timeout_s.to_string()])
    .args(a.paging.receive_args())
    .args([
        "--recover-timeout",
        &a.migration.recover_timeout_s.to_string(),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    if a.migration.verify_before_resume {
        cmd.arg("--verify-before-resume");
    }
    if a.break_dest_guest {
        cmd.arg("--break-guest-after-resume");
    }
    if let Some(dir) = &a.migration.tls_dir {
        cmd.arg("--tls-dir").arg(dir);
    }
    let child = cmd
        .spawn()
        .map_err(|e| CmdError::Failed(format!("cannot start the destination process: {e}")))?;
    Ok(Destination(child))
}

/// Reads `listening on ADDR` from the destination's stdout; returns the
/// address and the rest of its stdout.
fn read_listen_address_of(
    dest: &mut Destination,
) -> Result<(String, BufReader<std::process::ChildStdout>), CmdError> {
    let stdout = dest
        .0
        .stdout
        .take()
        .ok_or_else(|| CmdError::Failed("destination stdout is not piped".into()))?;
    let mut out = BufReader::new(stdout);
    match read_listen_address(&mut out) {
        Ok(addr) => Ok((addr, out)),
        Err(ListenError::Read(e)) => Err(CmdError::Failed(format!(
            "reading the destination's address: {e}"
        ))),
        Err(ListenError::Said(line)) => Err(CmdError::Failed(format!(
            "the destination did not start (it said {line:?})"
        ))),
    }
}
