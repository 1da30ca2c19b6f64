//! `--tls-dir`: the mutual TLS material a migration's connections use,
//! loaded before anything starts so that a bad directory is refused up
//! front. `ferry migrate`, `ferry receive` and the control socket's
//! `migrate` all load it here.

use crate::error::CmdError;
use ferry_engine::TlsConfig;
use ferry_vm::error_chain as chain;

/// Loads `--tls-dir`, if given.
pub fn load_tls(dir: Option<&std::path::Path>) -> Result<Option<TlsConfig>, CmdError> {
    dir.map(|d| {
        TlsConfig::load(d).map_err(|e| CmdError::Usage(format!("--tls-dir: {}", chain(&e))))
    })
    .transpose()
}
