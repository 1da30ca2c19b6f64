//! `ferry receive`'s arguments, and what they make: the engine's options,
//! the monitor sockets, how the arrived guest is served.

use crate::args::{parse_size, BackendArgs, PagingArgs};
use crate::serve::Serve;
use clap::Args;
use ferry_engine::postcopy::DEFAULT_RECOVER_TIMEOUT;
use ferry_engine::precopy::{DEFAULT_STALL_TIMEOUT, RECOVER_TIMEOUT_SECS, STALL_TIMEOUT_SECS};
use ferry_engine::{ExpectedVm, ReceiveOptions};
use ferry_memstress::MemstressProbe;
use ferry_vm::Blocker;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `ferry receive`.
#[derive(Args, Debug)]
pub struct ReceiveArgs {
    /// Where to wait for the migration: HOST:PORT (TCP, e.g. 0.0.0.0:7070,
    /// or 127.0.0.1:0 for any free port), `unix:PATH` (a UNIX socket), or
    /// `fd:N,M,...` (connected sockets this process inherited, in the order
    /// the source opens them).
    #[arg(
        long,
        required_unless_present = "local",
        default_value = "",
        hide_default_value = true
    )]
    pub listen: String,
    /// Same-host live upgrade: take the VM from a `ferry migrate --local`
    /// on this UNIX socket, mapping its memory files instead of receiving
    /// a copy.
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["listen", "tls_dir"])]
    pub local: Option<std::path::PathBuf>,
    /// Guest memory this destination has room for (all vCPUs' regions, e.g. 1G).
    /// A stream carrying another size is refused.
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// The most device state (the VMM's sections at the switchover) this
    /// destination takes, e.g. 512M. A source whose sections declare more
    /// is refused before any memory moves, naming the largest.
    #[arg(long, value_parser = parse_size, default_value = "4G")]
    pub max_device_state: u64,
    /// vCPUs this destination will run; a stream with another count is refused.
    #[arg(long)]
    pub vcpus: Option<u32>,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Seconds to run the guest after switchover before reporting its own
    /// checks (and on until every vCPU has completed a pass here, at most 120 s).
    #[arg(long = "run-after", default_value_t = 1.0)]
    pub run_after: f64,
    /// Verify the memory digest before resuming the guest (longer downtime).
    #[arg(long = "verify-before-resume")]
    pub verify_before_resume: bool,
    /// Seconds the link may stand still before the migration fails (no
    /// guest is started here then).
    #[arg(long = "stall-timeout", default_value_t = DEFAULT_STALL_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(STALL_TIMEOUT_SECS))]
    pub stall_timeout_s: u64,
    #[command(flatten)]
    pub paging: PagingArgs,
    /// Postcopy: when the connections break after the switchover, run the
    /// guest on and wait this many seconds for the source to reconnect
    /// (`ferry migrate` retries for its own --recover-timeout). 0: give up
    /// at once and pause the guest.
    #[arg(long = "recover-timeout", value_name = "SECS", default_value_t = DEFAULT_RECOVER_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(RECOVER_TIMEOUT_SECS))]
    pub recover_timeout_s: u64,
    /// Mutual TLS: accept only sources with a certificate from `ca.pem` in
    /// this directory, and serve `cert.pem` / `key.pem` (`ferry certs DIR`
    /// writes a throwaway set). Plaintext sources are refused.
    #[arg(long = "tls-dir", value_name = "DIR")]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Refuse postcopy: a source that may switch to it (`--mode postcopy`
    /// or `hybrid`) is told so before any memory moves, and a precopy
    /// migration runs as usual.
    #[arg(long = "no-postcopy")]
    pub no_postcopy: bool,
    /// Offer a migrating guest a CPU without these features (comma
    /// separated, as /proc/cpuinfo names them: `avx2,avx512f`), as a fleet's
    /// baseline CPU model does: a guest that was given one of them is
    /// refused before any memory moves, naming it. kvm backend only.
    #[arg(long = "cpu-without", value_delimiter = ',', value_name = "FEATURES")]
    pub cpu_without: Vec<String>,
    /// Give up if no migration has arrived after this many seconds (by
    /// default, wait for one as long as it takes).
    #[arg(long = "wait", value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub wait_s: Option<u64>,
    /// Exit after reporting instead of running the guest on.
    #[arg(long = "exit-after-report")]
    pub exit_after_report: bool,
    /// For tests: overwrite the guest's code with `ud2` once it resumes
    /// here, so that its vCPUs fault (on kvm a triple fault: the memstress
    /// guest has no IDT) and the failure path is exercised.
    #[arg(long = "break-guest-after-resume", hide = true)]
    pub break_guest: bool,
    /// Once the guest runs here, serve a control socket at this path, as
    /// `ferry run --control` does: status, live settings, QMP's commands
    /// (`ferry ctl`), and a migration onward to another `ferry receive`.
    #[arg(long, value_name = "PATH", conflicts_with = "exit_after_report")]
    pub control: Option<std::path::PathBuf>,
    /// Once the guest runs here, serve a QMP socket at this path, as
    /// `ferry run --qmp` does (a greeting, then QMP only).
    #[arg(long, value_name = "PATH", conflicts_with = "exit_after_report")]
    pub qmp: Option<std::path::PathBuf>,
    /// Print the destination's summary as one JSON line.
    #[arg(long)]
    pub json: bool,
}

impl ReceiveArgs {
    /// The engine's options for the migration these arguments await.
    pub(super) fn receive_options(&self) -> ReceiveOptions {
        let mut o = ReceiveOptions::default();
        o.expect = Some(ExpectedVm {
            memory_bytes: None,
            vcpus: self.vcpus,
            // On auto, whichever of ferry's backends the stream names.
            vmm: (self.backend.backend != "auto").then(|| self.backend.kind().vmm_id().to_string()),
        });
        o.verify_before_resume = self.verify_before_resume;
        o.stall_timeout = Duration::from_secs(self.stall_timeout_s);
        o.placement = self.paging.placement;
        o.prefetch = self.paging.prefetch;
        o.recover_timeout = Duration::from_secs(self.recover_timeout_s);
        o.vcpu_fault_exits = self.paging.fault_path == "auto";
        o.fault_handlers = usize::from(self.paging.fault_handlers);
        o.fault_busy_poll = self.paging.busy_poll;
        o.probe = Some(Arc::new(MemstressProbe));
        o.max_device_bytes = self.max_device_state;
        o.blockers = if self.no_postcopy {
            vec![Blocker::postcopy(
                "this destination was started with --no-postcopy",
            )]
        } else {
            Vec::new()
        };
        o
    }

    /// The monitor sockets this destination serves (`--control`, `--qmp`).
    pub(super) fn monitor_sockets(&self) -> Vec<std::path::PathBuf> {
        [&self.control, &self.qmp]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Removes them, on an exit that does not serve the guest.
    pub(super) fn remove_sockets(&self) {
        for path in self.monitor_sockets() {
            let _ = std::fs::remove_file(path);
        }
    }

    /// How the arrived guest is served: its monitor stays up after a
    /// migration onward only with `--qmp`, as QEMU's does.
    pub(super) fn serving(&self) -> Serve {
        Serve {
            interval: Duration::from_secs(1),
            duration: None,
            control: self.control.clone(),
            qmp: self.qmp.clone(),
            stay_after_migration: self.qmp.is_some(),
        }
    }
}
