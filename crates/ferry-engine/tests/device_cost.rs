//! The downtime prediction learns what device state costs to save and load
//! from a VM's previous switchover: the first large switchover of a kind
//! of VM is counted at the calibrated default, the next at the rate the
//! first showed. Alone in its process, so no other migration teaches the
//! same kind of VM in between.

mod common;

use ferry_engine::device_cost::{rate, DEVICE_STATE_BYTES_PER_SEC};

#[test]
fn the_second_large_switchover_is_predicted_at_the_rate_the_first_showed() {
    let first = common::big_device::move_big_device(false);
    assert_eq!(
        first.devices.device_state_bytes_per_sec, DEVICE_STATE_BYTES_PER_SEC,
        "{first:?}"
    );
    let took = (first.switchover.save_sections_ms + first.switchover.dest_resume_ms) / 1e3;
    let shown = first.devices.device_bytes_at_pause as f64 / took;
    let learned = rate(common::TEST_VMM);
    assert!((learned / shown - 1.0).abs() < 1e-6, "{learned} vs {shown}");
    let second = common::big_device::move_big_device(false);
    assert_eq!(
        second.devices.device_state_bytes_per_sec, learned,
        "{second:?}"
    );
    // 256 MiB at that rate is in the prediction, beside the link's share.
    let cost = second.devices.device_bytes_at_pause as f64 / learned * 1e3;
    assert!(
        second.switchover.predicted_downtime_ms >= cost,
        "{second:?}"
    );
}
