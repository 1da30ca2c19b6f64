//! `--vcpu-trace FILE`: each vCPU's run statistics sampled every
//! [`EVERY`] while the VM is being moved, one JSON line per vCPU per
//! sample, cumulative (a reader takes differences):
//!
//! ```text
//! {"t_ms":1200.4,"mono_ms":..,"process_cpu_ms":..,"vcpu":0,
//!  "thread_cpu_ms":..,"runq_wait_ms":..,"in_run_ms":..,"slept_ms":..,
//!  "sleeps":..,"kvm_run_returns":..,"interrupted":..,
//!  "kvm":{"exits":..,"pf_fixed":..}}
//! ```
//!
//! (the fields of the summary's `throttle_per_vcpu`; a KVM counter still
//! at 0 is left out). `mono_ms` is the host's CLOCK_MONOTONIC, so that a
//! source's and a destination's traces on one host line up;
//! `process_cpu_ms` is the whole process's CPU time (a source's digest
//! shows there); `thread_cpu_ms` and `runq_wait_ms` are the vCPU thread's
//! time on a CPU and runnable but waiting for one (its schedstat), which
//! tell a vCPU the host did not schedule from one KVM kept busy.
//!
//! What it is for: telling where a guest's time went when the guest's own
//! clock readings stop (docs/svm-host-runs.md), between the host's throttle
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
                    let (mono_ms, process_cpu_ms) = (monotonic_ms(), process_cpu_ms());
                    for (i, p) in probes.iter().enumerate() {
                        let stats = super::run_stats_json(&p.run_stats());
                        let (thread_cpu_ms, runq_wait_ms) = schedstat_ms(p.thread_id());
                        let at = serde_json::json!({
                            "t_ms": t_ms, "mono_ms": mono_ms, "process_cpu_ms": process_cpu_ms,
                            "vcpu": i, "thread_cpu_ms": thread_cpu_ms, "runq_wait_ms": runq_wait_ms,
                        });
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

/// CLOCK_MONOTONIC, in ms.
fn monotonic_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec the call writes.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// This process's CPU time (user and system), in ms.
fn process_cpu_ms() -> f64 {
    // SAFETY: a zeroed rusage is valid, and the call writes at most it.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// A thread's time on a CPU and runnable but waiting for one, in ms, from
/// `/proc/self/task/TID/schedstat` (nulls where the kernel has none or
/// the thread has not started).
fn schedstat_ms(tid: u32) -> (Option<f64>, Option<f64>) {
    if tid == 0 {
        return (None, None);
    }
    let Ok(text) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) else {
        return (None, None);
    };
    let mut ns = text.split_whitespace().map(|w| w.parse::<f64>().ok());
    let mut next = || ns.next().flatten().map(|v| v / 1e6);
    (next(), next())
}

impl Drop for VcpuTrace {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
