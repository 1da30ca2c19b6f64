//! The settle: a guest that a policy holds runs free for a moment before
//! the switchover's pause.
//!
//! **Why.** A vCPU that a quota, limit or time throttle has put to sleep
//! when the pause comes does not run again until the destination resumes
//! it, so the guest sees its sleep and the downtime as one gap. Inside the
//! SVM host, on `minivmm bench qemu`'s writing cell, the checker's first
//! line after the move carried 788-925 ms against a host-measured downtime
//! of 142-153 ms: most of it the quota's sleeps (the source's vCPU trace,
//! `minivmm migrate --vcpu-trace`, had each vCPU in KVM_RUN 0-60 ms of
//! each 100 ms up to the pause, asleep the rest). Lifting what holds the
//! guest wakes every sleeping vCPU at once; a few milliseconds later each
//! has run, and the pause that follows is the only gap the guest sees.
//!
//! **What it costs.** What the guest dirties while it runs free joins the
//! final round. So the settle ends at the first of: [`SETTLE_MAX`], or the
//! guest having dirtied the bytes the downtime target's slack can send (the
//! target less the predicted downtime, at the link's rate). A VM without a
//! per-vCPU dirty meter cannot count that, and is paused as before.

use super::{dirtied, Converger};
use ferry_vm::{Vm, PAGE_SIZE};
use std::time::{Duration, Instant};

/// The longest a held guest runs free before the pause: several of its
/// scheduler's ticks, and a tenth of QEMU's default downtime limit.
pub const SETTLE_MAX: Duration = Duration::from_millis(30);

/// How often the settle reads the dirty meter.
const POLL: Duration = Duration::from_millis(1);

/// What a settle did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Settled {
    /// How long the guest ran free, in ms.
    pub ms: f64,
    /// Pages it dirtied meanwhile (they join the final round).
    pub pages: u64,
}

impl Converger {
    /// Whether a throttle, quota or limit holds the guest now.
    pub fn holds(&self) -> bool {
        self.throttle > 0 || self.quota.is_some() || self.limit.is_some()
    }

    /// If a policy holds the guest and `vm` meters its writes, lifts the
    /// hold and lets the guest run until it has dirtied `allowance` bytes,
    /// or [`SETTLE_MAX`] has passed; what it did, or `None` where nothing
    /// was lifted. The caller pauses the guest next. A hold that cannot be
    /// lifted is logged, and the pause comes as before.
    pub fn settle(&mut self, vm: &mut dyn Vm, allowance: u64) -> Option<Settled> {
        if !self.holds() || vm.dirty_meter().is_none() || allowance < PAGE_SIZE as u64 {
            return None;
        }
        let base: u64 = dirtied(vm).iter().sum();
        let start = Instant::now();
        // As a failed migration's release does: the timeline keeps the
        // rounds' steps, and the summary this settle.
        self.release(vm);
        let pages_allowed = allowance / PAGE_SIZE as u64;
        let mut pages = 0;
        while start.elapsed() < SETTLE_MAX {
            std::thread::sleep(POLL.min(SETTLE_MAX.saturating_sub(start.elapsed())));
            pages = dirtied(vm).iter().sum::<u64>().saturating_sub(base);
            if pages >= pages_allowed {
                break;
            }
        }
        Some(Settled {
            ms: start.elapsed().as_secs_f64() * 1e3,
            pages,
        })
    }
}

/// The bytes the guest may dirty in a settle: what the link sends, at
/// `link_bytes_per_sec`, in the slack between `predicted` and `target`.
pub fn allowance(predicted: Duration, target: Duration, link_bytes_per_sec: f64) -> u64 {
    let slack = target.saturating_sub(predicted).as_secs_f64();
    (slack * link_bytes_per_sec.max(0.0)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_is_what_the_link_sends_in_the_slack() {
        let ms = Duration::from_millis;
        assert_eq!(allowance(ms(200), ms(300), 8e6), 800_000);
        // No slack, no settle: a prediction over the target.
        assert_eq!(allowance(ms(400), ms(300), 8e6), 0);
        assert_eq!(allowance(ms(0), ms(300), -1.0), 0);
    }
}
