//! What device state costs at the pause besides the link: the source saving
//! and encoding its sections, the destination decoding and loading them.
//! The downtime prediction counts it at a rate: the one measured at this
//! kind of VM's previous switchover in this process (a VMM migrating a VM
//! again, or the next VM of its kind), else a calibrated default.
//!
//! Only a switchover that carried at least [`MIN_MEASURED_BYTES`] teaches a
//! rate: below that the fixed costs of a switchover (in
//! `precopy::downtime::SWITCH_OVERHEAD`) drown the per-byte one.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// The rate the prediction assumes before a VM's first large switchover:
/// save, encode, decode and load, end to end. Measured on this project's
/// kvm host with the engine's test VM and its 256 MiB device (release
/// build, `tests/device_cost.rs`, six switchovers), and taken low in the
/// range of rates those switchovers showed, since a rate too high breaks
/// the downtime promise and one too low only costs a round. A VMM whose
/// devices save faster teaches its own rate at its first large switchover.
pub const DEVICE_STATE_BYTES_PER_SEC: f64 = 0.25e9;
/// The least device state whose switchover teaches a rate.
pub const MIN_MEASURED_BYTES: u64 = 1 << 20;

static MEASURED: Mutex<BTreeMap<String, f64>> = Mutex::new(BTreeMap::new());

/// The rate the prediction uses for a VM of kind `vmm`, in bytes per
/// second.
pub fn rate(vmm: &str) -> f64 {
    let measured = MEASURED.lock().unwrap_or_else(|e| e.into_inner());
    measured
        .get(vmm)
        .copied()
        .unwrap_or(DEVICE_STATE_BYTES_PER_SEC)
}

/// A switchover of a `vmm` VM saved, sent and loaded `bytes` of device
/// state, whose save and load took `took` in all: remembered for its next
/// one. Returns the rate, if it taught one.
pub(crate) fn record(vmm: &str, bytes: u64, took: Duration) -> Option<f64> {
    if bytes < MIN_MEASURED_BYTES || took.is_zero() {
        return None;
    }
    let r = bytes as f64 / took.as_secs_f64();
    let mut measured = MEASURED.lock().unwrap_or_else(|e| e.into_inner());
    measured.insert(vmm.to_string(), r);
    Some(r)
}

/// The time `bytes` of device state take at `rate`, beyond the link.
pub fn cost(bytes: u64, rate: f64) -> Duration {
    Duration::from_secs_f64((bytes as f64 / rate.max(1.0)).min(1e6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_switchover_teaches_its_kind_a_rate_and_a_small_one_does_not() {
        let kind = "device-cost-test-vmm";
        assert_eq!(rate(kind), DEVICE_STATE_BYTES_PER_SEC);
        assert_eq!(record(kind, 1000, Duration::from_millis(1)), None);
        assert_eq!(rate(kind), DEVICE_STATE_BYTES_PER_SEC);
        let r = record(kind, 100 << 20, Duration::from_secs(1)).unwrap();
        assert_eq!(r, (100u64 << 20) as f64);
        assert_eq!(rate(kind), r);
        assert_eq!(rate("another-kind"), DEVICE_STATE_BYTES_PER_SEC);
        assert_eq!(cost(r as u64, r), Duration::from_secs(1));
    }
}
