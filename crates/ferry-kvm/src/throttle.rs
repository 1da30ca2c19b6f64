//! The one vCPU throttle of every VMM built on this crate: a thread that
//! kicks vCPUs out of KVM_RUN and leaves each the time it must sleep before
//! it runs again (the vCPU takes the sleep on its own thread, from its
//! [`ThrottleSlot`], before its next KVM_RUN).
//!
//! ```text
//!   time p%      (QEMU's auto-converge) every running vCPU runs a 10 ms slice,
//!                then sleeps p/(1 − p) × 10 ms. The period grows with p (1 s at
//!                99%), as QEMU's `cpu_throttle_timer_tick` does: a fixed 10 ms
//!                tick with a sleep of p% of it cannot pass about 90%, because
//!                wake-up and kick latency eat the small running share.
//!   quota q      (the dirty-quota seed) every QUOTA_TICK the thread collects each
//!                vCPU's dirty ring, the per-vCPU meter: vCPU i earns q[i] bytes per
//!                quota interval, and one that dirtied more is kicked once and
//!                sleeps until it has earned the debt back. A vCPU that does not
//!                write is never kicked. One exit per debt, never one per page
//!                (an exit to userspace costs tens of microseconds on this
//!                project's hosts: docs/kvm-host-devices.md).
//!   limit r      (QEMU 8.1's dirty-limit) every QUOTA_TICK each vCPU is charged
//!                for its ring entries; its own time throttle follows its rate
//!                (`ferry_vm::dirty_limit`), and it is kicked with its sleep
//!                after each slice it runs while throttled.
//! ```
//!
//! The kick matters for a guest that rarely exits on its own: a Linux
//! guest with an in-kernel irqchip may run for seconds inside KVM_RUN, and
//! a throttle taken only at the guest's own exits hardly acts.
//!
//! The quota and the limit need ring-mode dirty tracking: the bitmap modes
//! count pages per VM, not per vCPU.
//!
//! A VMM gives each vCPU a [`ThrottleSlot`], implements [`Throttled`] for
//! what its throttle thread sees of a vCPU, calls [`ThrottleSlot::take`]
//! before each KVM_RUN and after each EINTR, and calls
//! [`ThrottleSlot::interrupt`] when it asks the vCPU to stop.

use crate::dirty::ring::DirtyRing;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_vm::dirty_limit::DirtyLimiter;
use ferry_vm::{
    throttle_sleep, Quota, MAX_THROTTLE_PERCENT, PAGE_SIZE, QUOTA_INTERVAL, QUOTA_LONGEST_SLEEPS,
    THROTTLE_SLICE as TIMESLICE,
};

/// What the throttle thread sees of one vCPU.
pub trait Throttled: Send + Sync {
    /// Whether the vCPU is in (or entering) KVM_RUN: a parked vCPU is
    /// neither kicked nor charged a sleep.
    fn is_running(&self) -> bool;
    /// Interrupts KVM_RUN on the vCPU's thread, if it has started.
    fn kick(&self);
    /// Where the throttle leaves the vCPU its sleep.
    fn slot(&self) -> &ThrottleSlot;
    /// The vCPU's dirty ring, its dirty meter (`None` in the bitmap modes).
    fn ring(&self) -> Option<&DirtyRing>;
}

/// A vCPU's throttle sleep: left by the throttle thread, taken by the vCPU's
/// own thread, and counted.
///
/// The sleep blocks on a condition variable until it is due, the throttle
/// is lifted ([`ThrottleSlot::wake`]) or the VMM asks the vCPU to stop
/// ([`ThrottleSlot::interrupt`]). It used to poll in 1 ms steps: inside the
/// SVM host a vCPU asleep on the quota then used about 100 ms of CPU a
/// second, a fifth of the host's one CPU with both vCPUs held, which the
/// guest's own tasks and ferry's sender were short of (docs/svm-host-runs.md).
#[derive(Debug, Default)]
pub struct ThrottleSlot {
    /// Nanoseconds the vCPU must sleep before it next runs.
    sleep_ns: AtomicU64,
    /// Sleeps taken so far.
    sleeps: AtomicU64,
    /// Nanoseconds slept so far.
    slept_ns: AtomicU64,
    /// Bumped when the throttle is lifted: a sleep under way ends early.
    wakes: AtomicU64,
    /// Held by a sleeper between its checks and its wait, and by whoever
    /// rings it, so that no ring falls between the two.
    gate: Mutex<()>,
    /// Rung by [`ThrottleSlot::wake`] and [`ThrottleSlot::interrupt`].
    bell: Condvar,
    /// The CPU clock of the vCPU's thread, read at its first
    /// [`ThrottleSlot::take`] (`None`: the thread has none).
    cpu_clock: OnceLock<Option<libc::clockid_t>>,
    /// The thread's CPU time, in nanoseconds, when its last sleep ended.
    woke_cpu_ns: AtomicU64,
}

/// A CPU clock's reading.
fn cpu_time(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; a bad clock id is an
    // error return, not undefined behaviour.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// The CPU clock of the calling thread.
fn this_threads_cpu_clock() -> Option<libc::clockid_t> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: pthread_self is this live thread, and `clock` is a valid
    // place for its clock id.
    let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
    (rc == 0).then_some(clock)
}

impl ThrottleSlot {
    /// The CPU the vCPU's thread used since its last throttle sleep ended
    /// (`None` before its first [`ThrottleSlot::take`]), so that the quota
    /// counts the CPU a vCPU gets between its sleeps, not the wall time
    /// (docs/svm-host-runs.md: on a host short of CPU, 10 ms of wall time after
    /// a sleep left the guest a few milliseconds, most of them the guest
    /// kernel's catching up). A thread that has exited reads as `None`.
    pub fn cpu_since_sleep(&self) -> Option<Duration> {
        let now = cpu_time((*self.cpu_clock.get()?)?)?;
        let woke = Duration::from_nanos(self.woke_cpu_ns.load(Ordering::Acquire));
        Some(now.saturating_sub(woke))
    }

    /// Leaves the vCPU `sleep` to take (replacing one not yet taken).
    pub fn leave(&self, sleep: Duration) {
        self.sleep_ns
            .store(sleep.as_nanos() as u64, Ordering::Release);
    }

    /// Takes the sleep left for this vCPU, if any, while `keep_running()`
    /// says the vCPU is still wanted running (a pause does not wait for a
    /// throttle). The VMM that changes what `keep_running` reads must then
    /// call [`ThrottleSlot::interrupt`], or the sleep runs its course.
    pub fn take(&self, keep_running: impl Fn() -> bool) {
        self.cpu_clock.get_or_init(this_threads_cpu_clock);
        let ns = self.sleep_ns.swap(0, Ordering::AcqRel);
        if ns == 0 {
            return;
        }
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        let wakes = self.wakes.load(Ordering::Acquire);
        let start = Instant::now();
        let until = start + Duration::from_nanos(ns);
        let mut gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        while keep_running() && self.wakes.load(Ordering::Acquire) == wakes {
            let now = Instant::now();
            if now >= until {
                break;
            }
            // A signal (the VMM's kick) may end the wait early: the loop
            // checks again.
            gate = self
                .bell
                .wait_timeout(gate, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(gate);
        self.slept_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(now) = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID) {
            self.woke_cpu_ns
                .store(now.as_nanos() as u64, Ordering::Release);
        }
    }

    /// Drops a sleep not yet taken and ends one under way: the throttle
    /// was lifted (a failed migration's source must run at once, not at
    /// the end of a quota debt of up to a second).
    pub fn wake(&self) {
        self.sleep_ns.store(0, Ordering::Release);
        let _gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        self.wakes.fetch_add(1, Ordering::AcqRel);
        self.bell.notify_all();
    }

    /// Makes a sleep under way check `keep_running` again: the VMM calls
    /// it after it asks the vCPU to stop. A sleep not yet taken stays.
    pub fn interrupt(&self) {
        let _gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        self.bell.notify_all();
    }

    /// Throttle sleeps taken so far.
    pub fn sleeps(&self) -> u64 {
        self.sleeps.load(Ordering::Relaxed)
    }

    /// Time slept on the throttle so far.
    pub fn slept(&self) -> Duration {
        Duration::from_nanos(self.slept_ns.load(Ordering::Relaxed))
    }
}

/// The vCPUs a [`Throttler`] acts on.
pub type ThrottledVcpus = Vec<Arc<dyn Throttled>>;

/// How often the quota reads the rings.
const QUOTA_TICK: Duration = Duration::from_millis(5);
/// `quota` value meaning no quota.
const NO_QUOTA: u64 = u64::MAX;

/// The knobs the thread reads.
struct Knobs {
    percent: AtomicU8,
    /// QEMU's dirty-limit, fed off the rings (off unless a limit is set).
    limit: DirtyLimiter,
    /// Each vCPU's bytes per interval, or [`NO_QUOTA`] (all of them, or
    /// none: see `quota_on`).
    quota: Box<[AtomicU64]>,
    /// Whether the quota is on.
    quota_on: AtomicBool,
    /// The quota's interval in nanoseconds.
    quota_interval_ns: AtomicU64,
    /// The longest sleep the quota may hold a vCPU to, in nanoseconds.
    quota_longest_ns: AtomicU64,
    stop: AtomicBool,
}

/// A thread that throttles a VM's vCPUs by time or by dirty quota.
pub struct Throttler {
    knobs: Arc<Knobs>,
    /// The vCPUs, to wake when the throttle is lifted.
    vcpus: ThrottledVcpus,
    handle: Option<JoinHandle<()>>,
}

impl Throttler {
    /// Starts the thread for `vcpus`, throttling nothing yet.
    pub fn start(vcpus: ThrottledVcpus) -> std::io::Result<Self> {
        let knobs = Arc::new(Knobs {
            limit: DirtyLimiter::new(vcpus.len()),
            percent: AtomicU8::new(0),
            quota: vcpus.iter().map(|_| AtomicU64::new(NO_QUOTA)).collect(),
            quota_on: AtomicBool::new(false),
            quota_interval_ns: AtomicU64::new(QUOTA_INTERVAL.as_nanos() as u64),
            quota_longest_ns: AtomicU64::new(SHORTEST_HOLD.as_nanos() as u64),
            stop: AtomicBool::new(false),
        });
        let k = Arc::clone(&knobs);
        let woken = vcpus.clone();
        let handle = std::thread::Builder::new()
            .name("vcpu-throttle".into())
            .spawn(move || {
                let mut meter = QuotaMeter::new(vcpus.len());
                let mut limit_was_on = false;
                while !k.stop.load(Ordering::Acquire) {
                    let pct = k.percent.load(Ordering::Relaxed);
                    limit_was_on &= k.limit.is_on() && !k.quota_on.load(Ordering::Acquire);
                    if k.quota_on.load(Ordering::Acquire) {
                        let interval = k.quota_interval_ns.load(Ordering::Relaxed);
                        let longest = k.quota_longest_ns.load(Ordering::Relaxed);
                        let times = QuotaTimes {
                            interval: Duration::from_nanos(interval),
                            longest_sleep: Duration::from_nanos(longest),
                        };
                        meter.tick(&vcpus, &k.quota, times);
                        std::thread::sleep(QUOTA_TICK);
                    } else if k.limit.is_on() {
                        if !limit_was_on {
                            // What the rings hold from before the limit
                            // was on is not its rate: charged, it would
                            // read as a burst of the whole round so far.
                            meter.skip_to_now(&vcpus);
                            limit_was_on = true;
                        }
                        limit_tick(&vcpus, &k.limit, &mut meter.seen);
                        std::thread::sleep(QUOTA_TICK);
                    } else if pct > 0 {
                        time_period(&vcpus, &k, pct);
                    } else {
                        meter.reset();
                        std::thread::sleep(TIMESLICE);
                    }
                }
            })?;
        Ok(Throttler {
            vcpus: woken,
            knobs,
            handle: Some(handle),
        })
    }

    /// Sets the share of each timeslice the vCPUs sleep (capped at 99%;
    /// 0: off, and a sleep under way ends).
    pub fn set_percent(&self, percent: u8) {
        self.knobs
            .percent
            .store(percent.min(MAX_THROTTLE_PERCENT), Ordering::Relaxed);
        if percent == 0 {
            self.wake_all();
        }
    }

    /// Sets each vCPU's dirty-rate limit in bytes per second (`None`: off,
    /// and a sleep under way ends).
    pub fn set_limit(&self, bytes_per_sec: Option<u64>) {
        self.knobs.limit.set_limit(bytes_per_sec);
        if bytes_per_sec.is_none() {
            self.wake_all();
        }
    }

    /// Ends every vCPU's sleep: what is still in force puts them back to
    /// sleep at its next tick.
    fn wake_all(&self) {
        for v in &self.vcpus {
            v.slot().wake();
        }
    }

    /// Sets each vCPU's dirty quota (`None`: off, and a sleep under way
    /// ends).
    pub fn set_quota(&self, quota: Option<&Quota>) {
        if let Some(q) = quota {
            self.knobs
                .quota_interval_ns
                .store(q.interval.as_nanos() as u64, Ordering::Relaxed);
            self.knobs
                .quota_longest_ns
                .store(q.longest_sleep.as_nanos() as u64, Ordering::Relaxed);
        }
        for (i, slot) in self.knobs.quota.iter().enumerate() {
            let bytes = quota.map_or(NO_QUOTA, |q| q.of(i).min(NO_QUOTA - 1));
            slot.store(bytes, Ordering::Relaxed);
        }
        self.knobs
            .quota_on
            .store(quota.is_some(), Ordering::Release);
        if quota.is_none() {
            self.wake_all();
        }
    }
}

/// One period of the time throttle: kick every running vCPU with its sleep,
/// then wait out the sleep and one slice (the next tick), in steps so that a
/// new setting or a stop is seen soon.
fn time_period(vcpus: &[Arc<dyn Throttled>], k: &Knobs, pct: u8) {
    let sleep = throttle_sleep(pct);
    for v in vcpus.iter().filter(|v| v.is_running()) {
        v.slot().leave(sleep);
        v.kick();
    }
    let until = Instant::now() + sleep + TIMESLICE;
    while !k.stop.load(Ordering::Acquire)
        && k.percent.load(Ordering::Relaxed) == pct
        && !k.quota_on.load(Ordering::Relaxed)
    {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(TIMESLICE));
    }
}

/// One tick of the dirty limit: charge each vCPU for the ring entries since
/// the last tick; a vCPU whose throttle says it has run its slice is kicked
/// with its sleep.
fn limit_tick(vcpus: &[Arc<dyn Throttled>], limit: &DirtyLimiter, seen: &mut [u64]) {
    for (i, v) in vcpus.iter().enumerate() {
        let Some(ring) = v.ring() else { continue };
        ring.collect();
        let total = ring.collected();
        let spent = total.saturating_sub(seen[i]) * PAGE_SIZE as u64;
        seen[i] = total;
        if let Some(sleep) = limit.charge(i, spent) {
            if v.is_running() {
                v.slot().leave(sleep);
                v.kick();
            }
        }
    }
}

/// Each vCPU's dirty budget, read off its ring: it earns `quota` bytes per
/// quota interval (holding at most one interval's worth) and spends a
/// page per ring entry. A vCPU in debt is kicked once and sleeps until the
/// debt is earned back, as the seed's vCPU waits for the next interval.
/// Debt carries over, up to what one sleep of the vCPU's *hold* repays,
/// so a burst the meter sees only at its next tick (a vCPU can dirty
/// thousands of pages in 5 ms) is slept off.
///
/// Sleeps end on the intervals' common boundaries, so vCPUs in debt sleep
/// and wake together, and a vCPU woken from one runs at least
/// [`QUOTA_RUN`] before the next. A guest kernel's vCPUs wait on each
/// other (an IPI, a lock held by a vCPU asleep), and a task needs the CPU
/// to get anything done: a vCPU that only ever ran the few milliseconds to
/// the meter's next tick between sleeps made a Linux guest's own clock
/// readings stop for seconds (docs/svm-host-runs.md).
///
/// **The hold.** A sleep is at most the vCPU's hold, which starts at
/// [`SHORTEST_HOLD`]. A writer that dirties more in its slice than a
/// sleep of its hold repays (its debt was capped, the rest forgiven) has
/// its hold doubled, up to the quota's `longest_sleep`; one that ran a
/// slice within its budget has it halved. So the hold settles where slice
/// and sleep give the vCPU its quota, as far as the quota allows: a 10 ms
/// slice between sleeps of 200 ms (the most [`QUOTA_LONGEST_SLEEPS`]
/// allows) leaves a writer a twentieth of its speed. The policy raises a
/// quota's longest sleep only while rounds show the guest outrunning the
/// link (`ferry_engine::converge::quota`): a fixed 50 ms cap could not hold
/// a writer under a sixth of its speed (inside the SVM host a Linux guest's
/// checker then outran the link round after round: docs/svm-host-runs.md, "The
/// quota's hold"), and an idle guest that only brushes a small quota should
/// not sleep longer for it.
struct QuotaMeter {
    last: Option<Instant>,
    /// Where the intervals' boundaries are counted from: when the quota
    /// came on.
    epoch: Instant,
    /// Each ring's collected count at the last tick.
    seen: Vec<u64>,
    /// Bytes each vCPU may still dirty (negative: debt).
    budget: Vec<f64>,
    /// Until when each vCPU was sent to sleep.
    asleep_until: Vec<Instant>,
    /// Each vCPU's hold: its longest sleep.
    hold: Vec<Duration>,
    /// Whether each vCPU's debt passed what its hold repays since its last
    /// sleep.
    outran_hold: Vec<bool>,
}

/// The shortest hold, where every vCPU starts. Inside the SVM host, on
/// the writing cell of `minivmm bench qemu`, a Linux guest's own clock
/// readings stopped for longer the longer the sleeps (docs/svm-host-runs.md).
const SHORTEST_HOLD: Duration = *QUOTA_LONGEST_SLEEPS.start();

/// The least a vCPU runs after a quota sleep before the next: QEMU's
/// time-throttle slice, time for a guest's task to get work done. It is
/// CPU time where the vCPU's thread has one
/// ([`ThrottleSlot::cpu_since_sleep`]): on a host short of CPU a
/// vCPU woken from a sleep waits for the CPU, and then the guest kernel
/// catches up on the ticks it missed before any task runs.
const QUOTA_RUN: Duration = TIMESLICE;

/// The most wall time a vCPU in debt runs after a quota sleep before the
/// next, whatever CPU it got: one the host starves must not go unheld. A
/// vCPU whose slice dirtied more than its hold repays runs no longer than
/// [`QUOTA_RUN`] of wall time: a guest that paces its writes by halting
/// between them dirties without using the CPU (the memstress guest's
/// writer at 32 MiB/s rewrote its 4 MiB each 500 ms round against a quota
/// of a page per interval, with 50 ms slices of wall time between its
/// sleeps, and never converged: the kvm snapshot test under the quota, 2
/// runs in 8).
const QUOTA_RUN_MOST: Duration = Duration::from_millis(50);

/// When a vCPU that owes `owed` of sleep at `now` wakes, held at most
/// `hold`: at the first boundary that repays it, or at the last boundary
/// within `hold`. The boundaries, counted from `epoch`, split each
/// interval into the fewest equal steps no longer than `hold` (so where
/// no boundary falls within it, at `now` plus `hold`).
fn wake_at(
    epoch: Instant,
    interval: Duration,
    now: Instant,
    owed: Duration,
    hold: Duration,
) -> Instant {
    let interval = interval.as_nanos().max(1);
    let steps = interval.div_ceil(hold.as_nanos().max(1));
    let step = (interval / steps).max(1);
    let boundary = |at: Instant, up: bool| {
        let since = at.saturating_duration_since(epoch).as_nanos();
        let k = match up {
            true => since.div_ceil(step),
            false => since / step,
        };
        epoch + Duration::from_nanos((k * step) as u64)
    };
    let latest = now + hold;
    let repaid = boundary(now + owed, true);
    if repaid <= latest {
        return repaid;
    }
    let last = boundary(latest, false);
    match last > now {
        true => last,
        false => latest,
    }
}

impl QuotaMeter {
    fn new(vcpus: usize) -> Self {
        let now = Instant::now();
        QuotaMeter {
            last: None,
            seen: vec![0; vcpus],
            budget: vec![0.0; vcpus],
            asleep_until: vec![now; vcpus],
            hold: vec![SHORTEST_HOLD; vcpus],
            outran_hold: vec![false; vcpus],
            epoch: now,
        }
    }

    fn reset(&mut self) {
        self.last = None;
        self.outran_hold.iter_mut().for_each(|o| *o = false);
    }

    /// Marks every ring's entries so far as seen, uncharged.
    fn skip_to_now(&mut self, vcpus: &[Arc<dyn Throttled>]) {
        for (i, v) in vcpus.iter().enumerate() {
            if let Some(ring) = v.ring() {
                ring.collect();
                self.seen[i] = ring.collected();
            }
        }
    }

    fn tick(&mut self, vcpus: &[Arc<dyn Throttled>], quotas: &[AtomicU64], times: QuotaTimes) {
        let interval = times.interval;
        let now = Instant::now();
        let share = match self.last {
            Some(t) => (now - t).as_secs_f64() / interval.as_secs_f64(),
            None => 1.0,
        };
        let first = self.last.is_none();
        if first {
            self.epoch = now;
        }
        self.last = Some(now);
        for (i, v) in vcpus.iter().enumerate() {
            let Some(ring) = v.ring() else { continue };
            let quota = quotas[i].load(Ordering::Relaxed);
            if quota == NO_QUOTA {
                continue;
            }
            ring.collect();
            let total = ring.collected();
            let spent = if first {
                0
            } else {
                total.saturating_sub(self.seen[i]) * PAGE_SIZE as u64
            };
            self.seen[i] = total;
            // Read only once the wall time allows a sleep: it is a system
            // call per vCPU per tick.
            let ran = match now >= self.asleep_until[i] + QUOTA_RUN {
                true => v.slot().cpu_since_sleep(),
                false => None,
            };
            let charge = Charge {
                now,
                share,
                spent,
                quota,
                times,
                ran,
            };
            if let Some(sleep) = self.charge(i, charge, v.is_running()) {
                v.slot().leave(sleep);
                v.kick();
            }
        }
    }

    /// Charges vCPU `i`; the sleep it must take now, if any.
    fn charge(&mut self, i: usize, c: Charge, running: bool) -> Option<Duration> {
        let quota = c.quota as f64;
        let earned = quota * c.share;
        let (interval, longest) = (c.times.interval, c.times.longest_sleep);
        let hold = self.hold[i].min(longest);
        let most_owed = quota * hold.as_secs_f64() / interval.as_secs_f64();
        let budget = (self.budget[i] + earned).min(quota) - c.spent as f64;
        self.outran_hold[i] |= budget < -most_owed;
        self.budget[i] = budget.max(-most_owed);
        let woke = self.asleep_until[i];
        // A slice that dirtied more than a hold repays has run enough in
        // any time: a paced writer that halts between its bursts dirties
        // without the CPU time that would end its slice.
        let ran_enough = c.now >= woke + QUOTA_RUN
            && (c.ran.is_none_or(|cpu| cpu >= QUOTA_RUN)
                || self.outran_hold[i]
                || c.now >= woke + QUOTA_RUN_MOST);
        if !ran_enough || !running {
            return None;
        }
        if self.budget[i] >= 0.0 {
            // A slice run within its budget: the hold can ease, and what
            // it owed earlier is repaid.
            self.hold[i] = (hold / 2).max(SHORTEST_HOLD);
            self.outran_hold[i] = false;
            return None;
        }
        if std::mem::take(&mut self.outran_hold[i]) {
            // This sleep cannot repay what the slice dirtied: the next
            // may be longer.
            self.hold[i] = (hold * 2).min(longest);
        }
        let owed = Duration::from_secs_f64(-self.budget[i] / quota * interval.as_secs_f64());
        let wake = wake_at(self.epoch, interval, c.now, owed, hold);
        self.asleep_until[i] = wake;
        Some(wake - c.now)
    }
}

/// One vCPU's charge at a meter tick.
struct Charge {
    now: Instant,
    /// The share of a quota interval since the last tick.
    share: f64,
    /// Bytes the vCPU dirtied since the last tick.
    spent: u64,
    /// Its quota, bytes per interval.
    quota: u64,
    times: QuotaTimes,
    /// The CPU its thread used since its last sleep ended, where known.
    ran: Option<Duration>,
}

/// The quota's interval, and the longest sleep it may hold a vCPU to.
#[derive(Clone, Copy)]
struct QuotaTimes {
    interval: Duration,
    longest_sleep: Duration,
}

impl Drop for Throttler {
    fn drop(&mut self) {
        self.knobs.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_sleeps_end_on_common_boundaries_and_never_pass_the_cap() {
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        let interval = ms(100);
        let at = |t: u64| epoch + ms(t);
        // Boundaries every 50 ms (a 100 ms interval in two steps of at
        // most SHORTEST_HOLD). Owing 5 ms at 110 ms: up to 150.
        assert_eq!(
            wake_at(epoch, interval, at(110), ms(5), SHORTEST_HOLD),
            at(150)
        );
        // Owing 30 ms at 140 ms: 200 would pass the cap, so the last
        // boundary within it; two vCPUs in debt at different moments wake
        // together.
        assert_eq!(
            wake_at(epoch, interval, at(140), ms(30), SHORTEST_HOLD),
            at(150)
        );
        assert_eq!(
            wake_at(epoch, interval, at(160), ms(30), SHORTEST_HOLD),
            at(200)
        );
        // A debt past the cap: the last boundary within it (160 + 50).
        assert_eq!(
            wake_at(epoch, interval, at(160), ms(900), SHORTEST_HOLD),
            at(200)
        );
        // A longer interval is split into steps within the cap: 20 of 50 ms.
        let long = Duration::from_secs(1);
        assert_eq!(
            wake_at(epoch, long, at(140), ms(900), SHORTEST_HOLD),
            at(150)
        );
        // An interval that does not split evenly: 3 steps of 33.3 ms.
        let odd = ms(100) + ms(1);
        let third = Duration::from_nanos(odd.as_nanos() as u64 / 3);
        assert_eq!(
            wake_at(epoch, odd, at(10), ms(5), SHORTEST_HOLD),
            epoch + third
        );
        for t in [0, 7, 49, 50, 99, 333] {
            let w = wake_at(epoch, interval, at(t), ms(10_000), SHORTEST_HOLD);
            assert!(w > at(t) && w <= at(t) + SHORTEST_HOLD, "at {t}: {w:?}");
        }
        // Exactly on a boundary, owing nothing more: no sleep.
        assert_eq!(
            wake_at(epoch, interval, at(200), ms(0), SHORTEST_HOLD),
            at(200)
        );
    }

    /// The longest sleep a quota may ask for.
    const LONGEST_HOLD: Duration = *QUOTA_LONGEST_SLEEPS.end();

    /// Runs a meter for one vCPU that dirties `per_tick` bytes each 5 ms
    /// tick it runs (none while asleep) for `ticks` ticks, under a quota
    /// whose longest sleep is [`LONGEST_HOLD`]; the sleeps it was sent to,
    /// and the ticks it ran.
    fn meter_run(per_tick: impl Fn(u32) -> u64, ticks: u32) -> (Vec<Duration>, u32) {
        meter_run_held(per_tick, ticks, LONGEST_HOLD)
    }

    /// [`meter_run`] under a quota whose longest sleep is `longest`.
    fn meter_run_held(
        per_tick: impl Fn(u32) -> u64,
        ticks: u32,
        longest: Duration,
    ) -> (Vec<Duration>, u32) {
        let (sleeps, ran, _) = meter_run_starved(per_tick, ticks, longest, 1.0);
        (sleeps, ran)
    }

    /// [`meter_run_held`] for a vCPU whose thread gets `cpu_share` of the
    /// CPU while awake; also the ticks it was awake before each sleep.
    fn meter_run_starved(
        per_tick: impl Fn(u32) -> u64,
        ticks: u32,
        longest: Duration,
        cpu_share: f64,
    ) -> (Vec<Duration>, u32, Vec<u32>) {
        let mut m = QuotaMeter::new(1);
        let mut awake_runs = Vec::new();
        let mut awake_ticks = 0;
        let epoch = m.epoch;
        let (mut sleeps, mut ran) = (Vec::new(), 0);
        let mut awake_at = epoch;
        for t in 1..=ticks {
            let now = epoch + QUOTA_TICK * t;
            let running = now >= awake_at;
            let spent = if running { per_tick(t) } else { 0 };
            ran += u32::from(running);
            awake_ticks += u32::from(running);
            let c = Charge {
                now,
                share: QUOTA_TICK.as_secs_f64() / QUOTA_INTERVAL.as_secs_f64(),
                spent,
                quota: 16 * PAGE_SIZE as u64,
                times: QuotaTimes {
                    interval: QUOTA_INTERVAL,
                    longest_sleep: longest,
                },
                ran: Some(now.saturating_duration_since(awake_at).mul_f64(cpu_share)),
            };
            if let Some(s) = m.charge(0, c, running) {
                sleeps.push(s);
                awake_runs.push(std::mem::take(&mut awake_ticks));
                awake_at = now + s;
            }
        }
        (sleeps, ran, awake_runs)
    }

    #[test]
    fn a_vcpu_short_of_cpu_runs_its_slice_in_cpu_time_up_to_a_wall_limit() {
        let tick_ms = QUOTA_TICK.as_millis() as u32;
        // A quarter of the CPU: QUOTA_RUN of CPU takes four times as long.
        // It dirties with the CPU it gets, a page a tick against 0.8 of
        // quota. Not every slice runs it: now and then its debt passes
        // what a hold repays, and that slice ends sooner (the hold then
        // doubles). With the wall-time rule every slice ran 2-3 ticks.
        let (sleeps, _, runs) = meter_run_starved(|_| PAGE_SIZE as u64, 2000, LONGEST_HOLD, 0.25);
        assert!(sleeps.len() >= 10, "{sleeps:?}");
        let quarter = 4 * QUOTA_RUN.as_millis() as u32 / tick_ms;
        let full = runs.iter().filter(|r| **r >= quarter).count();
        assert!(full * 4 >= runs.len() * 3, "{runs:?}");
        // A twentieth: held all the same, after QUOTA_RUN_MOST of wall time
        // (without that limit, a slice would run 40 ticks). A page and a
        // half a tick: in debt within most slices.
        let (sleeps, _, runs) =
            meter_run_starved(|_| 3 * PAGE_SIZE as u64 / 2, 2000, LONGEST_HOLD, 0.05);
        assert!(sleeps.len() >= 10, "{sleeps:?}");
        let most = QUOTA_RUN_MOST.as_millis() as u32 / tick_ms;
        // (The tick it wakes on counts as awake; a slice whose sleep
        // repaid all it owed runs on until it owes again.)
        let held = runs
            .iter()
            .filter(|r| (most..=most + 1).contains(*r))
            .count();
        assert!(held * 4 >= runs.len() * 3, "{runs:?}");
    }

    #[test]
    fn a_writer_that_outruns_its_hold_without_cpu_sleeps_before_the_wall_limit() {
        // A paced writer that halts between bursts: no CPU time to speak
        // of, 8 pages a tick against 0.8 of quota. Its slice passes what a
        // hold repays within a few ticks, and ends then, not at
        // QUOTA_RUN_MOST (before the rule, every slice ran 10-11 ticks).
        let tick_ms = QUOTA_TICK.as_millis() as u32;
        let (sleeps, _, runs) =
            meter_run_starved(|_| 8 * PAGE_SIZE as u64, 2000, LONGEST_HOLD, 0.01);
        assert!(sleeps.len() >= 10, "{sleeps:?}");
        let most = QUOTA_RUN_MOST.as_millis() as u32 / tick_ms;
        assert!(runs.iter().all(|r| *r < most), "{runs:?}");
    }

    #[test]
    fn a_writer_past_its_quota_is_held_to_it_with_a_slice_between_sleeps() {
        // 8 pages per tick against 16 per 100 ms (0.8 a tick): 10 times
        // the quota, which a 10 ms slice between 50 ms sleeps cannot hold.
        let ticks = 4000;
        let (sleeps, ran) = meter_run(|_| 8 * PAGE_SIZE as u64, ticks);
        assert!(sleeps.len() >= 10, "{sleeps:?}");
        assert!(sleeps.iter().all(|s| *s <= LONGEST_HOLD), "{sleeps:?}");
        assert!(sleeps.iter().any(|s| *s > SHORTEST_HOLD), "{sleeps:?}");
        // At least QUOTA_RUN (two ticks) awake per sleep taken.
        let runs_needed = (QUOTA_RUN.as_nanos() / QUOTA_TICK.as_nanos()) as u32;
        assert!(
            ran >= runs_needed * sleeps.len() as u32,
            "{ran} ticks awake, {} sleeps",
            sleeps.len()
        );
        // Held near its quota: what it dirtied against what it earned.
        let dirtied = u64::from(ran) * 8;
        let earned = u64::from(ticks) * 16 / 20;
        assert!(
            dirtied < earned * 2,
            "dirtied {dirtied} pages, earned {earned}"
        );
    }

    #[test]
    fn a_writer_far_past_its_quota_sleeps_at_most_the_longest_hold() {
        // 100 pages per tick: 125 times the quota. Held as hard as the
        // longest hold allows: a slice of two ticks between sleeps of
        // LONGEST_HOLD (a 50 ms cap would leave it a sixth of the time).
        let ticks = 4000;
        let (sleeps, ran) = meter_run(|_| 100 * PAGE_SIZE as u64, ticks);
        assert!(sleeps.iter().all(|s| *s <= LONGEST_HOLD), "{sleeps:?}");
        assert!(ran < ticks / 10, "{ran} of {ticks} ticks awake");
    }

    #[test]
    fn a_quota_that_keeps_the_shortest_hold_never_holds_longer() {
        // What a quota asks until its policy sees rounds outrun the link:
        // a writer far past it still sleeps at most 50 ms at a time.
        let (sleeps, ran) = meter_run_held(|_| 100 * PAGE_SIZE as u64, 4000, SHORTEST_HOLD);
        assert!(sleeps.iter().all(|s| *s <= SHORTEST_HOLD), "{sleeps:?}");
        assert!(ran > 4000 / 10, "{ran} of 4000 ticks awake");
    }

    #[test]
    fn the_hold_eases_once_the_writer_slows() {
        // 125 times the quota for 2,000 ticks, then a twentieth of it.
        let busy = |t: u32| match t <= 2000 {
            true => 100 * PAGE_SIZE as u64,
            false => PAGE_SIZE as u64 / 20,
        };
        let (sleeps, ran) = meter_run(busy, 3000);
        let (busy_sleeps, busy_ran) = meter_run(busy, 2000);
        assert!(
            busy_sleeps.iter().any(|s| *s > SHORTEST_HOLD),
            "{busy_sleeps:?}"
        );
        // After the busy stretch, at most the sleep it was in: then it
        // runs free.
        assert!(sleeps.len() <= busy_sleeps.len() + 1, "{sleeps:?}");
        let free = LONGEST_HOLD.as_nanos() / QUOTA_TICK.as_nanos();
        assert!(
            ran - busy_ran >= 1000 - free as u32,
            "{ran} after {busy_ran}"
        );
    }

    #[test]
    fn a_burst_costs_at_most_one_long_sleep_and_then_the_vcpu_runs_free() {
        // 10,000 pages in one tick (625 intervals' quota), then nothing.
        let (sleeps, ran) = meter_run(|t| if t == 1 { 10_000 * PAGE_SIZE as u64 } else { 0 }, 200);
        let slept: Duration = sleeps.iter().sum();
        assert!(
            slept <= SHORTEST_HOLD + QUOTA_INTERVAL,
            "slept {slept:?}: {sleeps:?}"
        );
        assert!(ran >= 200 - 2 * 20, "{ran} of 200 ticks awake");
    }

    #[test]
    fn a_sleep_is_taken_once_and_a_wake_ends_it() {
        let slot = Arc::new(ThrottleSlot::default());
        slot.take(|| true);
        assert_eq!(slot.sleeps(), 0, "nothing left, nothing taken");

        // A long sleep, ended by a wake from another thread.
        slot.leave(Duration::from_secs(600));
        let taker = {
            let slot = Arc::clone(&slot);
            std::thread::spawn(move || slot.take(|| true))
        };
        while slot.sleeps() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        slot.wake();
        taker.join().unwrap();
        assert_eq!(slot.sleeps(), 1);
        assert!(
            slot.slept() < Duration::from_secs(600),
            "{:?}",
            slot.slept()
        );

        // A sleep left and then lifted before the vCPU took it is dropped.
        slot.leave(Duration::from_secs(600));
        slot.wake();
        slot.take(|| true);
        assert_eq!(slot.sleeps(), 1);

        // A pause does not wait for a throttle.
        slot.leave(Duration::from_secs(600));
        slot.take(|| false);
        assert_eq!(slot.sleeps(), 2);
    }

    #[test]
    fn a_pause_ends_a_sleep_under_way_and_an_interrupt_alone_does_not() {
        use std::sync::atomic::AtomicBool;
        let slot = Arc::new(ThrottleSlot::default());
        let wanted = Arc::new(AtomicBool::new(true));
        slot.leave(Duration::from_secs(600));
        let taker = {
            let (slot, wanted) = (Arc::clone(&slot), Arc::clone(&wanted));
            std::thread::spawn(move || slot.take(|| wanted.load(Ordering::Acquire)))
        };
        while slot.sleeps() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Rung while the vCPU is still wanted: the sleep goes on.
        slot.interrupt();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!taker.is_finished(), "an interrupt alone ended the sleep");
        // The VMM's pause: it stops wanting the vCPU, then rings.
        wanted.store(false, Ordering::Release);
        slot.interrupt();
        // A guard against a hang, not a timing: the sleep left was 600 s.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !taker.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(taker.is_finished(), "the pause did not end the sleep");
        taker.join().unwrap();
        assert!(
            slot.slept() < Duration::from_secs(600),
            "{:?}",
            slot.slept()
        );

        // Left alone, a sleep runs its whole course.
        let short = Duration::from_millis(30);
        let before = slot.slept();
        slot.leave(short);
        slot.take(|| true);
        assert!(
            slot.slept() - before >= short,
            "{:?}",
            slot.slept() - before
        );
    }
}
