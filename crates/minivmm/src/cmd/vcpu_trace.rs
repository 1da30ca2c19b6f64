//! `--vcpu-trace FILE`: each vCPU's run statistics sampled every
//! [`EVERY`] while the VM is being moved, one JSON line per vCPU per
//! sample, cumulative (a reader takes differences):
//!
//! ```text
//! {"t_ms":1200.4,"vcpu":0,"in_run_ms":..,"slept_ms":..,"sleeps":..,
//!  "kvm_run_returns":..,"interrupted":..,"kvm":{"exits":..,"pf_fixed":..}}
//! ```
//!
//! (the fields of the summary's `throttle_per_vcpu`; a KVM counter still
//! at 0 is left out).
//!
//! What it is for: telling where a guest's time went when the guest's own
//! clock readings stop (docs/svm-host.md), between the host's throttle
//! (`slept_ms`), KVM_RUN (`in_run_ms`) and, inside KVM_RUN, KVM's work for
//! the vCPU (`kvm`: its exits, second-level faults fixed, signal exits).

use minivmm::RunProbe;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the vCPUs are sampled.
pub const EVERY: Duration = Duration::from_millis(100);

/// The sampling thread; it stops when dropped.
pub struct VcpuTrace {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl VcpuTrace {
    /// Starts sampling `probes` into a new file at `path`.
    pub fn start(path: &Path, probes: Vec<RunProbe>) -> Result<Self, String> {
        let file = std::fs::File::create(path)
            .map_err(|e| format!("--vcpu-trace {}: {e}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("vcpu-trace".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::new(file);
                let start = Instant::now();
                while !stopping.load(Ordering::Acquire) {
                    let t_ms = start.elapsed().as_secs_f64() * 1e3;
                    for (i, p) in probes.iter().enumerate() {
                        let stats = super::run_stats_json(&p.run_stats());
                        let at = serde_json::json!({"t_ms": t_ms, "vcpu": i});
                        let line = super::merge(at, stats);
                        // A full disk ends the trace, not the migration.
                        if writeln!(out, "{line}").is_err() {
                            return;
                        }
                    }
                    if out.flush().is_err() {
                        return;
                    }
                    std::thread::sleep(EVERY);
                }
            })
            .map_err(|e| format!("starting the vCPU trace: {e}"))?;
        Ok(VcpuTrace {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for VcpuTrace {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
