//! The seed's per-vCPU dirty quota.
//!
//! Once dirtying outruns the link (see `share`: within an interval, or over
//! a round), the guest may dirty an eighth of the link's measured rate
//! ([`QUOTA_SHARE`]), per quota interval (100 ms unless the operator sets
//! another, even mid-migration). A vCPU that dirties its quota sleeps until
//! the next interval; one that reads, or writes little, never notices.
//!
//! **Why an eighth.** Every byte the guest dirties is a byte precopy sends
//! again, while the guest is still held. Dirtying at a share s of the link,
//! precopy takes about 1 / (1 − s) of one copy of memory: 2× at a half,
//! 1.14× at an eighth. So a writer that outruns the link gets more done over
//! any span that includes the migration when it is held harder: it loses a
//! little during a migration that ends sooner, and then runs free. A reader
//! loses nothing at any share, which is what the quota gives over a time
//! throttle. Measured on this project's kvm host (`bench converge`, the
//! three cells of issue #26), an eighth took each cell in well under the
//! time a half took (docs/results.md, "The quota's budget"). The seed's own
//! table A ends in 1.2–1.7 copies. dirty-limit keeps QEMU's half; in the
//! third cell its time throttle held the writers well below that.
//!
//! The budget is split between the vCPUs by what each needs, not equally
//! (max-min fairness, by water-filling): at each interval, a vCPU that
//! dirtied less than an equal share keeps what it used plus headroom, and
//! what it leaves goes to the vCPUs that used up their quotas. So a reader
//! leaves its share to the writers, and a vCPU that starts writing uses up
//! its small quota and gets an equal share at the next interval. Where a
//! sample has no per-vCPU count, the last split is scaled to the budget.
//!
//! **The full pass.** With harvests within rounds (`session::within_round`),
//! a page dirtied ahead of the send cursor goes out once (the full pass
//! leaves it for the next round). So while the full pass runs, only the
//! writes behind the cursor cost a resend, and the budget is divided by
//! their share of the guest's writes (at most [`FULL_PASS_ALLOWANCE`]-fold):
//! about the same resend as a plain budget throughout. The harvests measure
//! that share: each counts the pages it finds dirty that the pass had sent
//! and not yet carried ([`Sample::resends_found`]), against what the meter
//! counted. So it is the marginal cost of the guest's writes: a page found
//! again once carried costs nothing more in this pass. For writes spread
//! over memory it is the share sent, which is the estimate's prior. A
//! writer sweeping a set larger than it rewrites in a second (the SVM
//! host's checker: 128 MiB) costs nothing while the set lies ahead of the
//! cursor, and a resend a page once the cursor has passed it; one that
//! rewrites a small set costs once per page, and then writes for free. A
//! zero page the pass skipped and the guest then writes counts as a
//! resend, though it would have gone once anyway: an overstatement, on
//! the side of holding the guest. Without harvests within rounds, every
//! page dirtied in the pass is sent again, so the budget stays plain.
//! (Earlier the allowance also
//! went, without them, to a vCPU fast enough to dirty its share of memory
//! before the pass ended: it then dirtied all of it, where the plain budget
//! would have held it to an eighth of what the pass sent. On kvm that cost
//! a full resend of the third cell's 1 GiB.)

use super::share::LinkShare;
use super::{Action, Policy, Sample};
use ferry_vm::{Quota, PAGE_SIZE, QUOTA_LONGEST_SLEEPS};
use std::time::Duration;

/// A vCPU below its equal share gets what it dirtied times this.
const HEADROOM: f64 = 1.25;
/// A vCPU that dirtied this share of its quota counts as wanting more: it
/// asks for twice its quota (so a vCPU that starts writing grows to an
/// equal share within a few intervals, and one that only brushes its
/// quota does not swing between the floor and an equal share).
const SATURATED: f64 = 0.8;
/// A sample shorter than this share of the quota interval is too short to
/// tell what a vCPU needs; the last split stands, scaled to the budget.
const SHORTEST_WINDOW: f64 = 0.5;
/// The least a vCPU gets, as a share of an equal split: one that starts
/// writing is never held to nothing for an interval.
const FLOOR_SHARE: f64 = 0.125;
/// The least a vCPU gets per quota interval, in pages, however slow the
/// link (but never over an equal split): what a vCPU dirties by running at
/// all. Under nested paging the processor's walks of the guest's page
/// tables count as writes (AMD's NPT; EPT with A/D bits), so after each
/// harvest re-protects them a vCPU that only reads dirties the page-table
/// pages it walks, and its stack or counters. Measured inside the SVM host
/// (`ferry-kvm-memstress`'s `reader_dirt` test): two memstress readers
/// dirty 4 pages per harvest between them (PML4, PDPT, PD and their
/// progress record); the precopy source harvests once per interval and at
/// each round's end, several times per interval in the last short rounds.
/// Under shadow paging (kvm_pvm) the same readers dirty 1.
const FLOOR_PAGES: f64 = 16.0;
/// Most the budget grows in the full pass (see the module's doc).
const FULL_PASS_ALLOWANCE: f64 = 8.0;
/// What the full pass's measured resend share forgets per policy sample
/// (at 100 ms intervals, half of it in about 300 ms): it follows the
/// cursor onto a hot set within a second.
const COST_DECAY: f64 = 0.8;
/// How much the prior of the measured resend share weighs, in bytes
/// metered: 64 pages. The decay keeps about five intervals of the meter,
/// so the prior matters only for a guest that dirties under about 500
/// KiB/s, where the allowance hardly matters either.
const COST_PRIOR_BYTES: f64 = 64.0 * PAGE_SIZE as f64;
/// The share of the link the quota gives the guest once it engages, in
/// 1/1024ths: an eighth (see the module's doc).
pub const QUOTA_SHARE: u64 = 128;
/// A guest that dirties more than this many times its quota outruns it...
const OUTRUN_QUOTA: f64 = 2.0;
/// ...where that is also more than this share of the link: a rate the
/// resends feel. (An idle guest that brushes a small quota does not
/// count.)
const OUTRUN_LINK_SHARE: f64 = 0.25;
/// Windows in a row that outrun the quota before the longest sleep
/// doubles...
const OUTRUN_WINDOWS: u32 = 2;
/// ...each at least this many policy intervals long: a guest held by the
/// quota writes in bursts, between sleeps longer than an interval.
const OUTRUN_WINDOW_INTERVALS: f64 = 3.0;

/// How much of the guest's writing in the full pass costs a resend, as
/// the harvests within it measure it (see the module's doc).
#[derive(Debug, Default)]
struct FullPassCost {
    /// Bytes the harvests found that the pass had read already, each
    /// sample's weight decaying by [`COST_DECAY`]...
    resent: f64,
    /// ...and the bytes the meter counted, weighted alike.
    metered: f64,
}

impl FullPassCost {
    /// Takes in `s`'s harvest and meter (every sample the policy is told,
    /// engaged or not); forgets all outside the full pass.
    fn observe(&mut self, s: &Sample) {
        if !s.harvests_within_rounds() || s.full_pass_unsent() == 0.0 {
            *self = FullPassCost::default();
            return;
        }
        if let Some(resent) = s.resends_found {
            let metered = s.vcpu_dirty_bytes.iter().sum::<u64>().max(resent);
            self.resent = self.resent * COST_DECAY + resent as f64;
            self.metered = self.metered * COST_DECAY + metered as f64;
        }
    }

    /// The budget's factor for `s`: with harvests within rounds, in the
    /// full pass, 1 / (the share of the guest's writes that cost a resend),
    /// at most [`FULL_PASS_ALLOWANCE`]; otherwise 1. The share is
    /// measured, with the share of memory sent as its prior (what it is
    /// for writes spread over memory) worth [`COST_PRIOR_BYTES`].
    fn allowance(&self, s: &Sample) -> f64 {
        let unsent = s.full_pass_unsent();
        if !s.harvests_within_rounds() || unsent == 0.0 {
            return 1.0;
        }
        let prior = 1.0 - unsent;
        let share = (self.resent + prior * COST_PRIOR_BYTES) / (self.metered + COST_PRIOR_BYTES);
        1.0 / share.max(1.0 / FULL_PASS_ALLOWANCE)
    }
}

/// The quota policy's state.
#[derive(Debug)]
pub struct QuotaPolicy {
    share: LinkShare,
    /// The last split, in bytes per second per vCPU.
    last: Vec<f64>,
    /// Bytes dirtied and seconds in the window being read.
    window: (u64, f64),
    /// Windows in a row whose guest outran its quota.
    outrun_windows: u32,
    /// Doublings of the longest sleep for a quota the guest outran.
    held_harder: u32,
    /// The full pass's resend share, for its allowance.
    cost: FullPassCost,
}

impl Default for QuotaPolicy {
    fn default() -> Self {
        QuotaPolicy {
            share: LinkShare::starting_at(QUOTA_SHARE),
            last: Vec::new(),
            window: (0, 0.0),
            outrun_windows: 0,
            held_harder: 0,
            cost: FullPassCost::default(),
        }
    }
}

/// Splits `total` bytes per second between vCPUs that need `demand[i]`
/// (`None`: as much as they can get): max-min fair, any surplus shared out
/// equally as headroom. Each gets at least `least` (bytes per second),
/// capped at an equal split, and at least [`FLOOR_SHARE`] of an equal split.
fn split(total: f64, least: f64, demand: &[Option<f64>]) -> Vec<f64> {
    let n = demand.len();
    if n == 0 {
        return Vec::new();
    }
    let equal = total / n as f64;
    let floor = (equal * FLOOR_SHARE).max(least.min(equal));
    let mut alloc = vec![0.0; n];
    let mut open: Vec<usize> = (0..n).collect();
    let mut left = total;
    while !open.is_empty() {
        let fair = left / open.len() as f64;
        let needs = |i: usize| demand[i].map(|d| d.max(floor));
        let (met, rest): (Vec<usize>, Vec<usize>) = open
            .iter()
            .partition(|&&i| needs(i).is_some_and(|d| d < fair));
        if met.is_empty() {
            rest.iter().for_each(|&i| alloc[i] = fair);
            return alloc;
        }
        for i in met {
            alloc[i] = needs(i).unwrap_or(fair);
            left -= alloc[i];
        }
        open = rest;
    }
    alloc.iter_mut().for_each(|a| *a += left / n as f64);
    alloc
}

impl QuotaPolicy {
    /// Each vCPU's need from its count in `s`, or `None` without a count.
    fn demand(&self, s: &Sample) -> Option<Vec<Option<f64>>> {
        let secs = s.elapsed.as_secs_f64();
        let window = s.quota_interval.as_secs_f64() * SHORTEST_WINDOW;
        if s.vcpu_dirty_bytes.len() != s.vcpus as usize || secs < window {
            return None;
        }
        let demand = s.vcpu_dirty_bytes.iter().enumerate().map(|(i, &bytes)| {
            let rate = bytes as f64 / secs;
            match self.last.get(i) {
                Some(&q) if rate >= q * SATURATED => Some(q * 2.0),
                Some(_) => Some(rate * HEADROOM),
                // Not throttled yet: what it dirtied is what it wants.
                None => Some(rate * HEADROOM),
            }
        });
        Some(demand.collect())
    }

    /// The quotas for a budget of `per_vcpu` bytes per second per vCPU,
    /// grown by the full-pass allowance (the split then gives it to those
    /// that use it).
    fn quotas(&mut self, s: &Sample, per_vcpu: f64) -> Action {
        let n = s.vcpus.max(1) as usize;
        let per_vcpu = per_vcpu * self.cost.allowance(s);
        let total = per_vcpu * n as f64;
        let least = FLOOR_PAGES * PAGE_SIZE as f64 / s.quota_interval.as_secs_f64();
        let rates = match self.demand(s) {
            Some(demand) => split(total, least, &demand),
            None if self.last.len() == n => {
                let before: f64 = self.last.iter().sum();
                let scale = if before > 0.0 { total / before } else { 1.0 };
                self.last.iter().map(|r| r * scale).collect()
            }
            None => vec![per_vcpu; n],
        };
        let secs = s.quota_interval.as_secs_f64();
        let bytes = rates.iter().map(|r| (r * secs) as u64).collect();
        self.last = rates;
        let quota = Quota::new(bytes, s.quota_interval).with_longest_sleep(self.longest_sleep());
        Action::Quota(Some(quota))
    }

    /// The longest sleep the quota may hold a vCPU to: the shortest
    /// [`QUOTA_LONGEST_SLEEPS`] allows, doubled at each round that ended
    /// with the guest still outrunning the link, or each time it outran
    /// its quota ([`QuotaPolicy::watch_outrun`]), whichever doubled more.
    /// A quota a vCPU's slices outrun holds it no harder than a slice
    /// between two such sleeps allows; so a writer that outruns the link
    /// round after round is held harder each round, and a guest the quota
    /// engaged on for a burst (an idle one, at its working set) keeps the
    /// short sleeps. The holds stay to the end: lifted near it (in rounds
    /// that left under four downtime targets to send), a writer held
    /// behind its pace caught up at once, above the link, and the last
    /// rounds grew again (docs/svm-host-runs.md, "The quota engages sooner in
    /// the full pass"). The settle (`settle`) lets a held guest run before
    /// the pause.
    fn longest_sleep(&self) -> Duration {
        let shortest = *QUOTA_LONGEST_SLEEPS.start();
        let doublings = self.share.halvings().max(self.held_harder);
        shortest.saturating_mul(1 << doublings.min(8))
    }

    /// Reads the guest's dirtying in windows of [`OUTRUN_WINDOW_INTERVALS`]
    /// policy intervals: where it dirtied more than [`OUTRUN_QUOTA`] times
    /// its quota, and more than [`OUTRUN_LINK_SHARE`] of the link, in
    /// [`OUTRUN_WINDOWS`] windows in a row, the longest sleep doubles.
    ///
    /// Why not wait for the rounds: a guest whose short sleeps let it dirty
    /// several times its quota may still dirty less than half the link, so
    /// its rounds shrink, slowly, and the share never halves. Inside the
    /// SVM host the writing cell's Linux guest dirtied 4-6 MB/s against a
    /// quota of 1 MB/s on an 8 MiB/s link, round after round at 50 ms
    /// sleeps: each round about half the last, 9 rounds.
    fn watch_outrun(&mut self, s: &Sample) {
        if self.last.is_empty() || s.vcpu_dirty_bytes.len() != s.vcpus as usize {
            self.window = (0, 0.0);
            return;
        }
        self.window.0 += s.vcpu_dirty_bytes.iter().sum::<u64>();
        self.window.1 += s.elapsed.as_secs_f64();
        let (bytes, secs) = self.window;
        if secs < s.quota_interval.as_secs_f64() * OUTRUN_WINDOW_INTERVALS {
            return;
        }
        self.window = (0, 0.0);
        let rate = bytes as f64 / secs;
        let quota: f64 = self.last.iter().sum();
        let outran = rate > quota * OUTRUN_QUOTA && rate > s.link_bytes_per_sec * OUTRUN_LINK_SHARE;
        self.outrun_windows = match outran {
            true => self.outrun_windows + 1,
            false => 0,
        };
        if self.outrun_windows >= OUTRUN_WINDOWS {
            self.outrun_windows = 0;
            let most = (QUOTA_LONGEST_SLEEPS.end().as_millis()
                / QUOTA_LONGEST_SLEEPS.start().as_millis().max(1))
            .ilog2();
            self.held_harder = (self.held_harder + 1).min(most);
        }
    }
}

impl Policy for QuotaPolicy {
    fn name(&self) -> &'static str {
        "quota"
    }

    fn decide(&mut self, s: &Sample) -> Option<Action> {
        self.watch_outrun(s);
        self.cost.observe(s);
        let per_vcpu = self.share.decide(s)?;
        Some(self.quotas(s, per_vcpu))
    }

    fn engage(&mut self, s: &Sample) -> Option<Action> {
        let per_vcpu = self.share.engage(s)?;
        Some(self.quotas(s, per_vcpu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converge::sample::{interval, sample};

    fn bytes(a: Option<Action>) -> Vec<u64> {
        match a {
            Some(Action::Quota(Some(q))) => q.bytes,
            other => panic!("no quota: {other:?}"),
        }
    }

    #[test]
    fn engages_on_the_first_outrun_round_and_halves_while_outrun() {
        let mut q = QuotaPolicy::default();
        assert_eq!(q.decide(&sample(0, 900, 100)), None, "the full pass");
        assert_eq!(q.decide(&sample(1, 40, 100)), None, "below half");
        // 1 GB/s × 100 ms / 8 / 2 vCPUs = 6.25 MB each, with no count.
        let first = bytes(q.decide(&sample(2, 60, 100)));
        assert_eq!(first.len(), 2);
        assert!((6_200_000..=6_250_000).contains(&first[0]), "{first:?}");
        let second = bytes(q.decide(&sample(3, 60, 100)));
        assert!(
            (second[0] as f64 - first[0] as f64 / 2.0).abs() < 20_000.0,
            "{second:?}"
        );
        // Converging: the share holds, the quota follows the link.
        assert_eq!(bytes(q.decide(&sample(4, 10, 100))), second);
        assert_eq!(q.engage(&sample(5, 10, 100)), None, "already on");
    }

    fn longest_sleep(a: Option<Action>) -> Duration {
        match a {
            Some(Action::Quota(Some(q))) => q.longest_sleep,
            other => panic!("no quota: {other:?}"),
        }
    }

    #[test]
    fn the_longest_sleep_doubles_with_each_round_that_outruns_the_link() {
        let ms = Duration::from_millis;
        let mut q = QuotaPolicy::default();
        assert_eq!(
            longest_sleep(q.decide(&sample(1, 60, 100))),
            ms(50),
            "engaged"
        );
        assert_eq!(
            longest_sleep(q.decide(&sample(2, 60, 100))),
            ms(100),
            "outrun"
        );
        // A converging round leaves it; more outrun rounds take it to the
        // most a quota may ask, and no further.
        assert_eq!(longest_sleep(q.decide(&sample(3, 10, 100))), ms(100));
        for round in 4..12 {
            let held = longest_sleep(q.decide(&sample(round, 60, 100)));
            assert!(held <= *QUOTA_LONGEST_SLEEPS.end(), "{held:?}");
        }
        assert_eq!(
            longest_sleep(q.decide(&sample(12, 60, 100))),
            *QUOTA_LONGEST_SLEEPS.end()
        );
    }

    #[test]
    fn a_guest_that_outruns_its_quota_interval_after_interval_is_held_harder() {
        let ms = Duration::from_millis;
        let mut q = QuotaPolicy::default();
        // Engaged: 1 GB/s over a 1 GB/s link; the quota is 125 MB/s.
        let engaged = q.decide(&interval(0, &[50_000_000, 50_000_000]));
        assert_eq!(longest_sleep(engaged), ms(50));
        // 400 MB/s: over twice the quota and a quarter of the link.
        let outrun = || interval(0, &[20_000_000, 20_000_000]);
        let held: Vec<Duration> = (0..9).map(|_| longest_sleep(q.decide(&outrun()))).collect();
        // Windows of 3 intervals, two of them in a row.
        assert_eq!(held[..5], [ms(50); 5], "{held:?}");
        assert_eq!(held[5], ms(100), "{held:?}");
        let held: Vec<Duration> = (0..18)
            .map(|_| longest_sleep(q.decide(&outrun())))
            .collect();
        assert_eq!(held[5], ms(200), "{held:?}");
        assert_eq!(held[17], *QUOTA_LONGEST_SLEEPS.end(), "never past it");
        // A round's end that leaves little to send keeps them.
        let mut end = crate::converge::sample::sample(1, 1_000_000, 100_000_000);
        end.downtime_target = ms(300);
        assert_eq!(longest_sleep(q.decide(&end)), ms(200), "near the end too");
        // One within twice its quota keeps the short sleeps.
        let mut q = QuotaPolicy::default();
        q.decide(&interval(0, &[50_000_000, 50_000_000]));
        for _ in 0..6 {
            let sleep = longest_sleep(q.decide(&interval(0, &[12_000_000, 12_000_000])));
            assert_eq!(sleep, ms(50), "240 MB/s against a 125 MB/s quota");
        }
    }

    #[test]
    fn a_reader_leaves_its_share_to_the_writer_until_it_writes() {
        let mut q = QuotaPolicy::default();
        // vCPU 0 writes 100 MB in 100 ms (1 GB/s), vCPU 1 only reads: the
        // budget is an eighth of 1 GB/s, 12.5 MB per interval.
        let first = bytes(q.decide(&interval(0, &[100_000_000, 0])));
        let floor = 12_500_000 / 2 / 8;
        assert!(first[1] >= floor && first[1] < floor + 1000, "{first:?}");
        assert_eq!(first[0] + first[1], 12_500_000, "{first:?}");
        // The writer used up its quota: it still wants more; the reader
        // keeps its floor.
        let held = bytes(q.decide(&interval(0, &[first[0], 0])));
        assert_eq!(held, first);
        // The reader starts writing and uses up its quota: it doubles at
        // each interval until the two share equally.
        let mut reader = vec![first[1]];
        for _ in 0..4 {
            let last = *reader.last().unwrap();
            let next = bytes(q.decide(&interval(0, &[first[0], last])));
            assert_eq!(next[0] + next[1], 12_500_000, "{next:?}");
            reader.push(next[1]);
        }
        assert_eq!(reader[1], 2 * reader[0], "{reader:?}");
        assert_eq!(reader[2], 4 * reader[0], "{reader:?}");
        assert_eq!(reader[4], 6_250_000, "{reader:?}");
    }

    #[test]
    fn a_window_too_short_to_measure_keeps_the_split() {
        let mut q = QuotaPolicy::default();
        let first = bytes(q.decide(&interval(0, &[100_000_000, 0])));
        let mut short = interval(0, &[0, 5_000_000]);
        short.elapsed = std::time::Duration::from_millis(5);
        assert_eq!(bytes(q.decide(&short)), first);
    }

    /// With harvests within rounds, in the full pass and with no resend
    /// measured, the budget is divided by the share of memory sent (at
    /// most eightfold); at a harvest, and after the pass, it is plain.
    #[test]
    fn the_full_pass_allows_more_while_little_is_sent() {
        let budget = |unsent: u64, round: u32, harvest: bool| -> u64 {
            let mut q = QuotaPolicy::default();
            let mut s = interval(round, &[100_000_000, 100_000_000]);
            s.guest_bytes = 1000;
            s.remaining_bytes = unsent;
            s.within_round_found = Some(200_000_000);
            if harvest {
                s.round_end = Some(crate::converge::sample::RoundEnd {
                    dirty_bytes: 200_000_000,
                    sent_bytes: 1000,
                });
            }
            bytes(q.decide(&s)).iter().sum()
        };
        let plain = budget(0, 1, false);
        assert_eq!(plain, 12_500_000, "125 MB/s over 100 ms");
        assert_eq!(budget(0, 0, false), plain, "the pass is over");
        assert_eq!(budget(500, 0, false), 2 * plain, "half sent");
        assert_eq!(budget(1000, 0, false), 8 * plain, "nothing sent: capped");
        assert_eq!(budget(950, 0, false), 8 * plain, "5% sent: capped");
        assert_eq!(budget(500, 1, true), plain, "at a harvest");
    }

    /// The allowance follows the resends the harvests find, whatever the
    /// share sent: a guest writing ahead of the cursor (a set the pass has
    /// not reached) costs none and gets all of it; one sweeping pages the
    /// pass has sent, each for the first time since, costs a resend per
    /// page and is held to the plain budget within a second; and back.
    #[test]
    fn the_full_pass_allowance_follows_the_resends_its_harvests_find() {
        let plain = 12_500_000u64;
        let step = |q: &mut QuotaPolicy, resent: u64| -> u64 {
            let mut s = interval(0, &[100_000_000, 100_000_000]);
            s.guest_bytes = 1000;
            s.remaining_bytes = 500;
            s.within_round_found = Some(200_000_000);
            s.resends_found = Some(resent);
            bytes(q.decide(&s)).iter().sum()
        };
        let mut q = QuotaPolicy::default();
        assert_eq!(step(&mut q, 0), 8 * plain, "ahead: no resend");
        let behind: Vec<u64> = (0..10).map(|_| step(&mut q, 200_000_000)).collect();
        assert!(behind[0] < 2 * plain, "at once under a quarter: {behind:?}");
        assert!(behind.windows(2).all(|w| w[1] <= w[0]), "{behind:?}");
        assert!(behind[9] < plain * 11 / 10, "behind: plain {behind:?}");
        // Half of its writes behind: about twice the plain budget.
        let half = (0..30).map(|_| step(&mut q, 100_000_000)).last().unwrap();
        assert!(half.abs_diff(2 * plain) < plain / 20, "{half}");
        let ahead = (0..30).map(|_| step(&mut q, 0)).last().unwrap();
        assert_eq!(ahead, 8 * plain, "ahead again");
    }

    #[test]
    fn without_harvests_within_rounds_the_full_pass_gets_no_allowance() {
        // 2 vCPUs over 1 GB/s, nothing sent of 1 GB.
        let budget = |per_100ms: u64, within: bool| -> u64 {
            let mut q = QuotaPolicy::default();
            let mut s = interval(0, &[per_100ms, per_100ms]);
            s.guest_bytes = 1_000_000_000;
            s.remaining_bytes = 1_000_000_000;
            s.within_round_found = within.then_some(2 * per_100ms);
            bytes(q.decide(&s)).iter().sum()
        };
        let plain = 12_500_000;
        // Every page dirtied in the pass is sent again, however fast the
        // writer: held to the plain budget, it dirties an eighth of what
        // the pass sends; let loose, all of its share.
        // (At least an eighth of memory in one interval, so that it engages.)
        assert_eq!(budget(70_000_000, false), plain);
        assert_eq!(budget(600_000_000, false), plain);
        // With harvests within rounds, writes ahead of the cursor are free.
        assert_eq!(budget(70_000_000, true), 8 * plain);
    }

    #[test]
    fn on_a_slow_link_a_reader_still_gets_what_running_dirties() {
        // 16 MB/s: the budget is 200 kB per interval, 100 kB each; an
        // eighth of that (12.5 kB) is less than a vCPU's page-table walks
        // after a few harvests. The reader gets FLOOR_PAGES, the writer
        // the rest.
        let mut q = QuotaPolicy::default();
        let mut s = interval(0, &[10_000_000, 0]);
        s.link_bytes_per_sec = 16_000_000.0;
        let got = bytes(q.decide(&s));
        let least = (FLOOR_PAGES * PAGE_SIZE as f64) as u64;
        assert!(got[1].abs_diff(least) <= 1, "{got:?}");
        assert!(got[0] + got[1] <= 200_000, "{got:?}");
        // Never more than an equal split, however many readers.
        let split = split(100.0, 1000.0, &[Some(0.0), Some(0.0), None]);
        assert!(
            split.iter().all(|&r| (r - 100.0 / 3.0).abs() < 1e-9),
            "{split:?}"
        );
    }

    #[test]
    fn the_split_is_max_min_fair() {
        let s = split(300.0, 0.0, &[Some(10.0), None, Some(500.0)]);
        assert_eq!(s, vec![12.5, 143.75, 143.75]);
        // Everyone's need met (12.5, 20, 30): the surplus is shared out.
        let surplus = split(300.0, 0.0, &[Some(10.0), Some(20.0), Some(30.0)]);
        assert!(
            (surplus.iter().sum::<f64>() - 300.0).abs() < 1e-9,
            "{surplus:?}"
        );
        assert!((surplus[2] - surplus[1] - 10.0).abs() < 1e-9, "{surplus:?}");
        assert!((surplus[1] - surplus[0] - 7.5).abs() < 1e-9, "{surplus:?}");
    }
}
