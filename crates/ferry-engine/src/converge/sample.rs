//! What a policy is told: a [`Sample`] once per policy interval while a
//! round is sent, and one at each harvest (the end of a round).
//!
//! The interval samples carry each vCPU's dirtying since the last sample,
//! read off the backend's per-vCPU dirty count (`Vm::dirtied`), so a policy
//! can act within an interval of a writer outrunning the link, even in the
//! middle of the full pass. The harvest samples add what the round dirtied
//! and sent, which is what QEMU's auto-converge counts per period.

use ferry_vm::{Vm, PAGE_SIZE};
use std::time::{Duration, Instant};

/// What the engine measured since the policy's last call.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The round being sent (at a harvest: the round that just ended).
    pub round: u32,
    /// Time since the last sample.
    pub elapsed: Duration,
    /// Bytes each vCPU newly dirtied since the last sample. Empty where the
    /// backend counts dirtying per VM only (the kvm bitmap modes).
    pub vcpu_dirty_bytes: Vec<u64>,
    /// Bytes precopy still has to send (in the full pass: of all memory).
    pub remaining_bytes: u64,
    /// All guest memory, in bytes (0 where not known: no full-pass
    /// allowance, see [`Sample::full_pass_unsent`]).
    pub guest_bytes: u64,
    /// Guest bytes per second the link moves.
    pub link_bytes_per_sec: f64,
    /// The downtime target now.
    pub downtime_target: Duration,
    /// The policy interval now, which is also the quota's refill interval.
    pub quota_interval: Duration,
    /// vCPUs of the guest.
    pub vcpus: u32,
    /// Set at a harvest: what the round that just ended dirtied and sent.
    pub round_end: Option<RoundEnd>,
    /// With harvests within rounds (a page dirtied ahead of the send
    /// cursor is then sent once): the bytes of the distinct pages the
    /// round's harvests have found so far, this sample's included. A page
    /// rewritten after a harvest is metered again but counted here once,
    /// so a guest rewriting a small working set is not mistaken for one
    /// dirtying much of memory. `None` without them: the meter's count
    /// since the round began is then that count.
    pub within_round_found: Option<u64>,
    /// With harvests within rounds: the bytes of the pages this sample's
    /// harvest found dirty that the round had read already (sent, or zero
    /// and skipped) and did not carry yet, each of which now goes again
    /// (the full-pass allowance's measure, see `quota`). `None` without
    /// them.
    pub resends_found: Option<u64>,
}

/// What one round dirtied and sent (a harvest's sample).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundEnd {
    /// Guest bytes dirtied while the round was sent.
    pub dirty_bytes: u64,
    /// Guest bytes the round sent.
    pub sent_bytes: u64,
}

impl Sample {
    /// In the full pass, between harvests: the share of guest memory not
    /// sent yet. A page dirtied there goes out in this pass anyway (with
    /// harvests within rounds, only once: then only the rest of the guest's
    /// writes, for writes spread over memory this share's complement, have
    /// to be sent again). 0 otherwise.
    pub fn full_pass_unsent(&self) -> f64 {
        if self.round != 0 || self.round_end.is_some() || self.guest_bytes == 0 {
            return 0.0;
        }
        (self.remaining_bytes as f64 / self.guest_bytes as f64).clamp(0.0, 1.0)
    }

    /// Whether the engine harvests within rounds.
    pub fn harvests_within_rounds(&self) -> bool {
        self.within_round_found.is_some()
    }

    /// The guest's metered dirty rate over the sample, bytes per second:
    /// `None` where the backend has no per-vCPU count.
    pub fn dirty_rate(&self) -> Option<f64> {
        let secs = self.elapsed.as_secs_f64();
        if self.vcpu_dirty_bytes.is_empty() || secs <= 0.0 {
            return None;
        }
        Some(self.vcpu_dirty_bytes.iter().sum::<u64>() as f64 / secs)
    }
}

/// The engine's clock for interval samples and its reading of the
/// per-vCPU dirty count.
#[derive(Debug)]
pub(crate) struct Meter {
    last: Instant,
    seen: Vec<u64>,
}

impl Meter {
    pub fn new() -> Self {
        Meter {
            last: Instant::now(),
            seen: Vec::new(),
        }
    }

    /// Starts metering now: what each vCPU dirtied before (a prediction's
    /// sample, an earlier migration) is not this migration's, and would
    /// make the first interval look like a burst.
    pub fn start(&mut self, vm: &mut dyn Vm) {
        self.last = Instant::now();
        self.seen = super::dirtied(vm);
    }

    /// Whether an interval has passed since the last sample.
    pub fn due(&self, interval: Duration) -> bool {
        self.last.elapsed() >= interval
    }

    /// Time since the last sample, and each vCPU's bytes dirtied since;
    /// starts the next interval.
    pub fn read(&mut self, vm: &mut dyn Vm) -> (Duration, Vec<u64>) {
        let now = Instant::now();
        let elapsed = now - self.last;
        self.last = now;
        let total = super::dirtied(vm);
        if self.seen.len() != total.len() {
            self.seen = vec![0; total.len()];
        }
        let bytes = total
            .iter()
            .zip(&mut self.seen)
            .map(|(&t, seen)| (t.saturating_sub(std::mem::replace(seen, t))) * PAGE_SIZE as u64)
            .collect();
        (elapsed, bytes)
    }
}

/// A harvest's sample of a 2-vCPU guest over a 1 GB/s link, for the
/// policies' tests: with no downtime target, so that any round counts
/// (its bytes are tiny).
#[cfg(test)]
pub(crate) fn sample(round: u32, dirty: u64, sent: u64) -> Sample {
    Sample {
        round,
        elapsed: Duration::from_secs(1),
        vcpu_dirty_bytes: Vec::new(),
        remaining_bytes: dirty,
        guest_bytes: 0,
        link_bytes_per_sec: 1e9,
        downtime_target: Duration::ZERO,
        quota_interval: ferry_vm::QUOTA_INTERVAL,
        vcpus: 2,
        round_end: Some(RoundEnd {
            dirty_bytes: dirty,
            sent_bytes: sent,
        }),
        within_round_found: None,
        resends_found: None,
    }
}

/// An interval's sample of the same guest, in which each vCPU dirtied
/// `per_vcpu` bytes over 100 ms.
#[cfg(test)]
pub(crate) fn interval(round: u32, per_vcpu: &[u64]) -> Sample {
    Sample {
        elapsed: Duration::from_millis(100),
        vcpu_dirty_bytes: per_vcpu.to_vec(),
        round_end: None,
        ..sample(round, 0, 0)
    }
}
