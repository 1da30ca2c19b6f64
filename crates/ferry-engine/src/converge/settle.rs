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
//! **Until each vCPU has run.** A woken vCPU still waits for a host CPU.
//! Inside the SVM host, where the guest's two vCPUs, both VMMs and the
//! link share one CPU, a fixed 30 ms was not always enough: the checker
//! listed its gaps, and one vCPU's 554 ms gap spanned the pause (it began
//! in a quota sleep 440 ms earlier) where the other vCPU's was 140 ms. So
//! where the VM counts its vCPUs' entries into the guest
//! ([`DirtyMeter::guest_entries`]), the settle lasts until each vCPU has
//! entered the guest since the lift (or is in it), and [`SETTLE_RUN`]
//! more, up to [`SETTLE_WAIT_MAX`]; elsewhere it lasts [`SETTLE_MAX`].
//!
//! **What it costs.** What the guest dirties while it runs free joins the
//! final round. So the settle ends early, too, once the guest has dirtied
//! the bytes the downtime target's slack can send (the target less the
//! predicted downtime, at the link's rate). A VM without a per-vCPU dirty
//! meter cannot count that, and is paused as before.

use super::{dirtied, Converger};
use ferry_vm::{DirtyMeter, GuestEntries, Vm, PAGE_SIZE};
use std::time::{Duration, Instant};

/// The longest a held guest runs free before the pause: several of its
/// scheduler's ticks, and a tenth of QEMU's default downtime limit.
pub const SETTLE_MAX: Duration = Duration::from_millis(30);

/// The longest a held guest runs free where the VM tells when each vCPU
/// has run again: a third of QEMU's default downtime limit, spent only by
/// a host too busy to run a woken vCPU sooner (or a vCPU that stays out
/// of the guest, serving an exit).
pub const SETTLE_WAIT_MAX: Duration = Duration::from_millis(100);

/// How long the guest runs on once every vCPU is back in it: a woken
/// kernel first catches up on the timer ticks it slept through, then runs
/// the task it left. Inside the SVM host, a settle that paused as soon as
/// each vCPU had re-entered left both vCPUs' gaps spanning the pause from
/// 180-280 ms before it; with 10 ms, once the quota's holds of 200 ms
/// lasted to the end, a vCPU ran 4 ms in KVM_RUN in its settle and the
/// checker's gap spanned the pause from 430 ms before it (run c4, 483 ms
/// against a downtime of 52 ms); with 40 ms, 78-379 ms against
/// downtimes of 41-65 ms (runs c6, d1, d2). It is longer than
/// [`SETTLE_MAX`], the blind wait where the VM does not count entries:
/// that one cannot tell a vCPU still waiting for the CPU from one that
/// ran, so it stays short.
const SETTLE_RUN: Duration = Duration::from_millis(40);

/// How often the settle reads the dirty meter.
const POLL: Duration = Duration::from_millis(1);

/// What a settle did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Settled {
    /// How long the guest ran free, in ms.
    pub ms: f64,
    /// Pages it dirtied meanwhile (they join the final round).
    pub pages: u64,
    /// Every vCPU had entered the guest since the lift (false where the
    /// VM does not count entries).
    pub all_ran: bool,
}

impl Converger {
    /// Whether a throttle, quota or limit holds the guest now.
    pub fn holds(&self) -> bool {
        self.throttle > 0 || self.quota.is_some() || self.limit.is_some()
    }

    /// If a policy holds the guest and `vm` meters its writes, lifts the
    /// hold and lets the guest run until it has dirtied `allowance` bytes,
    /// or each vCPU has run [`SETTLE_RUN`] since it was back in the guest
    /// (at most [`SETTLE_WAIT_MAX`]; [`SETTLE_MAX`] where the VM does not
    /// count its vCPUs' entries); what it did, or `None` where nothing
    /// was lifted. The caller pauses the guest next. A hold that cannot be
    /// lifted is logged, and the pause comes as before.
    pub fn settle(&mut self, vm: &mut dyn Vm, allowance: u64) -> Option<Settled> {
        if !self.holds() || vm.dirty_meter().is_none() || allowance < PAGE_SIZE as u64 {
            return None;
        }
        let base: u64 = dirtied(vm).iter().sum();
        let lifted = entries(vm);
        let longest = match lifted {
            Some(_) => SETTLE_WAIT_MAX,
            None => SETTLE_MAX,
        };
        let start = Instant::now();
        // As a failed migration's release does: the timeline keeps the
        // rounds' steps, and the summary this settle.
        self.release(vm);
        let pages_allowed = allowance / PAGE_SIZE as u64;
        let mut pages = 0;
        let (mut all_ran, mut all_in) = (false, None::<Instant>);
        while start.elapsed() < longest {
            std::thread::sleep(POLL.min(longest.saturating_sub(start.elapsed())));
            pages = dirtied(vm).iter().sum::<u64>().saturating_sub(base);
            if !all_ran {
                all_ran = lifted
                    .as_ref()
                    .zip(entries(vm))
                    .is_some_and(|(before, now)| all_ran_since(before, &now));
                all_in = all_in.or(all_ran.then(Instant::now));
            }
            let ran_on = all_in.is_some_and(|at| at.elapsed() >= SETTLE_RUN);
            if pages >= pages_allowed || ran_on {
                break;
            }
        }
        Some(Settled {
            ms: start.elapsed().as_secs_f64() * 1e3,
            pages,
            all_ran,
        })
    }
}

/// Each vCPU's entries into the guest, where `vm` counts them.
fn entries(vm: &mut dyn Vm) -> Option<Vec<GuestEntries>> {
    vm.dirty_meter().and_then(|m| DirtyMeter::guest_entries(m))
}

/// Whether every vCPU has run since `before` (a VM whose vCPUs changed
/// in number has not said).
fn all_ran_since(before: &[GuestEntries], now: &[GuestEntries]) -> bool {
    before.len() == now.len() && now.iter().zip(before).all(|(n, b)| n.ran_since(b))
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
    fn a_vcpu_has_run_once_it_entered_the_guest_again_or_is_in_it() {
        let e = |entered, inside| GuestEntries { entered, inside };
        // vCPU 0 was in the guest; vCPU 1 asleep on its quota.
        let before = [e(10, true), e(7, false)];
        assert!(!all_ran_since(&before, &[e(10, false), e(7, false)]));
        assert!(all_ran_since(&before, &[e(11, true), e(8, true)]));
        // In and out again between two looks.
        assert!(all_ran_since(&before, &[e(12, false), e(8, false)]));
        assert!(!all_ran_since(&before, &[e(12, false)]));
    }

    #[test]
    fn the_allowance_is_what_the_link_sends_in_the_slack() {
        let ms = Duration::from_millis;
        assert_eq!(allowance(ms(200), ms(300), 8e6), 800_000);
        // No slack, no settle: a prediction over the target.
        assert_eq!(allowance(ms(400), ms(300), 8e6), 0);
        assert_eq!(allowance(ms(0), ms(300), -1.0), 0);
    }
}
