//! Throttling a vCPU's dirtying: the per-vCPU dirty quota (seed) next to
//! time-based throttling (auto-converge, the baseline).
//!
//! * [`DirtyQuota`]: each vCPU may dirty `quota_bytes` before it "exits to
//!   the engine" with [`QuotaExit`]. The fault that first dirties a page
//!   charges it (4 KiB). The engine-side [`QuotaHandler`] decides how long the
//!   vCPU sleeps and how much quota it gets back. Readers are never charged,
//!   so they are never throttled.
//! * [`TimeThrottle`]: every vCPU, reader or writer, runs a 10 ms slice and
//!   then sleeps [`ferry_vm::throttle_sleep`] (QEMU's auto-converge
//!   timing, the same as the kvm backend's).
//!
//! The vCPU loop calls [`Throttle::after_access`] at each access boundary with
//! the bytes it newly dirtied; it returns how long to sleep (offline) first.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a vCPU stopped: its dirty quota ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaExit {
    /// The vCPU.
    pub vcpu: usize,
    /// Bytes it dirtied since its quota was last refilled.
    pub dirtied_bytes: u64,
}

/// What the engine decides on a quota exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaRefill {
    /// How long the vCPU sleeps before it runs again.
    pub sleep: Duration,
    /// New quota in bytes.
    pub quota_bytes: u64,
}

/// The engine side of the dirty quota.
pub trait QuotaHandler: Send + Sync {
    /// Called on the vCPU's thread when its quota is exhausted.
    fn exhausted(&self, exit: QuotaExit) -> QuotaRefill;
}

impl<F: Fn(QuotaExit) -> QuotaRefill + Send + Sync> QuotaHandler for F {
    fn exhausted(&self, exit: QuotaExit) -> QuotaRefill {
        self(exit)
    }
}

/// Per-vCPU dirty quotas.
pub struct DirtyQuota {
    remaining: Box<[AtomicU64]>,
    used: Box<[AtomicU64]>,
    exits: AtomicU64,
    handler: Arc<dyn QuotaHandler>,
}

impl DirtyQuota {
    /// `vcpus` quotas of `quota_bytes` each, refilled by `handler`.
    pub fn new(vcpus: usize, quota_bytes: u64, handler: Arc<dyn QuotaHandler>) -> Self {
        DirtyQuota {
            remaining: (0..vcpus).map(|_| AtomicU64::new(quota_bytes)).collect(),
            used: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
            exits: AtomicU64::new(0),
            handler,
        }
    }

    /// Charges `bytes` to `vcpu`; on exhaustion exits to the handler and
    /// returns the sleep it decided (the new quota is already in place).
    pub fn charge(&self, vcpu: usize, bytes: u64) -> Option<Duration> {
        if bytes == 0 {
            return None;
        }
        self.used[vcpu].fetch_add(bytes, Ordering::Relaxed);
        let before = self.remaining[vcpu].load(Ordering::Relaxed);
        let after = before.saturating_sub(bytes);
        self.remaining[vcpu].store(after, Ordering::Relaxed);
        if after > 0 {
            return None;
        }
        self.exits.fetch_add(1, Ordering::Relaxed);
        let refill = self.handler.exhausted(QuotaExit {
            vcpu,
            dirtied_bytes: self.used[vcpu].swap(0, Ordering::Relaxed),
        });
        self.remaining[vcpu].store(refill.quota_bytes, Ordering::Relaxed);
        Some(refill.sleep)
    }

    /// Sets `vcpu`'s quota (the engine refilling outside an exit).
    pub fn set_quota(&self, vcpu: usize, quota_bytes: u64) {
        self.remaining[vcpu].store(quota_bytes, Ordering::Relaxed);
    }

    /// Quota exits so far.
    pub fn exits(&self) -> u64 {
        self.exits.load(Ordering::Relaxed)
    }
}

/// The timeslice of time-based throttling.
pub const TIMESLICE: Duration = ferry_vm::THROTTLE_SLICE;

/// Time-based throttling: each vCPU sleeps after every timeslice it runs.
pub struct TimeThrottle {
    percent: AtomicU32,
    slice_start: Box<[AtomicU64]>,
    epoch: Instant,
    sleeps: AtomicU64,
}

impl TimeThrottle {
    /// Throttling at `percent` (0 = off) for `vcpus` vCPUs.
    pub fn new(vcpus: usize, percent: u32) -> Self {
        TimeThrottle {
            percent: AtomicU32::new(percent.min(99)),
            slice_start: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            sleeps: AtomicU64::new(0),
        }
    }

    /// Changes the throttle (auto-converge raises it round by round).
    pub fn set_percent(&self, percent: u32) {
        self.percent.store(percent.min(99), Ordering::Relaxed);
    }

    /// Current throttle.
    pub fn percent(&self) -> u32 {
        self.percent.load(Ordering::Relaxed)
    }

    /// Sleeps so far.
    pub fn sleeps(&self) -> u64 {
        self.sleeps.load(Ordering::Relaxed)
    }

    /// Whether `vcpu`'s last throttle sleep has time left to run: a vCPU
    /// stopped while this holds was woken before its sleep ended.
    pub fn sleep_unfinished(&self, vcpu: usize) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        now < self.slice_start[vcpu].load(Ordering::Relaxed)
    }

    /// If `vcpu` has run its share of the current slice, the sleep that ends it.
    pub fn check(&self, vcpu: usize) -> Option<Duration> {
        let pct = u64::from(self.percent());
        if pct == 0 {
            return None;
        }
        let now = self.epoch.elapsed().as_nanos() as u64;
        let start = self.slice_start[vcpu].load(Ordering::Relaxed);
        let run = TIMESLICE.as_nanos() as u64;
        if now < start + run {
            return None;
        }
        let sleep = ferry_vm::throttle_sleep(pct as u8);
        self.slice_start[vcpu].store(now + sleep.as_nanos() as u64, Ordering::Relaxed);
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        Some(sleep)
    }
}

/// Refills a dirty quota at interval boundaries: a vCPU that used up its
/// quota sleeps until the next interval starts and then gets the quota in
/// force at that moment (the engine changes both live).
pub struct IntervalRefill {
    /// Each vCPU's quota per interval (`u64::MAX`: off).
    quota_bytes: Box<[AtomicU64]>,
    interval_ns: AtomicU64,
    epoch: Instant,
    slept_ns: Box<[AtomicU64]>,
    /// The interval each vCPU's quota was last filled for.
    filled_for: Box<[AtomicU64]>,
}

impl IntervalRefill {
    /// Off (an unlimited quota) for `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> Self {
        IntervalRefill {
            quota_bytes: (0..vcpus).map(|_| AtomicU64::new(u64::MAX)).collect(),
            interval_ns: AtomicU64::new(ferry_vm::QUOTA_INTERVAL.as_nanos() as u64),
            epoch: Instant::now(),
            slept_ns: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
            filled_for: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn interval_now(&self) -> u64 {
        let interval = self.interval_ns.load(Ordering::Relaxed);
        self.epoch.elapsed().as_nanos() as u64 / interval
    }

    /// Nanoseconds `vcpu` has slept on its quota so far.
    pub fn slept_ns(&self, vcpu: usize) -> u64 {
        self.slept_ns[vcpu].load(Ordering::Relaxed)
    }
}

impl QuotaHandler for IntervalRefill {
    fn exhausted(&self, exit: QuotaExit) -> QuotaRefill {
        let quota_bytes = self.quota_bytes[exit.vcpu].load(Ordering::Relaxed);
        if quota_bytes == u64::MAX {
            return QuotaRefill {
                sleep: Duration::ZERO,
                quota_bytes,
            };
        }
        let interval = self.interval_ns.load(Ordering::Relaxed);
        let now = self.epoch.elapsed().as_nanos() as u64;
        let sleep = interval - now % interval;
        self.slept_ns[exit.vcpu].fetch_add(sleep, Ordering::Relaxed);
        QuotaRefill {
            sleep: Duration::from_nanos(sleep),
            quota_bytes,
        }
    }
}

/// What a running VM's vCPUs check at every access boundary: the time
/// throttle and the interval dirty quota, both changed live (one relaxed
/// load each while off).
pub struct LiveThrottle {
    /// Time-based throttling (auto-converge).
    pub time: TimeThrottle,
    /// The per-vCPU dirty quota, refilled every interval.
    pub quota: DirtyQuota,
    refill: Arc<IntervalRefill>,
    /// QEMU's dirty-limit: each writer's own time throttle follows its rate.
    pub limit: ferry_vm::dirty_limit::DirtyLimiter,
    /// Pages each vCPU has newly dirtied (the per-vCPU dirty count).
    dirtied: Box<[AtomicU64]>,
}

impl LiveThrottle {
    /// Both off, for `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> Self {
        let refill = Arc::new(IntervalRefill::new(vcpus));
        LiveThrottle {
            time: TimeThrottle::new(vcpus, 0),
            quota: DirtyQuota::new(
                vcpus,
                u64::MAX,
                Arc::clone(&refill) as Arc<dyn QuotaHandler>,
            ),
            refill,
            limit: ferry_vm::dirty_limit::DirtyLimiter::new(vcpus),
            dirtied: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Pages each vCPU has newly dirtied so far.
    pub fn dirtied(&self) -> Vec<u64> {
        self.dirtied
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .collect()
    }

    /// Sets each vCPU's quota and their interval (`None`: off), at once.
    pub fn set_quota(&self, quota: Option<&ferry_vm::Quota>) {
        if let Some(q) = quota {
            self.refill
                .interval_ns
                .store(q.interval.as_nanos() as u64, Ordering::Relaxed);
        }
        for (v, slot) in self.refill.quota_bytes.iter().enumerate() {
            let bytes = quota.map_or(u64::MAX, |q| q.of(v).max(1));
            slot.store(bytes, Ordering::Relaxed);
            self.quota.set_quota(v, bytes);
        }
    }

    /// Nanoseconds `vcpu` has slept on its quota so far.
    pub fn quota_slept_ns(&self, vcpu: usize) -> u64 {
        self.refill.slept_ns(vcpu)
    }

    /// Charges `vcpu` for pages it newly dirtied. The quota is per interval:
    /// the first charge in a new interval starts from a full quota, so
    /// what a light writer dirtied earlier never adds up to a sleep.
    fn charge(&self, vcpu: usize, dirtied_pages: u64) -> Option<Duration> {
        if dirtied_pages == 0 {
            return None;
        }
        let q = self.refill.quota_bytes[vcpu].load(Ordering::Relaxed);
        if q == u64::MAX {
            return None;
        }
        let now = self.refill.interval_now();
        if self.refill.filled_for[vcpu].swap(now, Ordering::Relaxed) != now {
            self.quota.set_quota(vcpu, q);
        }
        let sleep = self.quota.charge(vcpu, dirtied_pages * 4096);
        if sleep.is_some() {
            // Refilled by the exit for the interval it sleeps into.
            self.refill.filled_for[vcpu].store(now + 1, Ordering::Relaxed);
        }
        sleep
    }
}

/// How the vCPUs are throttled.
#[derive(Clone, Default)]
pub enum Throttle {
    /// Not at all.
    #[default]
    None,
    /// Per-vCPU dirty quota.
    Quota(Arc<DirtyQuota>),
    /// Time-based.
    Time(Arc<TimeThrottle>),
    /// Both, changed live by the engine (what a [`crate::SoftVm`] runs).
    Live(Arc<LiveThrottle>),
}

impl Throttle {
    /// At an access boundary after `vcpu` newly dirtied `dirtied_pages`:
    /// how long to sleep first, if at all. Time-based checks every call.
    pub fn after_access(&self, vcpu: usize, dirtied_pages: u64) -> Option<Duration> {
        match self {
            Throttle::None => None,
            Throttle::Quota(q) => q.charge(vcpu, dirtied_pages * 4096),
            Throttle::Time(t) => t.check(vcpu),
            Throttle::Live(l) => {
                if dirtied_pages > 0 {
                    l.dirtied[vcpu].fetch_add(dirtied_pages, Ordering::Relaxed);
                }
                l.time
                    .check(vcpu)
                    .or_else(|| l.limit.charge(vcpu, dirtied_pages * 4096))
                    .or_else(|| l.charge(vcpu, dirtied_pages))
                    .filter(|d| !d.is_zero())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn quota_exits_when_exhausted_and_refills() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let q = DirtyQuota::new(
            2,
            3 * 4096,
            Arc::new(move |e: QuotaExit| {
                s.lock().unwrap().push(e);
                QuotaRefill {
                    sleep: Duration::from_millis(1),
                    quota_bytes: 4096,
                }
            }),
        );
        assert_eq!(q.charge(0, 4096), None);
        assert_eq!(q.charge(0, 0), None, "reads are never charged");
        assert_eq!(q.charge(0, 4096), None);
        assert_eq!(q.charge(0, 4096), Some(Duration::from_millis(1)));
        assert_eq!(q.charge(1, 4096), None, "quotas are per vCPU");
        assert_eq!(
            q.charge(0, 4096),
            Some(Duration::from_millis(1)),
            "refilled to one page"
        );
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(
            seen[0],
            QuotaExit {
                vcpu: 0,
                dirtied_bytes: 3 * 4096
            }
        );
        assert_eq!(seen[1].dirtied_bytes, 4096);
        assert_eq!(q.exits(), 2);
    }

    #[test]
    fn time_throttle_runs_a_slice_then_sleeps_qemus_share() {
        let t = TimeThrottle::new(1, 50);
        assert_eq!(t.check(0), None, "the first slice has just begun");
        std::thread::sleep(TIMESLICE + Duration::from_millis(1));
        let sleep = t.check(0).expect("ran a whole slice");
        assert_eq!(sleep, TIMESLICE, "50%: sleep as long as it ran");
        assert_eq!(t.check(0), None, "the next slice starts after the sleep");
        t.set_percent(75);
        assert_eq!(ferry_vm::throttle_sleep(75), TIMESLICE * 3);
        t.set_percent(0);
        assert_eq!(t.check(0), None);
        assert_eq!(t.sleeps(), 1);
    }
}
