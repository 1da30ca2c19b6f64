//! `ferry migrate --local SOCKET`: same-host live upgrade through the
//! engine's `local` module. The source's memory must be on memfd
//! (`--backing memfd`); the destination maps the same files.

use super::MigrateArgs;
use crate::driver::{local, source_still_runs};
use crate::error::CmdError;
use crate::vms;
use ferry_engine::local::migrate_local;
use ferry_vm::{error_chain as chain, Backing};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// `ferry migrate --local SOCKET`.
pub fn migrate(a: &MigrateArgs, socket: &Path) -> Result<ExitCode, CmdError> {
    let workload = a.workload.workload().map_err(CmdError::Usage)?;
    let config = a.backend.config(workload);
    if config.backing != Backing::Memfd {
        // Refused before the VM boots, in the engine's words.
        return Err(CmdError::Usage(
            ferry_engine::error::LocalError::NotFileBacked.to_string(),
        ));
    }
    let mut vm = vms::create(a.backend.kind(), &config, &a.backend, vms::Role::Source)?;
    vm.start()?;
    std::thread::sleep(Duration::from_secs_f64(
        a.migration.warmup.clamp(0.0, 3600.0),
    ));
    match migrate_local(&mut *vm, socket, &local::options()) {
        Ok(s) => {
            local::report(&s, a.migration.json);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let running = vm.is_running();
            eprintln!(
                "ferry: the same-host migration failed: {}; the VM {}",
                chain(&e),
                if running {
                    "runs on here"
                } else {
                    "is paused here (see above)"
                }
            );
            if running {
                println!("{}", source_still_runs(&*vm).0);
            }
            Ok(ExitCode::from(1))
        }
    }
}
