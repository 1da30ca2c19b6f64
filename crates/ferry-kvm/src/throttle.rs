//! Time-based vCPU throttling (QEMU's auto-converge): at p%, each running
//! vCPU runs a 10 ms timeslice, then is kicked out of KVM_RUN and sleeps
//! p/(1 − p) × 10 ms. So the period grows with p (1 s at 99%), as QEMU's
//! `cpu_throttle_timer_tick` does: a fixed 10 ms tick with a sleep of p% of
//! it cannot go past about 90%, because the wake-up and the kick's latency
//! eat the small running share, and a kick that lands while the vCPU sleeps
//! is lost. The hook convergence policies drive; the percentage changes live.

use crate::vcpu::VcpuShared;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ferry_backend::{throttle_sleep, MAX_THROTTLE_PERCENT, THROTTLE_SLICE as TIMESLICE};

/// A thread that throttles a VM's vCPUs.
pub(crate) struct TimeThrottler {
    percent: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl TimeThrottler {
    /// Starts throttling `vcpus` at 0%.
    pub fn start(vcpus: Vec<Arc<VcpuShared>>) -> std::io::Result<Self> {
        let percent = Arc::new(AtomicU8::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&percent), Arc::clone(&stop));
        let handle = std::thread::Builder::new()
            .name("vcpu-throttle".into())
            .spawn(move || {
                let slice = TIMESLICE.as_nanos() as u64;
                while !s.load(Ordering::Acquire) {
                    let pct = p.load(Ordering::Relaxed);
                    if pct == 0 {
                        std::thread::sleep(TIMESLICE);
                        continue;
                    }
                    let sleep_ns = throttle_sleep(pct).as_nanos() as u64;
                    for v in vcpus.iter().filter(|v| v.is_running()) {
                        v.throttle_ns.store(sleep_ns, Ordering::Release);
                        v.kick();
                    }
                    // The vCPUs sleep, then run one slice: the next tick.
                    let period = Duration::from_nanos(sleep_ns + slice);
                    let until = std::time::Instant::now() + period;
                    // In steps, so a new percentage or a stop is seen soon.
                    while !s.load(Ordering::Acquire) && p.load(Ordering::Relaxed) == pct {
                        let left = until.saturating_duration_since(std::time::Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        std::thread::sleep(left.min(TIMESLICE));
                    }
                }
            })?;
        Ok(TimeThrottler {
            percent,
            stop,
            handle: Some(handle),
        })
    }

    /// Sets the share of each timeslice the vCPUs sleep (capped at 99%).
    pub fn set(&self, percent: u8) {
        self.percent
            .store(percent.min(MAX_THROTTLE_PERCENT), Ordering::Relaxed);
    }
}

impl Drop for TimeThrottler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
