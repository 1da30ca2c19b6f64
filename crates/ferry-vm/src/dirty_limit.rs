//! QEMU 8.1's dirty-limit, as a per-vCPU feedback loop both backends run.
//!
//! ```text
//!   every vCPU   the bytes it newly dirties are charged here (soft: at the write
//!                fault; kvm: off its dirty ring)
//!   every PERIOD its dirty rate is compared with the limit, and its own time
//!                throttle p moves toward it: proportionally when the rate is far
//!                from the limit, by STEP points when it is close (and, unlike
//!                QEMU, released only by steps: see `adjust`)
//!   every slice  a vCPU with p > 0 sleeps throttle_sleep(p) after each 10 ms it
//!                runs; a vCPU that does not write keeps p = 0 and never sleeps
//! ```
//!
//! QEMU sleeps the vCPU in its dirty-ring-full exit and measures each 1 s;
//! here the sleep follows the time throttle's slice and the period is the
//! quota's 100 ms, so the two per-vCPU policies are compared on one clock.

use crate::capability::{throttle_sleep, MAX_THROTTLE_PERCENT, QUOTA_INTERVAL, THROTTLE_SLICE};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often each vCPU's rate is measured and its throttle moved.
pub const PERIOD: Duration = QUOTA_INTERVAL;
/// The throttle's move when the rate is close to the limit, in points.
pub const STEP: u8 = 2;
/// "Close": within this share of the limit.
pub const TOLERANCE: f64 = 0.25;

/// The new throttle of a vCPU at `percent` that dirtied at `rate` against
/// `limit` (bytes per second both).
pub fn adjust(percent: u8, rate: f64, limit: f64) -> u8 {
    let p = f64::from(percent);
    let next = if (rate - limit).abs() <= limit * TOLERANCE {
        if rate > limit {
            p + f64::from(STEP)
        } else {
            p - f64::from(STEP)
        }
    } else if rate > limit {
        // Far above: slow it by the share it is over.
        p + (100.0 - p) * (rate - limit) / rate
    } else {
        // Far below: released a step at a time. QEMU releases by the share
        // under, but a writer whose pages are all dirty already shows a rate
        // near 0 until the next round protects them again; released at once,
        // it would dirty at full speed for a whole period every round.
        p - f64::from(STEP)
    };
    next.clamp(0.0, f64::from(MAX_THROTTLE_PERCENT)) as u8
}

#[derive(Default)]
struct VcpuState {
    /// Start of the current period, ns since the limiter's epoch.
    period_start: u64,
    /// Bytes dirtied in it.
    bytes: u64,
    percent: u8,
    /// When the vCPU's current run slice started, ns since the epoch.
    slice_start: u64,
}

/// Every vCPU's dirty-rate limit and the throttle that enforces it.
pub struct DirtyLimiter {
    /// Bytes per second per vCPU; 0: off.
    limit: AtomicU64,
    epoch: Instant,
    vcpus: Box<[Mutex<VcpuState>]>,
}

impl DirtyLimiter {
    /// Off, for `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> Self {
        DirtyLimiter {
            limit: AtomicU64::new(0),
            epoch: Instant::now(),
            vcpus: (0..vcpus).map(|_| Mutex::default()).collect(),
        }
    }

    /// Sets every vCPU's limit in bytes per second (`None`: off, and every
    /// throttle back to 0).
    pub fn set_limit(&self, bytes_per_sec: Option<u64>) {
        let l = bytes_per_sec.map_or(0, |b| b.max(1));
        let was = self.limit.swap(l, Ordering::Relaxed);
        if l == 0 || was == 0 {
            // Off, or newly on: every throttle at 0, and a first period
            // that starts now (not at the epoch, which would dilute the
            // first reading with the time the limit was off).
            let now = self.epoch.elapsed().as_nanos() as u64;
            for v in self.vcpus.iter() {
                *v.lock().unwrap_or_else(|p| p.into_inner()) = VcpuState {
                    period_start: now,
                    slice_start: now,
                    ..VcpuState::default()
                };
            }
        }
    }

    /// Whether a limit is set.
    pub fn is_on(&self) -> bool {
        self.limit.load(Ordering::Relaxed) != 0
    }

    /// Charges `vcpu` for `bytes` it newly dirtied, and at a period's end
    /// moves its throttle. Then, if it ran a whole slice since its last
    /// sleep and is throttled, the sleep it must take now.
    pub fn charge(&self, vcpu: usize, bytes: u64) -> Option<Duration> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == 0 {
            return None;
        }
        let state = self.vcpus.get(vcpu)?;
        let now = self.epoch.elapsed().as_nanos() as u64;
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        s.bytes += bytes;
        let period = PERIOD.as_nanos() as u64;
        let elapsed = now.saturating_sub(s.period_start);
        if elapsed >= period {
            // A period with nothing newly dirtied says nothing: a reader's
            // throttle stays 0, and a writer whose pages are all dirty
            // already keeps its throttle until the next round protects them.
            if s.bytes > 0 {
                let rate = s.bytes as f64 / (elapsed as f64 / 1e9);
                s.percent = adjust(s.percent, rate, limit as f64);
            }
            s.period_start = now;
            s.bytes = 0;
        }
        let slice = THROTTLE_SLICE.as_nanos() as u64;
        if s.percent == 0 || now < s.slice_start + slice {
            return None;
        }
        let sleep = throttle_sleep(s.percent);
        s.slice_start = now + sleep.as_nanos() as u64;
        Some(sleep)
    }

    /// Each vCPU's throttle now, in percent.
    pub fn percents(&self) -> Vec<u8> {
        let p = |v: &Mutex<VcpuState>| v.lock().unwrap_or_else(|p| p.into_inner()).percent;
        self.vcpus.iter().map(p).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: f64 = 1e6;

    #[test]
    fn far_above_moves_by_the_share_over_and_close_moves_by_a_step() {
        // Twice the limit: half of what is left.
        assert_eq!(adjust(0, 200.0 * MB, 100.0 * MB), 50);
        assert_eq!(adjust(50, 200.0 * MB, 100.0 * MB), 75);
        // Within 25%: a step either way.
        assert_eq!(adjust(40, 110.0 * MB, 100.0 * MB), 42);
        assert_eq!(adjust(40, 90.0 * MB, 100.0 * MB), 38);
        // Far below: released by a step only.
        assert_eq!(adjust(40, 10.0 * MB, 100.0 * MB), 38);
        assert_eq!(adjust(99, 1e12, 1.0), MAX_THROTTLE_PERCENT);
        assert_eq!(adjust(0, 0.0, 100.0 * MB), 0, "a reader stays unthrottled");
    }

    #[test]
    fn a_writer_over_its_limit_sleeps_and_a_reader_never_does() {
        let l = DirtyLimiter::new(2);
        assert_eq!(l.charge(0, 1 << 30), None, "off");
        l.set_limit(Some(1 << 20));
        let mut slept = Duration::ZERO;
        let until = Instant::now() + Duration::from_millis(400);
        while Instant::now() < until {
            // vCPU 0 dirties 1 GiB/s (in 1 MiB steps), vCPU 1 nothing.
            if let Some(d) = l.charge(0, 1 << 20) {
                slept += d;
            }
            assert_eq!(l.charge(1, 0), None, "the reader slept");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(slept > Duration::ZERO, "{:?}", l.percents());
        assert_eq!(l.percents()[1], 0);
        l.set_limit(None);
        assert_eq!(l.percents(), vec![0, 0]);
    }
}
