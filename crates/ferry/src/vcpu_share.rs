//! Each source vCPU's share of a migration: how much of the time it ran
//! (not asleep on a throttle) and how much work it got done, against its own
//! rate just before. The dirty-quota seed's table B measures the first; the
//! second is what a tenant notices.
//!
//! ```text
//!   before   accesses over BASELINE (the guest's own counters), per vCPU
//!   start    accesses, throttled time (Vm::throttled), clock
//!   end      the same once the source paused (completed) or gave up (failed)
//!   runtime  = 100 × (1 − Δthrottled / window)
//!   progress = 100 × (Δaccesses / window) / before
//! ```

use ferry_engine::VcpuShare;
use ferry_memstress::{read_progress, VcpuProgress};
use ferry_vm::Vm;
use std::time::{Duration, Instant};

/// How long the guest's rate is sampled before a migration starts, when no
/// earlier sample is at hand.
const BASELINE: Duration = Duration::from_millis(250);
/// The shortest window an earlier sample may give.
const MIN_WINDOW: Duration = Duration::from_millis(50);

/// The guest's counters read at a moment.
pub type Sample = (Vec<VcpuProgress>, Instant);

/// What was read when the migration started.
pub struct ShareWatch {
    vcpus: u32,
    /// Accesses per second per vCPU just before.
    before: Vec<f64>,
    at: Instant,
    progress: Vec<VcpuProgress>,
    throttled: Vec<Duration>,
}

impl ShareWatch {
    /// Takes the starting point; the rate before is measured from `since`
    /// (an earlier reading of the counters, such as `ferry run`'s last
    /// report), or over [`BASELINE`] now when there is none or it is too
    /// recent. `None` when the guest's counters cannot be read.
    pub fn start(vm: &mut dyn Vm, since: Option<Sample>) -> Option<ShareWatch> {
        let vcpus = vm.vcpus();
        let (first, t0) = match since {
            Some((p, at)) if at.elapsed() >= MIN_WINDOW && p.len() == vcpus as usize => (p, at),
            _ => {
                let p = read_progress(vm.ram(), vcpus).ok()?;
                std::thread::sleep(BASELINE);
                (p, Instant::now() - BASELINE)
            }
        };
        let progress = read_progress(vm.ram(), vcpus).ok()?;
        let at = Instant::now();
        let secs = (at - t0).as_secs_f64();
        let before = first
            .iter()
            .zip(&progress)
            .map(|(a, b)| b.accesses.saturating_sub(a.accesses) as f64 / secs)
            .collect();
        Some(ShareWatch {
            vcpus,
            before,
            at,
            progress,
            throttled: throttled(vm),
        })
    }

    /// Each vCPU's share over `window` from the start (the time until the
    /// source paused the guest; the guest's counters stop there).
    pub fn finish(&self, vm: &mut dyn Vm, window: Duration) -> Vec<VcpuShare> {
        let window = window.min(self.at.elapsed()).as_secs_f64().max(1e-3);
        let Ok(now) = read_progress(vm.ram(), self.vcpus) else {
            return Vec::new();
        };
        let throttled = throttled(vm);
        (0..self.vcpus as usize)
            .map(|v| {
                let slept = match (throttled.get(v), self.throttled.get(v)) {
                    (Some(b), Some(a)) => b.saturating_sub(*a).as_secs_f64(),
                    _ => 0.0,
                };
                let done = now[v].accesses.saturating_sub(self.progress[v].accesses) as f64;
                let progress_pct = if self.before[v] > 0.0 {
                    100.0 * done / window / self.before[v]
                } else {
                    100.0
                };
                VcpuShare {
                    runtime_pct: (100.0 * (1.0 - slept / window)).clamp(0.0, 100.0),
                    progress_pct,
                }
            })
            .collect()
    }
}

/// Time each vCPU has slept on a throttle, where `vm` counts it.
fn throttled(vm: &mut dyn Vm) -> Vec<Duration> {
    vm.time_throttle().map_or_else(Vec::new, |t| t.throttled())
}
