//! Time-based vCPU throttling (QEMU's auto-converge): every 10 ms timeslice,
//! each running vCPU is kicked out of KVM_RUN and sleeps `percent` of the
//! slice. The hook convergence policies drive; the percentage changes live.

use crate::vcpu::VcpuShared;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The throttle timeslice.
pub const TIMESLICE: Duration = Duration::from_millis(10);
/// The highest throttle: a vCPU always runs a little.
pub const MAX_PERCENT: u8 = 99;

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
                while !s.load(Ordering::Acquire) {
                    std::thread::sleep(TIMESLICE);
                    let pct = u64::from(p.load(Ordering::Relaxed));
                    if pct == 0 {
                        continue;
                    }
                    let sleep_ns = TIMESLICE.as_nanos() as u64 * pct / 100;
                    for v in vcpus.iter().filter(|v| v.is_running()) {
                        v.throttle_ns.store(sleep_ns, Ordering::Release);
                        v.kick();
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
            .store(percent.min(MAX_PERCENT), Ordering::Relaxed);
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
