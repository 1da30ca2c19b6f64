//! Device state larger than one frame: sections that declare their size
//! (`SectionSpec::max_bytes`) travel at the pause in parts and load whole;
//! a destination refuses a declared size over its limit before any memory
//! moves; a section that outgrows its declaration, or large state that
//! declared nothing, fails at the pause, naming it, and the source runs on.
//!
//! `FERRY_TEST_DEVICE_MIB` sets the large section's size (default 96 MiB,
//! three frames' worth); `FERRY_TEST_DEVICE_MIB=1024` moves 1 GiB.

mod common;
use common::*;

use ferry_engine::{migrate, MigrationError, MigrationSummary, NoProgress, ReceiveOptions};
use ferry_vm::{Backing, Section, SectionSpec, Vm};

const MIB: u64 = 1 << 20;

fn gpu(max_bytes: Option<u64>) -> SectionSpec {
    let spec = SectionSpec::new("gpu", 1, 1);
    match max_bytes {
        Some(b) => spec.with_max_bytes(b),
        None => spec,
    }
}

/// Migrates a running test VM whose devices are `source` to a destination
/// with the same specs (`dest_specs`) under `opts`; returns the source's
/// result, the source VM and what the destination loaded (or its error).
fn migrate_with(
    source: Devices,
    dest_specs: Vec<SectionSpec>,
    opts: ReceiveOptions,
) -> (
    Result<MigrationSummary, MigrationError>,
    TestVm,
    Result<Vec<Section>, String>,
) {
    let dest = Devices {
        specs: dest_specs,
        ..Devices::default()
    };
    let restored = dest.restored.clone();
    let (to, handle) = spawn_receiver_with(opts, Backing::Anonymous, move |vm| {
        vm.devices = dest.clone();
    });
    let mut src = running_source();
    src.devices = source;
    let result = migrate(&mut src, &to, &probed(), &NoProgress);
    let loaded = match handle.join().unwrap() {
        Ok(_) => Ok(std::mem::take(&mut *restored.lock().unwrap())),
        Err(e) => Err(e.chain()),
    };
    (result, src, loaded)
}

/// The source failed with `words` in its error and runs on, its guest
/// intact.
fn runs_on_after(result: Result<MigrationSummary, MigrationError>, src: &TestVm, words: &str) {
    let err = result.expect_err("the migration should fail").chain();
    assert!(err.contains(words), "{err}");
    assert!(src.is_running(), "the source must run on");
    let at = check(src);
    wait_for_passes(src, at.progress + 1);
    assert_eq!(check(src).errors, 0);
}

fn large_mib() -> u64 {
    std::env::var("FERRY_TEST_DEVICE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

#[test]
fn device_state_larger_than_a_frame_moves_in_parts_and_loads_whole() {
    let bytes = large_mib() * MIB;
    let devices = Devices {
        specs: vec![gpu(Some(bytes))],
        payload_bytes: bytes as usize,
        ..Devices::default()
    };
    let saved = devices.save();
    let (result, _src, loaded) =
        migrate_with(devices.clone(), devices.specs.clone(), quick_receive());
    let summary = result.unwrap();
    assert!(summary.digest_match, "{summary:?}");
    println!(
        "{} MiB of device state at the pause: downtime {:.1} ms (pause {:.1}, vCPU state {:.1}, \
         digest {:.1}, destination resume {:.1})",
        summary.devices.device_bytes_at_pause >> 20,
        summary.downtime_ms,
        summary.switchover.pause_ms,
        summary.switchover.save_vcpus_ms,
        summary.switchover.digest_ms,
        summary.switchover.dest_resume_ms
    );
    assert!(
        summary.devices.device_bytes_at_pause > bytes,
        "{}",
        summary.devices.device_bytes_at_pause
    );
    // Encoding and sending the state is the source thread's own work in
    // the downtime: its CPU clock saw it, and never more than the wall's.
    let cpu = summary.switchover.downtime_cpu_ms;
    assert!(
        cpu > 1.0 && cpu <= summary.downtime_ms + 1.0,
        "{cpu} ms of CPU in {} ms of downtime",
        summary.downtime_ms
    );
    let loaded = loaded.unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].data.len(), saved[0].data.len());
    assert!(loaded[0].data == saved[0].data, "the state arrived changed");
}

#[test]
fn a_declared_size_over_the_destinations_limit_is_refused_before_memory_moves() {
    let devices = Devices {
        specs: vec![gpu(Some(64 * MIB))],
        ..Devices::default()
    };
    let opts = {
        let mut o = quick_receive();
        o.max_device_bytes = 16 * MIB;
        o
    };
    let (result, src, loaded) = migrate_with(devices.clone(), devices.specs.clone(), opts);
    let summary_err = result.as_ref().map(|_| ()).unwrap_err().chain();
    assert!(
        summary_err.contains("section 'gpu' may take up to 64.0 MiB"),
        "{summary_err}"
    );
    assert!(loaded.unwrap_err().contains("16.0 MiB"));
    runs_on_after(result, &src, "more than this destination takes");
}

#[test]
fn a_section_that_outgrows_its_declared_size_fails_at_the_pause_naming_it() {
    let devices = Devices {
        specs: vec![gpu(Some(MIB))],
        payload_bytes: 2 * MIB as usize,
        ..Devices::default()
    };
    let (result, src, _) = migrate_with(devices.clone(), devices.specs.clone(), quick_receive());
    runs_on_after(
        result,
        &src,
        "section 'gpu' instance 0 took 2.0 MiB at the pause, more than the 1.0 MiB its VMM declared",
    );
}

#[test]
fn undeclared_state_too_large_for_one_frame_fails_at_the_pause_saying_what_to_declare() {
    let devices = Devices {
        specs: vec![gpu(None)],
        payload_bytes: 40 * MIB as usize,
        ..Devices::default()
    };
    let (result, src, _) = migrate_with(devices.clone(), devices.specs.clone(), quick_receive());
    runs_on_after(
        result,
        &src,
        "declare each large section's size (SectionSpec::max_bytes)",
    );
}

#[test]
fn large_changing_device_state_goes_live_and_the_pause_carries_only_the_rest() {
    let summary = common::big_device::move_big_device(true);
    // All of it went while the guest ran; the pause took what changed
    // since the last round, far less than the whole.
    assert!(
        summary.devices.device_bytes_live >= 256 << 20,
        "{summary:?}"
    );
    assert!(
        summary.devices.device_bytes_at_pause < 64 << 20,
        "{}",
        summary.devices.device_bytes_at_pause
    );
}

#[test]
fn a_destination_that_loads_no_live_state_gets_it_all_at_the_pause() {
    let summary = common::big_device::move_big_device(false);
    assert_eq!(summary.devices.device_bytes_live, 0, "{summary:?}");
    assert!(
        summary.devices.device_bytes_at_pause >= 256 << 20,
        "{summary:?}"
    );
}

/// Live chunks count toward the destination's limit with the sections at
/// the pause: a device whose state fits the limit once, declared, but
/// which sends blocks again as it rewrites them, outgrows it; the
/// migration fails naming the limit, and the source runs on.
#[test]
fn live_device_state_counts_toward_the_destinations_limit() {
    use common::big_device::{try_big_device, BIG_STATE, BLOCK};
    let opts = {
        let mut o = quick_receive();
        // What the device declares (each block with its 4-byte number),
        // and one block more: the first live pass fits, a block rewritten
        // after it was sent does not.
        o.max_device_bytes = ((BIG_STATE / BLOCK) * (BLOCK + 4) + BLOCK) as u64;
        o
    };
    let (result, src, dest) = try_big_device(true, opts);
    let err = result
        .expect_err("the live state outgrew the limit")
        .chain();
    let dest = dest
        .map(|_| ())
        .expect_err("the destination refused")
        .to_string();
    assert!(dest.contains("MiB"), "{dest}");
    assert!(src.is_running(), "the source must run on: {err}");
}
