//! `minivmm receive`: wait for a migrated VM, run it on, report.

use super::{console, parse_backing, runs, sections, status_name};
use ferry_engine::transport::{Listen, TlsConfig};
use ferry_engine::vmm::{receive_as, BackendError, Backing, StreamHeader, Vm};
use ferry_engine::{await_migration, listen, ReceiveOptions, Status};
use minivmm::probe::{self, MiniProbe};
use minivmm::{MiniConfig, MiniVm, VMM_ID};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ReceiveArgs {
    /// Where to listen (`127.0.0.1:0` picks a port; the first stdout line
    /// says which, as `{"listening": ADDR}`).
    #[arg(long)]
    listen: String,
    /// Mutual TLS with the ca.pem, cert.pem and key.pem in this directory.
    #[arg(long)]
    tls: Option<PathBuf>,
    /// How long the guest runs here once it has arrived.
    #[arg(long, default_value_t = 1000)]
    run_after_ms: u64,
    /// Guest memory: anon or memfd.
    #[arg(long, default_value = "anon", value_parser = parse_backing)]
    backing: Backing,
    /// Write the console here instead of stdout.
    #[arg(long)]
    console: Option<PathBuf>,
    /// End with the summary as one JSON line on stdout.
    #[arg(long)]
    json: bool,
}

pub fn receive(a: ReceiveArgs) -> Result<(), String> {
    let tcp = listen(a.listen.as_str()).map_err(|e| e.to_string())?;
    let addr = tcp.local_addr().map_err(|e| e.to_string())?;
    let listener: Box<dyn Listen> = match &a.tls {
        Some(dir) => Box::new(
            TlsConfig::load(dir)
                .map_err(|e| e.to_string())?
                .listener(tcp),
        ),
        None => Box::new(tcp),
    };
    println!("{}", serde_json::json!({ "listening": addr.to_string() }));
    eprintln!("minivmm: waiting for a migration on {addr}");
    let incoming = await_migration(&*listener).map_err(|e| e.to_string())?;
    let out = console(a.console.as_deref())?;
    let backing = a.backing;
    let mut factory = |h: &StreamHeader| -> Result<MiniVm, BackendError> {
        if h.vmm != VMM_ID {
            return Err(BackendError::Guest(format!(
                "minivmm cannot run a {} VM",
                h.vmm
            )));
        }
        let config: MiniConfig = serde_json::from_value(h.vmm_config.clone())
            .map_err(|e| BackendError::Guest(format!("not a minivmm configuration: {e}")))?;
        Ok(MiniVm::incoming(config, backing, out.clone())?)
    };
    let opts = ReceiveOptions {
        probe: Some(Arc::new(MiniProbe)),
        ..ReceiveOptions::default()
    };
    let (mut vm, summary) = receive_as(incoming, &*listener, &mut factory, &opts)
        .map_err(|e| ferry_engine::vmm::error_chain(&e))?;
    if summary.status == Status::Completed {
        std::thread::sleep(Duration::from_millis(a.run_after_ms));
    }
    let health = vm.check_health().err().map(|e| e.to_string());
    vm.pause().map_err(|e| e.to_string())?;
    out.flush();
    let guest = probe::counters(&vm)?;
    eprintln!(
        "minivmm: received ({}), digest {}; then {} console lines and {} verified reads in all",
        status_name(summary.status),
        if summary.digest_match {
            "match"
        } else {
            "MISMATCH"
        },
        guest.console_lines,
        guest.reads_verified
    );
    if a.json {
        let j = serde_json::json!({
            "role": "destination",
            "status": status_name(summary.status),
            "digest_match": summary.digest_match,
            "sections": sections(&vm),
            "guest": guest,
            "health": health,
            "disk_runs": runs(&vm.disk_journal()),
            "summary": summary,
        });
        println!("{j}");
    }
    match health {
        Some(h) => Err(format!("the guest failed here: {h}")),
        None => Ok(()),
    }
}
