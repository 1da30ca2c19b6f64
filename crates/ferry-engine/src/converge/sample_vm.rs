//! Predicting a migration of any VM: sample its dirtying through its own
//! dirty logs, then ask the model ([`super::predict`]) what each policy the
//! VM serves would do.
//!
//! ```text
//!   start every dirty log ─ harvest after 10 ms, after 90 ms, ... for SECS ─ stop
//!   rate per vCPU  = the pages the 10 ms windows found × 4 KiB / their time
//!                    (see SAMPLE_SLICE), each vCPU's by its share of the
//!                    VM's per-vCPU counts (Vm::dirtied) where it keeps
//!                    them, else shared evenly
//!   working set    = from the distinct pages dirtied by mid-sample and by
//!                    its end (see working_set_pages): a guest still meeting
//!                    new pages at the end may dirty all of memory
//!   data bytes     = the pages that are not all zero (the full pass sends a
//!                    zero page as a bit)
//!   burst per vCPU = then BURST_WINDOW under a time throttle of
//!                    BURST_THROTTLE %: what each vCPU dirtied per second it
//!                    was let run (see sample_burst), where the VM throttles
//! ```
//!
//! A guest that counts its own writes can do better (every write, rewrites
//! of a page within a harvest included): its VMM builds the [`DirtySample`]
//! itself and calls [`predict_vm`] with it, as ferry's own VMs do.

use super::{predict, ConvergeMode};
use crate::error::MigrationError;
use crate::summary::{PredictInput, Prediction};
use ferry_vm::is_zero_page;
use ferry_vm::{DirtyPages, Gfn, GuestRam, RamError, Vm, PAGE_SIZE};
use std::time::{Duration, Instant};

/// The sample harvests alternately after a time throttle's slice and
/// after a policy interval. The slice-long windows give each vCPU's rate:
/// what it dirties in the first slice after its pages are protected, which
/// is what a throttled vCPU dirties per slice it is let run. A writer that
/// re-dirties its whole working set within that (the soft MMU's do, well
/// within a slice: docs/convergence.md, "The prediction") shows a rate of
/// its set per slice, and the model knows no time throttle holds it; a
/// writer held by its faults shows its own. The longer windows let slower
/// writers spread over memory show their reach.
const SAMPLE_SLICE: Duration = ferry_vm::THROTTLE_SLICE;
const SAMPLE_HARVEST: Duration = Duration::from_millis(90);

/// What a sample of a running guest's dirtying found.
#[derive(Clone, Debug, PartialEq)]
pub struct DirtySample {
    /// Per vCPU: bytes dirtied per second with dirty tracking on.
    pub dirty_bytes_per_sec: Vec<f64>,
    /// Per vCPU: the most bytes it can have dirtied at once.
    pub working_set_bytes: Vec<u64>,
    /// Per vCPU: bytes dirtied per second of running under a time throttle
    /// (empty where the VM has none).
    pub burst_bytes_per_sec: Vec<f64>,
}

/// What the prediction assumes of the link and the migration's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictSettings {
    /// Guest bytes per second the link moves, if known (a bandwidth cap, a
    /// shaped link); else 1 GiB/s is assumed, and the prediction says so.
    pub link_bytes_per_sec: Option<f64>,
    /// The downtime target.
    pub downtime_target: Duration,
    /// The round cap.
    pub max_rounds: u32,
    /// Whether the engine will harvest within rounds.
    pub harvest_within_rounds: bool,
}

/// The link rate assumed when none is known.
const ASSUMED_LINK: f64 = (1u64 << 30) as f64;

/// Samples the dirtying of the running `vm` for `secs` through every dirty
/// log it has, and stops the logs again.
pub fn sample_dirtying(vm: &mut dyn Vm, secs: Duration) -> Result<DirtySample, MigrationError> {
    crate::dirty_logs::start(vm)?;
    let sampled = sample_logs(vm, secs).and_then(|mut s| {
        s.burst_bytes_per_sec = sample_burst(vm)?;
        Ok(s)
    });
    crate::dirty_logs::stop(vm, "after the prediction's sample");
    sampled
}

/// How long, and under how heavy a time throttle, the sample measures
/// each vCPU's burst: three of the throttle's cycles of a 10 ms slice and a
/// 90 ms sleep.
const BURST_WINDOW: Duration = Duration::from_millis(300);
const BURST_THROTTLE: u8 = 90;

/// Each vCPU's rate while it runs under a time throttle: the pages it
/// dirtied in [`BURST_WINDOW`] at [`BURST_THROTTLE`] % over the time it
/// was let run (the window less the sleep the VM counted; a tenth of it
/// where the VM counts none). Empty where the VM has no time throttle.
///
/// A vCPU held by its faults dirties as fast in a slice after a sleep as
/// in any other. One that paces its work by the clock does not: asleep,
/// it falls behind, and in its slices it catches up as fast as it can.
/// Measured on kvm, a writer paced at 200 MiB/s dirtied several times that
/// per slice under dirty-limit's throttle, and the model, which ran it at
/// its pace, predicted the migration far too slow (docs/convergence.md,
/// "The prediction").
fn sample_burst(vm: &mut dyn Vm) -> Result<Vec<f64>, MigrationError> {
    let vcpus = vm.vcpus().max(1) as usize;
    let Some(throttle) = vm.time_throttle() else {
        return Ok(Vec::new());
    };
    let slept_before = throttle.throttled();
    let mut found = DirtyPages::new(vm.ram().pages());
    // Protects every page again, so the window counts only its own.
    crate::dirty_logs::collect(vm, &mut found)?;
    let counts = super::dirtied(vm);
    let start = Instant::now();
    let set = |vm: &mut dyn Vm, pct| match vm.time_throttle() {
        Some(t) => t.set_time_throttle(pct),
        None => Ok(()),
    };
    set(vm, BURST_THROTTLE).map_err(MigrationError::backend("throttle the sample"))?;
    std::thread::sleep(BURST_WINDOW);
    found.clear();
    let took = start.elapsed();
    let collected = crate::dirty_logs::collect(vm, &mut found);
    let slept_after = vm
        .time_throttle()
        .map(|t| t.throttled())
        .unwrap_or_default();
    set(vm, 0).map_err(MigrationError::backend("release the sample's throttle"))?;
    collected?;
    let shares = count_shares(&counts, &super::dirtied(vm), vcpus);
    let nominal = took.mul_f64(1.0 - f64::from(BURST_THROTTLE) / 100.0);
    Ok((0..vcpus)
        .map(|v| {
            let ran = match (slept_before.get(v), slept_after.get(v)) {
                (Some(b), Some(a)) => took.saturating_sub(a.saturating_sub(*b)),
                _ => nominal,
            };
            let bytes = found.count() as f64 * shares[v] * PAGE_SIZE as f64;
            bytes / ran.as_secs_f64().max(1e-3)
        })
        .collect())
}

/// [`sample_dirtying`] once the logs run.
fn sample_logs(vm: &mut dyn Vm, secs: Duration) -> Result<DirtySample, MigrationError> {
    let vcpus = vm.vcpus().max(1) as usize;
    let pages = vm.ram().pages();
    // What was written before the sample (the VMM's tracked writes since
    // the VM was built, say) is not the guest's rate.
    let mut now = DirtyPages::new(pages);
    crate::dirty_logs::collect(vm, &mut now)?;
    let mut counts = super::dirtied(vm);
    // Per vCPU: pages and seconds in the slice-long windows.
    let (mut slice_pages, mut slice_secs) = (vec![0.0f64; vcpus], 0.0);
    let mut all = DirtyPages::new(pages);
    let mut half = None;
    let start = Instant::now();
    let mut last = Instant::now();
    let mut short = true;
    while start.elapsed() < secs {
        let window = if short { SAMPLE_SLICE } else { SAMPLE_HARVEST };
        std::thread::sleep(window.min(secs.saturating_sub(start.elapsed())));
        now.clear();
        // The window: from the end of the last harvest, which protected the
        // pages again, to the start of this one, which reads what was
        // dirtied since (its own time would otherwise dilute a burst).
        let took = last.elapsed();
        crate::dirty_logs::collect(vm, &mut now)?;
        last = Instant::now();
        let n = now.count() as f64;
        let after = super::dirtied(vm);
        if short {
            // The window's pages, each vCPU's by its share of the count.
            let shares = count_shares(&counts, &after, vcpus);
            for (p, s) in slice_pages.iter_mut().zip(shares) {
                *p += n * s;
            }
            slice_secs += took.as_secs_f64();
        }
        counts = after;
        short = !short;
        all.merge(&now);
        if half.is_none() && start.elapsed() >= secs / 2 {
            half = Some((all.count(), start.elapsed()));
        }
    }
    let took = start.elapsed().as_secs_f64().max(1e-3);
    // The distinct pages at mid-sample, brought to exactly half the time.
    let at_half = half.map_or(all.count() as f64, |(n, t)| {
        n as f64 * (took / 2.0) / t.as_secs_f64().max(1e-3)
    });
    let ram_pages = vm.ram().size() / PAGE_SIZE as u64;
    let working_set = working_set_pages(at_half, all.count(), ram_pages);
    let page = PAGE_SIZE as f64;
    // Each vCPU's share of the working set: of what it dirtied (equal
    // parts where the VM keeps no per-vCPU count, see `count_shares`).
    let total: f64 = slice_pages.iter().sum();
    let shares: Vec<f64> = if total > 0.0 {
        slice_pages.iter().map(|p| p / total).collect()
    } else {
        vec![1.0 / vcpus as f64; vcpus]
    };
    let dirty_bytes_per_sec = slice_pages
        .iter()
        .map(|p| match slice_secs > 0.0 {
            true => p * page / slice_secs,
            false => 0.0,
        })
        .collect();
    Ok(DirtySample {
        dirty_bytes_per_sec,
        working_set_bytes: shares
            .iter()
            .map(|s| (s * working_set as f64 * page) as u64)
            .collect(),
        burst_bytes_per_sec: Vec::new(),
    })
}

/// Each vCPU's share of the pages newly dirtied between two readings of
/// the per-vCPU counts (equal parts where there are none, or no change).
fn count_shares(before: &[u64], after: &[u64], vcpus: usize) -> Vec<f64> {
    if before.len() != vcpus || after.len() != vcpus {
        return vec![1.0 / vcpus as f64; vcpus];
    }
    let per: Vec<u64> = after
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let sum = per.iter().sum::<u64>();
    if sum == 0 {
        return vec![1.0 / vcpus as f64; vcpus];
    }
    per.iter().map(|&p| p as f64 / sum as f64).collect()
}

/// The pages a guest keeps dirtying, from the distinct pages its sample
/// found by half time (`half`) and by the end (`whole`), at most `pages`.
///
/// A guest writing at rate r at random over a set of W pages has dirtied
/// d(t) = W(1 − e^(−rt/W)) distinct pages by time t, so d(T)/d(T/2) =
/// 1 + e^(−rT/2W), which gives W = half² / (2·half − whole). A set the
/// guest had covered by half time gives `whole`; a sweep that met no page
/// twice (whole = 2·half) may go on over all of memory. Taking `whole`
/// alone underestimated a sweeping guest by half when its pass outlasted
/// the sample (the prediction fell well short of the measured time,
/// foreign_guest at 66 MiB).
fn working_set_pages(half: f64, whole: u64, pages: u64) -> u64 {
    let whole_f = whole as f64;
    let spread = 2.0 * half - whole_f;
    if half <= 0.0 || spread <= half * 0.02 {
        return if whole == 0 { 0 } else { pages };
    }
    ((half * half / spread).max(whole_f) as u64).min(pages)
}

/// Predicts a migration of `vm` from `sample`, for every policy the VM
/// serves.
pub fn predict_vm(
    vm: &mut dyn Vm,
    sample: &DirtySample,
    settings: &PredictSettings,
) -> Result<Prediction, MigrationError> {
    let data_bytes = data_bytes(vm.ram()).map_err(MigrationError::ram("read guest memory"))?;
    let input = PredictInput {
        memory_bytes: vm.ram().size(),
        data_bytes,
        dirty_bytes_per_sec: sample.dirty_bytes_per_sec.clone(),
        working_set_bytes: sample.working_set_bytes.clone(),
        burst_bytes_per_sec: sample.burst_bytes_per_sec.clone(),
        link_bytes_per_sec: settings.link_bytes_per_sec.unwrap_or(ASSUMED_LINK),
        link_known: settings.link_bytes_per_sec.is_some(),
        downtime_target_ms: settings.downtime_target.as_secs_f64() * 1e3,
        max_rounds: settings.max_rounds,
        harvest_within_rounds: settings.harvest_within_rounds,
    };
    let mut modes = vec![ConvergeMode::None, ConvergeMode::Auto];
    if vm.time_throttle().is_none() {
        modes.retain(|&m| m != ConvergeMode::Auto);
    }
    if vm.dirty_meter().is_some() {
        modes.extend([ConvergeMode::DirtyLimit, ConvergeMode::Quota]);
    }
    Ok(predict(&input, &modes))
}

/// Bytes of the guest's RAM pages that are not all zero.
pub fn data_bytes(ram: &GuestRam) -> Result<u64, RamError> {
    const CHUNK: u64 = 256;
    let mut buf = vec![0u8; CHUNK as usize * PAGE_SIZE];
    let mut data = 0;
    for slot in ram.slots() {
        let (mut gfn, end) = (slot.first_gfn().0, slot.first_gfn().0 + slot.pages());
        while gfn < end {
            let n = CHUNK.min(end - gfn);
            let chunk = &mut buf[..n as usize * PAGE_SIZE];
            ram.read_pages(Gfn(gfn), chunk)?;
            data += chunk.chunks(PAGE_SIZE).filter(|p| !is_zero_page(p)).count() as u64;
            gfn += n;
        }
    }
    Ok(data * PAGE_SIZE as u64)
}

#[cfg(test)]
mod tests {
    use super::working_set_pages;

    #[test]
    fn a_covered_set_is_what_the_sample_found() {
        assert_eq!(working_set_pages(1000.0, 1000, 1 << 20), 1000);
    }

    #[test]
    fn a_sweep_that_met_no_page_twice_may_cover_all_of_memory() {
        assert_eq!(working_set_pages(1000.0, 2000, 1 << 20), 1 << 20);
        assert_eq!(working_set_pages(0.0, 0, 1 << 20), 0);
    }

    #[test]
    fn random_writes_over_a_set_recover_its_size() {
        // W = 10_000 pages, rT/2W = 1: d(T/2) = W(1 − 1/e), d(T) = W(1 − 1/e²).
        let w = 10_000.0f64;
        let half = w * (1.0 - (-1.0f64).exp());
        let whole = (w * (1.0 - (-2.0f64).exp())) as u64;
        let got = working_set_pages(half, whole, 1 << 20) as f64;
        assert!((got - w).abs() < w * 0.01, "{got}");
    }
}
