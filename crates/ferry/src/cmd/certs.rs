//! `ferry certs DIR`: a throwaway CA and one certificate, for trying
//! `--tls-dir` on one machine or in a lab.

use crate::error::CmdError;
use clap::Args;
use ferry_engine::transport::tls::{pki, CA_FILE, CERT_FILE, KEY_FILE};
use ferry_vm::error_chain as chain;
use std::process::ExitCode;

/// Arguments of `ferry certs`.
#[derive(Args, Debug)]
pub struct CertsArgs {
    /// Directory to write ca.pem, cert.pem and key.pem into (created if
    /// missing; existing files are never overwritten).
    pub dir: std::path::PathBuf,
    /// Another name the certificate is valid for, besides localhost,
    /// 127.0.0.1 and ::1: a host name or an IP address (repeatable).
    #[arg(long = "name", value_name = "NAME")]
    pub names: Vec<String>,
}

pub fn run(a: CertsArgs) -> Result<ExitCode, CmdError> {
    pki::write_throwaway(&a.dir, &a.names).map_err(|e| CmdError::Failed(chain(&e)))?;
    let mut names: Vec<String> = pki::LOCAL_NAMES.iter().map(|s| s.to_string()).collect();
    names.extend(a.names.iter().cloned());
    println!(
        "wrote {CA_FILE}, {CERT_FILE} and {KEY_FILE} to {}",
        a.dir.display()
    );
    println!("the certificate is valid for: {}", names.join(", "));
    println!(
        "use the same directory on both ends: ferry receive --tls-dir {0} ... / ferry migrate --tls-dir {0} ...",
        a.dir.display()
    );
    println!("this CA is for tests and demos; its key is not kept, so it signs nothing else");
    Ok(ExitCode::SUCCESS)
}
