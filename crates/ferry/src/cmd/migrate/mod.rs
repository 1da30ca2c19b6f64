//! `ferry migrate`: boot a source VM, let the guest warm up, and migrate it to
//! a `ferry receive` listening elsewhere ([`crate::driver`] runs it); or
//! hand a same-host upgrade its memory files ([`local`]); or ask a `ferry
//! run --control` to migrate the VM it runs ([`control`]).

mod control;
mod local;

use crate::args::{BackendArgs, WorkloadArgs};
use crate::driver::{boot_and_migrate, finish, MigrationArgs};
use crate::error::CmdError;
use crate::vms;
use clap::Args;
use std::process::ExitCode;

/// Arguments of `ferry migrate`.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// Where the destination listens (`ferry receive --listen ...`):
    /// HOST:PORT (TCP; `tcp:` may precede it), `unix:PATH` (a UNIX
    /// socket), or `fd:N,M,...` (connected sockets this process inherited:
    /// the main channel, then one per --connections, then one more where
    /// the mode may switch to postcopy).
    #[arg(
        long,
        required_unless_present = "local",
        default_value = "",
        hide_default_value = true
    )]
    pub to: String,
    /// Same-host live upgrade: hand the guest memory's files to the `ferry
    /// receive --local` on this UNIX socket instead of copying the memory
    /// (needs `--backing memfd`).
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["to", "control"])]
    pub local: Option<std::path::PathBuf>,
    /// Migrate the VM of a `ferry run --control PATH` instead of booting one.
    #[arg(long)]
    pub control: Option<std::path::PathBuf>,
    /// With --control: resume the VM's postcopy whose automatic recovery
    /// ran out of time (its source is paused with every page), to --to.
    /// The destination must still be waiting (its --recover-timeout).
    #[arg(long, requires = "control")]
    pub resume: bool,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub migration: MigrationArgs,
}

pub fn run(a: MigrateArgs) -> Result<ExitCode, CmdError> {
    if let Some(socket) = &a.local {
        return local::migrate(&a, socket);
    }
    check_address(&a.to)?;
    if let Some(path) = &a.control {
        if a.migration.predict {
            return Err(CmdError::Usage(
                "--predict samples a VM this command boots; with --control it is not available yet"
                    .into(),
            ));
        }
        if a.resume {
            return control::resume(path, &a);
        }
        return control::migrate(path, &a);
    }
    let (opts, tls) = a.migration.options()?;
    let workload = a.workload.workload().map_err(CmdError::Usage)?;
    let config = a.backend.config(workload);
    let mut vm = vms::create(a.backend.kind(), &config, &a.backend, vms::Role::Source)?;
    let summary = boot_and_migrate(&mut *vm, &a.to, &a.migration, opts, tls)?;
    Ok(finish(
        &mut *vm,
        &summary,
        &Default::default(),
        a.migration.json,
    ))
}

/// Refuses a destination that cannot be reached before any VM is booted:
/// a TCP name that does not resolve, a malformed `unix:` or `fd:`.
fn check_address(to: &str) -> Result<(), CmdError> {
    use crate::endpoint::Endpoint;
    use std::net::ToSocketAddrs;
    let to = match to.parse::<Endpoint>().map_err(CmdError::Usage)? {
        Endpoint::Tcp(addr) => addr,
        Endpoint::Unix(_) | Endpoint::Fds(_) => return Ok(()),
    };
    let to = to.as_str();
    match to.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(CmdError::Usage(format!(
            "--to {to}: the name has no address"
        ))),
        Err(e) => Err(CmdError::Usage(format!(
            "--to {to}: not a destination address (expected HOST:PORT): {e}"
        ))),
    }
}
