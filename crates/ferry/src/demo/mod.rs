//! `ferry demo`'s run: the source VM booted here, a destination `ferry
//! receive` started beside it ([`destination`]), throwaway TLS material
//! when asked ([`certs`]), the migration between them with the prediction
//! first, and the verdict, in which a guest that fails at the destination
//! fails the demo however well the memory moved. `ferry demo` gives it its
//! flags as a [`Demo`]. `ferry demo --snapshot` is [`snapshot`]'s.

mod certs;
mod destination;
pub mod snapshot;

use crate::args::BackendArgs;
use crate::driver::{boot_and_migrate, check_policy, finish, MigrationArgs};
use crate::error::CmdError;
use crate::netns::{LinkShape, NetnsPair, DEST_ADDR};
use crate::vms;
use ferry_harness::child::wait_for;
use ferry_memstress::VmConfig;
use ferry_vm::error_chain as chain;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// One demo, its flags translated.
pub struct Demo<'a> {
    /// The guest, admitted on this host.
    pub config: VmConfig,
    /// The source's backend.
    pub backend: &'a BackendArgs,
    /// The migration's flags.
    pub migration: MigrationArgs,
    /// Seconds the destination runs the guest after switchover.
    pub run_after: f64,
    /// Every connection over mutual TLS.
    pub tls: bool,
    /// Two network namespaces, their link shaped so.
    pub netns: Option<LinkShape>,
    /// The --netns link's rate in MiB/s, if shaped.
    pub link_rate: Option<u64>,
    /// Also write the migration as an HTML page here.
    pub report: Option<&'a Path>,
    /// The destination's own flags, as `ferry receive` takes them (its
    /// listening address and TLS directory are the demo's to add).
    pub receive_args: Vec<String>,
}

/// Runs the demo `d`.
pub fn run(d: Demo) -> Result<ExitCode, CmdError> {
    let mut a = d;
    let config = &a.config;
    // The demo shows what to expect before it starts.
    a.migration.predict = true;
    let _certs = if a.tls && a.migration.tls_dir.is_none() {
        let names = if a.netns.is_some() {
            vec![DEST_ADDR.to_string()]
        } else {
            vec![]
        };
        let certs = certs::DemoCerts::write(&names)?;
        a.migration.tls_dir = Some(certs.0.clone());
        Some(certs)
    } else {
        None
    };
    let (opts, tls) = a.migration.options()?;
    // The source VM first: a policy its backend cannot serve is refused
    // before a destination process exists.
    let mut vm = vms::create(a.backend.kind(), config, a.backend, vms::Role::Source)?;
    check_policy(&mut *vm, opts.converge)?;
    a.migration.link_bytes_per_sec = a.link_rate.map(|r| r << 20);
    let netns = match a.netns {
        Some(shape) => Some(NetnsPair::create(shape).map_err(|e| CmdError::Failed(chain(&e)))?),
        None => None,
    };
    let mut dest = destination::spawn(
        &a.receive_args,
        a.migration.tls_dir.as_deref(),
        netns.as_ref(),
    )?;
    let (addr, dest_out) = destination::read_listen_address_of(&mut dest)?;
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
    let (after, guest_error) = destination::add_destination_checks(&mut summary, dest_out);
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
    if let Some(path) = a.report {
        crate::report::write(path, &summary, &after)?;
        if !a.migration.json {
            eprintln!("ferry demo: wrote {}", path.display());
        }
    }
    Ok(finish(&mut *vm, &summary, &after, a.migration.json))
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
