//! Guest progress rates: passes, pages and bytes per second per vCPU, computed
//! from two snapshots of the progress records the guest publishes in memory.

use ferry_memstress::VcpuProgress;
use ferry_vm::PAGE_SIZE;
use serde::Serialize;
use std::time::Duration;

/// One vCPU's rates over an interval.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct VcpuRate {
    pub passes_per_s: f64,
    pub pages_per_s: f64,
    pub bytes_per_s: f64,
    pub writes_per_s: f64,
}

/// Rates of each vCPU between `before` and `after`, `dt` apart.
///
/// Pages are counted when a pass completes, so over intervals shorter than a
/// pass the rate is lumpy; passes/s is exact.
pub fn rates(before: &[VcpuProgress], after: &[VcpuProgress], dt: Duration) -> Vec<VcpuRate> {
    let secs = dt.as_secs_f64().max(1e-9);
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let pages = a.accesses.saturating_sub(b.accesses) as f64;
            VcpuRate {
                passes_per_s: a.passes.saturating_sub(b.passes) as f64 / secs,
                pages_per_s: pages / secs,
                bytes_per_s: pages * PAGE_SIZE as f64 / secs,
                writes_per_s: a.writes.saturating_sub(b.writes) as f64 / secs,
            }
        })
        .collect()
}

/// One line per vCPU, for terminals.
pub fn describe(rates: &[VcpuRate]) -> String {
    rates
        .iter()
        .enumerate()
        .map(|(i, r)| {
            format!(
                "vcpu{i}: {:.1} passes/s, {:.0} pages/s, {:.1} MiB/s",
                r.passes_per_s,
                r.pages_per_s,
                r.bytes_per_s / (1 << 20) as f64
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_from_deltas() {
        let b = [VcpuProgress {
            passes: 1,
            accesses: 100,
            ..Default::default()
        }];
        let a = [VcpuProgress {
            passes: 3,
            accesses: 300,
            ..Default::default()
        }];
        let r = rates(&b, &a, Duration::from_secs(2));
        assert_eq!(r[0].passes_per_s, 1.0);
        assert_eq!(r[0].pages_per_s, 100.0);
        assert_eq!(r[0].bytes_per_s, 100.0 * 4096.0);
    }
}
