//! Parameters that may change while a migration runs (from a control socket
//! or a signal handler), shared through an `Arc` and read with relaxed
//! atomics at each batch or round, plus the token bucket that enforces the
//! bandwidth cap.

use crate::choices::ConvergeMode;
use crate::error::OptionsError;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default downtime target.
pub const DEFAULT_DOWNTIME: Duration = Duration::from_millis(300);
/// Default cap on precopy rounds (the full pass counts as one).
pub const DEFAULT_MAX_ROUNDS: u32 = 30;
/// The downtime targets accepted, in ms.
pub const DOWNTIME_MS: RangeInclusive<u64> = 1..=60_000;
/// The round caps accepted.
pub const MAX_ROUNDS: RangeInclusive<u64> = 1..=10_000;
/// The quota intervals accepted, in ms ([`ferry_vm::QUOTA_INTERVALS`]).
pub const QUOTA_INTERVAL_MS: RangeInclusive<u64> = (ferry_vm::QUOTA_INTERVALS.start().as_millis()
    as u64)
    ..=(ferry_vm::QUOTA_INTERVALS.end().as_millis() as u64);

/// A change to the live tunables, from any face (the CLI's flags, the
/// control socket's `set`, QMP's `migrate-set-parameters`); `None` leaves a
/// value as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunableChange {
    /// The downtime target, in ms.
    pub downtime_ms: Option<u64>,
    /// The round cap.
    pub max_rounds: Option<u32>,
    /// The bandwidth cap in bytes/s (0: none).
    pub bandwidth_bytes_per_sec: Option<u64>,
    /// The policy interval and quota refill, in ms.
    pub quota_interval_ms: Option<u64>,
}

impl TunableChange {
    /// Refuses a value out of its range, naming it.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if let Some(ms) = self.downtime_ms {
            OptionsError::check("downtime target", ms, DOWNTIME_MS, " ms")?;
        }
        if let Some(r) = self.max_rounds {
            OptionsError::check("max rounds", r.into(), MAX_ROUNDS, "")?;
        }
        if let Some(ms) = self.quota_interval_ms {
            OptionsError::check("quota interval", ms, QUOTA_INTERVAL_MS, " ms")?;
        }
        Ok(())
    }
}

/// Live-tunable migration parameters.
#[derive(Debug)]
pub struct Tunables {
    downtime_target_us: AtomicU64,
    max_rounds: AtomicU32,
    bandwidth_bytes_per_sec: AtomicU64,
    cancelled: AtomicBool,
    migrating: AtomicBool,
    throttle_request: AtomicU16,
    policy_request: AtomicU8,
    quota_interval_us: AtomicU64,
    postcopy_request: AtomicBool,
    /// The cap is lifted while the source is paused for its switchover.
    uncapped_pause: AtomicBool,
    /// The source is paused for its switchover now.
    paused: AtomicBool,
}

/// No throttle request pending.
const NO_REQUEST: u16 = u16::MAX;
/// No policy switch pending.
const NO_POLICY: u8 = u8::MAX;

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            downtime_target_us: AtomicU64::new(DEFAULT_DOWNTIME.as_micros() as u64),
            max_rounds: AtomicU32::new(DEFAULT_MAX_ROUNDS),
            bandwidth_bytes_per_sec: AtomicU64::new(0),
            cancelled: AtomicBool::new(false),
            migrating: AtomicBool::new(false),
            throttle_request: AtomicU16::new(NO_REQUEST),
            policy_request: AtomicU8::new(NO_POLICY),
            quota_interval_us: AtomicU64::new(ferry_vm::QUOTA_INTERVAL.as_micros() as u64),
            postcopy_request: AtomicBool::new(false),
            uncapped_pause: AtomicBool::new(false),
            paused: AtomicBool::new(false),
        }
    }
}

impl Tunables {
    /// Defaults, shareable.
    pub fn shared() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Checks every value of `change`, then applies them all, or none.
    pub fn apply(&self, change: &TunableChange) -> Result<(), OptionsError> {
        change.validate()?;
        if let Some(ms) = change.downtime_ms {
            self.set_downtime_target(Duration::from_millis(ms));
        }
        if let Some(r) = change.max_rounds {
            self.set_max_rounds(r);
        }
        if let Some(b) = change.bandwidth_bytes_per_sec {
            self.set_bandwidth_bytes_per_sec(b);
        }
        if let Some(ms) = change.quota_interval_ms {
            self.set_quota_interval(Duration::from_millis(ms));
        }
        Ok(())
    }

    /// Downtime the convergence check aims for.
    pub fn downtime_target(&self) -> Duration {
        Duration::from_micros(self.downtime_target_us.load(Relaxed))
    }

    /// Sets the downtime target.
    pub fn set_downtime_target(&self, target: Duration) {
        self.downtime_target_us
            .store(target.as_micros().min(u128::from(u64::MAX)) as u64, Relaxed);
    }

    /// Most precopy rounds before switchover is forced.
    pub fn max_rounds(&self) -> u32 {
        self.max_rounds.load(Relaxed)
    }

    /// Sets the round cap (at least 1: the full pass).
    pub fn set_max_rounds(&self, rounds: u32) {
        self.max_rounds.store(rounds.max(1), Relaxed);
    }

    /// Bandwidth cap in bytes/s; 0 means unlimited.
    pub fn bandwidth_bytes_per_sec(&self) -> u64 {
        self.bandwidth_bytes_per_sec.load(Relaxed)
    }

    /// Sets the bandwidth cap in bytes/s; 0 means unlimited.
    pub fn set_bandwidth_bytes_per_sec(&self, bytes_per_sec: u64) {
        self.bandwidth_bytes_per_sec.store(bytes_per_sec, Relaxed);
    }

    /// Lifts the bandwidth cap while the source is paused for its
    /// switchover (the final round, the device and vCPU state), as QEMU
    /// lifts `max-bandwidth` at its completion: the cap spares the link
    /// while the guest runs, and costs downtime once it does not. Off by
    /// default, where the cap stands for the link itself (the benchmarks'
    /// slow links). The switchover decision still counts the capped rate.
    pub fn set_uncapped_pause(&self, on: bool) {
        self.uncapped_pause.store(on, Relaxed);
    }

    /// Whether the cap is lifted during the switchover's pause.
    pub fn uncapped_pause(&self) -> bool {
        self.uncapped_pause.load(Relaxed)
    }

    /// The engine marks the switchover's pause (and its end, if the source
    /// runs again).
    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Relaxed);
    }

    /// The cap the token bucket enforces now: none during the pause with
    /// [`Tunables::set_uncapped_pause`].
    fn cap_now(&self) -> u64 {
        match self.paused.load(Relaxed) && self.uncapped_pause() {
            true => 0,
            false => self.bandwidth_bytes_per_sec(),
        }
    }

    /// Asks the migration to stop; honoured until switchover starts.
    pub fn cancel(&self) {
        self.cancelled.store(true, Relaxed);
    }

    /// Clears a cancel, so the next migration with these tunables can run.
    pub fn reset_cancel(&self) {
        self.cancelled.store(false, Relaxed);
    }

    /// Whether `cancel` was called (and not reset since).
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Relaxed)
    }

    /// Whether a migration with these tunables is running (the engine
    /// owns the VM then, so a VM command must go through here).
    pub fn is_migrating(&self) -> bool {
        self.migrating.load(Relaxed)
    }

    /// Marks a migration as running or not (the engine does).
    pub fn set_migrating(&self, on: bool) {
        self.migrating.store(on, Relaxed);
    }

    /// Asks the running migration to set every vCPU's time throttle to
    /// `percent` at its next round (the convergence policy may move it
    /// again afterwards).
    pub fn request_throttle(&self, percent: u8) {
        self.throttle_request
            .store(u16::from(percent.min(99)), Relaxed);
    }

    /// Asks the running migration to switch its convergence policy (the
    /// old one's throttle is lifted first) at its next batch.
    pub fn request_policy(&self, mode: ConvergeMode) {
        self.policy_request.store(mode as u8, Relaxed);
    }

    /// The pending policy switch, taken.
    pub fn take_policy_request(&self) -> Option<ConvergeMode> {
        ConvergeMode::from_index(self.policy_request.swap(NO_POLICY, Relaxed))
    }

    /// The dirty quota's refill interval.
    pub fn quota_interval(&self) -> Duration {
        Duration::from_micros(self.quota_interval_us.load(Relaxed))
    }

    /// Sets the dirty quota's refill interval (brought into
    /// [`ferry_vm::QUOTA_INTERVALS`]); a quota in force follows at the
    /// next batch, at the same rate.
    pub fn set_quota_interval(&self, interval: Duration) {
        let range = ferry_vm::QUOTA_INTERVALS;
        let interval = interval.clamp(*range.start(), *range.end());
        self.quota_interval_us
            .store(interval.as_micros() as u64, Relaxed);
    }

    /// Asks a running migration that may switch to postcopy (hybrid) to
    /// switch at the end of the round under way (QMP's
    /// `migrate-start-postcopy`). A precopy ignores it.
    pub fn request_postcopy(&self) {
        self.postcopy_request.store(true, Relaxed);
    }

    /// The pending postcopy request, taken.
    pub fn take_postcopy_request(&self) -> bool {
        self.postcopy_request.swap(false, Relaxed)
    }

    /// The pending throttle request, taken.
    pub fn take_throttle_request(&self) -> Option<u8> {
        match self.throttle_request.swap(NO_REQUEST, Relaxed) {
            NO_REQUEST => None,
            p => Some(p as u8),
        }
    }
}

/// Token bucket over [`Tunables::bandwidth_bytes_per_sec`]; re-reads the cap
/// on every call, so a new cap applies at the next batch.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    tunables: Arc<Tunables>,
    tokens: f64,
    last: Instant,
}

/// Burst allowed above the rate, in seconds of traffic.
const BURST_SECS: f64 = 0.05;
/// Longest single sleep, so cancel and cap changes are noticed.
const MAX_SLEEP: Duration = Duration::from_millis(50);

impl TokenBucket {
    /// A bucket reading its rate from `tunables`.
    pub fn new(tunables: Arc<Tunables>) -> Self {
        TokenBucket {
            tunables,
            tokens: 0.0,
            last: Instant::now(),
        }
    }

    /// Adds the tokens earned since the last look; `None` where there is
    /// no cap (and then no credit is kept either).
    fn refill(&mut self) -> Option<f64> {
        let rate = self.tunables.cap_now() as f64;
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        if rate <= 0.0 {
            self.tokens = 0.0;
            return None;
        }
        // A burst of 50 ms of traffic at most; a debt may be any size.
        self.tokens = (self.tokens + rate * elapsed).min(rate * BURST_SECS);
        Some(rate)
    }

    /// Charges `bytes` that must go out at once, ahead of everything else
    /// (a postcopy answer a vCPU waits for): never waits. The debt it may
    /// leave slows whoever paces next, so the cap still holds for the sum.
    pub fn charge(&mut self, bytes: u64) {
        if self.refill().is_some() {
            self.tokens -= bytes as f64;
        }
    }

    /// Charges `bytes` and returns how long to wait before they may go:
    /// until the bucket is out of debt.
    fn reserve(&mut self, bytes: u64) -> Duration {
        match self.refill() {
            Some(rate) => {
                self.tokens -= bytes as f64;
                Duration::from_secs_f64((-self.tokens).max(0.0) / rate)
            }
            None => Duration::ZERO,
        }
    }

    /// How long the bucket stays in debt at the rate now.
    fn debt(&mut self) -> Duration {
        match self.refill() {
            Some(rate) => Duration::from_secs_f64((-self.tokens).max(0.0) / rate),
            None => Duration::ZERO,
        }
    }
}

/// Charges `bytes` to the cap `bucket` holds and waits until they may go
/// out, without holding the lock meanwhile: an answer charged by
/// [`TokenBucket::charge`] never queues behind a sender paying its debt.
/// A cancel or a lifted cap ends the wait.
pub(crate) fn pace(bucket: &std::sync::Mutex<TokenBucket>, bytes: u64) {
    let lock = || bucket.lock().unwrap_or_else(|p| p.into_inner());
    let (mut wait, tunables) = {
        let mut b = lock();
        (b.reserve(bytes), Arc::clone(&b.tunables))
    };
    while !wait.is_zero() && !tunables.is_cancelled() {
        std::thread::sleep(wait.min(MAX_SLEEP));
        wait = lock().debt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_lifted_only_during_the_pause_and_only_when_asked() {
        let t = Tunables::shared();
        t.set_bandwidth_bytes_per_sec(1 << 20);
        let mut bucket = TokenBucket::new(Arc::clone(&t));
        // A megabyte at 1 MiB/s waits about a second, paused or not...
        assert!(bucket.reserve(1 << 20) > Duration::from_millis(500));
        t.set_paused(true);
        assert!(bucket.debt() > Duration::from_millis(500));
        // ...unless the pause is uncapped: then nothing waits, and no debt
        // is left for after.
        t.set_uncapped_pause(true);
        assert_eq!(bucket.reserve(1 << 20), Duration::ZERO);
        assert_eq!(bucket.debt(), Duration::ZERO);
        // The source runs again (a rollback): the cap holds again.
        t.set_paused(false);
        assert!(bucket.reserve(1 << 20) > Duration::from_millis(500));
    }

    #[test]
    fn setters_and_defaults() {
        let t = Tunables::default();
        assert_eq!(t.downtime_target(), DEFAULT_DOWNTIME);
        assert_eq!(t.max_rounds(), DEFAULT_MAX_ROUNDS);
        t.set_max_rounds(0);
        assert_eq!(t.max_rounds(), 1);
        t.set_downtime_target(Duration::from_millis(5));
        assert_eq!(t.downtime_target(), Duration::from_millis(5));
        assert!(!t.is_cancelled());
        t.cancel();
        assert!(t.is_cancelled());
    }

    #[test]
    fn a_policy_request_is_taken_once_and_the_quota_interval_stays_in_range() {
        let t = Tunables::default();
        assert_eq!(t.take_policy_request(), None);
        for mode in ConvergeMode::ALL {
            t.request_policy(mode);
            assert_eq!(t.take_policy_request(), Some(mode));
            assert_eq!(t.take_policy_request(), None);
        }
        assert_eq!(t.quota_interval(), ferry_vm::QUOTA_INTERVAL);
        t.set_quota_interval(Duration::from_millis(1));
        assert_eq!(t.quota_interval(), Duration::from_millis(10));
        t.set_quota_interval(Duration::from_secs(3600));
        assert_eq!(t.quota_interval(), Duration::from_secs(10));
    }

    #[test]
    fn unlimited_bucket_never_blocks_and_keeps_no_credit() {
        let b = std::sync::Mutex::new(TokenBucket::new(Tunables::shared()));
        pace(&b, u64::MAX / 2);
        b.lock().unwrap().charge(1 << 30);
        assert_eq!(b.lock().unwrap().tokens, 0.0);
    }

    #[test]
    fn capped_bucket_goes_into_debt_then_recovers() {
        let t = Tunables::shared();
        t.set_bandwidth_bytes_per_sec(1 << 40);
        let b = std::sync::Mutex::new(TokenBucket::new(Arc::clone(&t)));
        pace(&b, 1 << 20);
        // At 1 TiB/s the burst is 55 GB, so nothing can be outstanding.
        assert!(b.lock().unwrap().tokens <= (1u64 << 40) as f64 * BURST_SECS);
    }

    #[test]
    fn an_answer_is_charged_at_once_and_its_debt_is_paid_by_the_next_pace() {
        let t = Tunables::shared();
        t.set_bandwidth_bytes_per_sec(1 << 20); // 1 MiB/s
        let mut b = TokenBucket::new(Arc::clone(&t));
        // Deep in debt (a push reserved 1 MiB: a second's wait)...
        assert!(b.reserve(1 << 20) > Duration::from_millis(900));
        // ... an answer still goes at once, and adds to the debt.
        b.charge(64 << 10);
        assert!(b.tokens < -((1u64 << 20) as f64), "{}", b.tokens);
        assert!(b.debt() > Duration::from_millis(900));
        // A cancel ends any wait.
        t.cancel();
        pace(&std::sync::Mutex::new(b), 1 << 30);
    }
}
