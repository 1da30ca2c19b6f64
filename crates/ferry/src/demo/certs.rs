//! `ferry demo --tls` without `--tls-dir`: a throwaway CA and certificate
//! for one demo, written to a directory of its own and removed with it, so
//! that no demo leaves keys behind.

use crate::error::CmdError;
use ferry_vm::error_chain as chain;
use std::path::PathBuf;

/// Throwaway TLS material for one demo, removed when the demo ends.
pub struct DemoCerts(pub PathBuf);

impl DemoCerts {
    pub fn write(names: &[String]) -> Result<Self, CmdError> {
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
