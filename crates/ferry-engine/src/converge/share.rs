//! The budget both per-vCPU policies (quota and dirty-limit) give the
//! guest: a share of the link, split equally between the vCPUs.
//!
//! It engages once dirtying outruns the link, at a share each policy picks
//! (dirty-limit: half the link; the quota: an eighth, see `quota`). "Outruns"
//! is read two ways: within a policy interval, the per-vCPU dirty count says
//! the guest dirtied faster than half the link's rate (so the budget
//! engages within about 100 ms, even in the full pass); at a harvest, the
//! round dirtied more than half of what it sent (as auto-converge counts
//! it, and the only reading where the backend has no per-vCPU count). At
//! each harvest that still finds the link outrun, the share halves, so the
//! bytes left shrink at least geometrically. A round whose dirty bytes the
//! final pause can send within the downtime target does not count: the
//! migration ends at the next harvest whatever the guest does, and a short
//! last round of an idle guest (its kernel's own writes, its page tables,
//! which nested paging counts as written at each walk) easily dirties half
//! of the little it sent. Counted, it throttled an idle Linux guest just
//! before its pause, inside the SVM host: the guest saw its clock stop
//! several times longer than under QEMU.
//!
//! The interval reading engages only once the round has dirtied more than
//! an eighth of guest memory ([`INTERVAL_MEMORY_SHARE`]) and more than the
//! pause absorbs. It exists to spare a writer's resend of memory it would
//! otherwise dirty whole in the full pass; below an eighth of memory the
//! resend costs at most an eighth of a copy, what the quota's eighth of
//! the link costs anyway (its doc: 1.14 copies). What it must not catch:
//! the first writes after logging begins, the whole working set of an idle
//! guest at once. On an 8 MiB/s link inside the SVM host an idle Linux
//! guest's (a few MiB in its first second) read above half the link and
//! engaged the quota in the full pass; its eighth of the link, 13 pages
//! per vCPU per interval, is less than a Linux vCPU dirties by running,
//! and the guest's clock stopped for seconds at a time (docs/svm-host-runs.md,
//! "The idle cell under the quota"). With harvests within rounds the
//! count is of the distinct pages the round's harvests found: each
//! harvest protects the pages again, so the meter counts a working set
//! once per interval, and an idle Linux guest's rewrites passed an eighth
//! of its memory 12.7 s into the full pass (the same section, 2026-12-06).
//! Those distinct pages are a truer count than the meter's, so their bar
//! can be lower, a thirty-second of memory ([`INTERVAL_FOUND_SHARE`]): the
//! bar is there to let an idle guest's working set pass, not to let a
//! writer dirty an eighth first (a writer that outruns the link goes on
//! to dirty far more than the bar, and every page of it may go twice).
//! Inside the SVM host an idle Linux guest's full pass found 3 MiB in all
//! of its 512 MiB, a fifth of the bar; the writing cell's writer, at 16
//! MiB/s, reached the eighth only 4.5 s into its full pass, dirtying half
//! its 128 MiB hot set before the quota held it, and the thirty-second
//! 1.3-1.8 s in (docs/svm-host-runs.md, "The quota engages sooner in the full
//! pass").
//! Between harvests the budget follows the measured link. The policies
//! differ only in how the backend enforces it.

use super::Sample;

/// Dirtying above this share of the transfer engages the budget.
pub const THRESHOLD_PCT: u64 = 50;
/// The share of the link the guest may dirty at first unless a policy picks
/// another, in 1/1024ths: half.
pub const INITIAL_SHARE: u64 = 512;
/// The least a round must have dirtied, as a share of guest memory, before
/// an interval's rate engages the budget (see the module's doc): as the
/// meter counts it, rewrites included...
pub const INTERVAL_MEMORY_SHARE: f64 = 0.125;
/// ...and as the harvests within rounds count it, each page once.
pub const INTERVAL_FOUND_SHARE: f64 = 1.0 / 32.0;

/// The share in force.
#[derive(Debug)]
pub(super) struct LinkShare {
    /// In 1/1024ths of the link (0: not engaged).
    share: u64,
    /// The share it engages at, in 1/1024ths.
    initial: u64,
    /// Bytes the per-vCPU count metered since the last harvest: what the
    /// round has dirtied so far, where the engine does not harvest within
    /// rounds (with them, a page rewritten after a harvest is metered
    /// again, and the sample's `within_round_found` is the count).
    metered: u64,
}

impl Default for LinkShare {
    fn default() -> Self {
        Self::starting_at(INITIAL_SHARE)
    }
}

impl LinkShare {
    /// Not engaged; it will engage at `initial` 1/1024ths of the link.
    pub fn starting_at(initial: u64) -> Self {
        LinkShare {
            share: 0,
            initial: initial.clamp(1, 1024),
            metered: 0,
        }
    }

    /// Whether `s` says the guest outruns the link, `metered` bytes
    /// dirtied in the round so far (`s`'s included).
    fn outrun(s: &Sample, metered: u64) -> bool {
        let threshold = THRESHOLD_PCT as f64 / 100.0;
        let absorbed = s.link_bytes_per_sec * s.downtime_target.as_secs_f64();
        match s.round_end {
            Some(end) => {
                s.round > 0
                    && end.sent_bytes > 0
                    && end.dirty_bytes * 100 > end.sent_bytes * THRESHOLD_PCT
                    && end.dirty_bytes as f64 > absorbed
            }
            None => {
                let (dirtied, share) = match s.within_round_found {
                    Some(found) => (found, INTERVAL_FOUND_SHARE),
                    None => (metered, INTERVAL_MEMORY_SHARE),
                };
                let least = absorbed.max(s.guest_bytes as f64 * share);
                dirtied as f64 > least
                    && s.dirty_rate()
                        .is_some_and(|rate| rate > s.link_bytes_per_sec * threshold)
            }
        }
    }

    /// Each vCPU's budget in bytes per second after `s`, once engaged.
    pub fn decide(&mut self, s: &Sample) -> Option<f64> {
        self.metered += s.vcpu_dirty_bytes.iter().sum::<u64>();
        let outrun = Self::outrun(s, self.metered);
        if s.round_end.is_some() {
            self.metered = 0;
        }
        if self.share == 0 {
            if !outrun {
                return None;
            }
            self.share = self.initial;
        } else if s.round_end.is_some() && outrun {
            self.share = (self.share / 2).max(1);
        }
        Some(self.per_vcpu(s))
    }

    /// Engages at once (a stall): the budget, or `None` if already engaged.
    /// How often the share has been halved since it engaged: the rounds
    /// that ended with the guest still outrunning the link.
    pub fn halvings(&self) -> u32 {
        match self.share {
            0 => 0,
            share => (self.initial / share).ilog2(),
        }
    }

    pub fn engage(&mut self, s: &Sample) -> Option<f64> {
        if self.share != 0 {
            return None;
        }
        self.share = self.initial;
        Some(self.per_vcpu(s))
    }

    fn per_vcpu(&self, s: &Sample) -> f64 {
        let total = s.link_bytes_per_sec * self.share as f64 / 1024.0;
        total / f64::from(s.vcpus.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converge::sample::{interval, sample};

    #[test]
    fn an_interval_that_outruns_the_link_engages_but_never_halves() {
        let mut share = LinkShare::default();
        // 1 GB/s link: 2 × 20 MB in 100 ms is 400 MB/s, below half.
        assert_eq!(share.decide(&interval(0, &[20_000_000, 20_000_000])), None);
        // 2 × 30 MB in 100 ms is 600 MB/s: engaged in the full pass.
        let first = share.decide(&interval(0, &[30_000_000, 30_000_000]));
        assert_eq!(first, Some(250e6), "half the link, split between 2");
        let again = share.decide(&interval(0, &[90_000_000, 90_000_000]));
        assert_eq!(again, first, "intervals only follow the link");
        let halved = share.decide(&sample(1, 60, 100));
        assert_eq!(halved.map(|b| b.round()), Some(125e6), "a harvest halves");
    }

    #[test]
    fn a_policy_picks_the_share_it_engages_at() {
        let mut eighth = LinkShare::starting_at(128);
        let first = eighth.decide(&interval(0, &[30_000_000, 30_000_000]));
        assert_eq!(first, Some(62.5e6), "an eighth of 1 GB/s, split between 2");
        assert_eq!(eighth.engage(&sample(1, 0, 100)), None, "already on");
    }

    #[test]
    fn an_interval_engages_only_once_the_round_dirtied_an_eighth_of_memory() {
        let mut share = LinkShare::default();
        // A 512 MB guest on a 1 GB/s link: 2 × 30 MB in 100 ms is 600
        // MB/s, above half the link; an eighth of memory is 64 MB.
        let fast = || Sample {
            guest_bytes: 512_000_000,
            ..interval(0, &[30_000_000, 30_000_000])
        };
        assert_eq!(share.decide(&fast()), None, "60 MB: the working set");
        assert!(share.decide(&fast()).is_some(), "120 MB: engaged");
        // A harvest starts the count again.
        let mut share = LinkShare::default();
        assert_eq!(share.decide(&fast()), None);
        assert_eq!(share.decide(&sample(1, 0, 100)), None);
        assert_eq!(share.decide(&fast()), None, "a new round's count");
    }

    #[test]
    fn with_harvests_within_rounds_a_rewritten_working_set_counts_once() {
        // A 512 MB guest on a 1 GB/s link rewrites the same 12 MB over
        // and over, the meter counting 30 MB per vCPU each interval: the
        // meter passes an eighth of memory (64 MB) at the second interval,
        // the pages found never pass a thirty-second (16 MB).
        let rewrite = |found| Sample {
            guest_bytes: 512_000_000,
            within_round_found: Some(found),
            ..interval(0, &[30_000_000, 30_000_000])
        };
        let mut share = LinkShare::default();
        for _ in 0..10 {
            assert_eq!(share.decide(&rewrite(12_000_000)), None, "12 MB found");
        }
        // A writer at the same rate over fresh pages: found grows.
        assert!(share.decide(&rewrite(24_000_000)).is_some(), "engaged");
    }

    #[test]
    fn a_round_the_final_pause_absorbs_does_not_engage() {
        let mut share = LinkShare::default();
        // 1 GB/s and 300 ms: a pause sends 300 MB.
        let absorbed = |dirty, sent| Sample {
            downtime_target: std::time::Duration::from_millis(300),
            ..sample(1, dirty, sent)
        };
        assert_eq!(share.decide(&absorbed(60_000_000, 100_000_000)), None);
        assert!(share
            .decide(&absorbed(600_000_000, 1_000_000_000))
            .is_some());
    }

    #[test]
    fn without_a_per_vcpu_count_only_harvests_engage() {
        let mut share = LinkShare::default();
        assert_eq!(share.decide(&interval(0, &[])), None);
        assert_eq!(share.decide(&sample(0, 900, 100)), None, "the full pass");
        assert!(share.decide(&sample(1, 60, 100)).is_some());
    }
}
