//! The synthetic device with large state (`ferry_vm::synthetic`), and a
//! migration of the test VM carrying it.

use super::*;
use ferry_engine::{migrate, MigrationSummary, NoProgress};
pub use ferry_vm::synthetic::{BigDevice, BLOCK};

/// A device with 256 MiB of state rewriting a 64 KiB block every
/// millisecond, as a running GPU does; the destination loads it live or
/// not. Returns the source's summary, after checking that the
/// destination's device holds exactly the source's state.
pub fn move_big_device(live_at_destination: bool) -> MigrationSummary {
    let (summary, src, dvm) = try_big_device(live_at_destination, quick_receive());
    let summary = summary.unwrap();
    let dvm = dvm.unwrap();
    assert!(summary.digest_match, "{summary:?}");
    println!(
        "device state (live at the destination: {live_at_destination}): {} MiB during the \
         rounds, {} KiB at the pause; downtime {:.1} ms (predicted {:.1})",
        summary.devices.device_bytes_live >> 20,
        summary.devices.device_bytes_at_pause >> 10,
        summary.downtime_ms,
        summary.switchover.predicted_downtime_ms
    );
    println!(
        "  saving the sections {:.1} ms, the destination's resume {:.1} ms; device state \
         counted at {:.0} MB/s",
        summary.switchover.save_sections_ms,
        summary.switchover.dest_resume_ms,
        summary.devices.device_state_bytes_per_sec / 1e6
    );
    let dvm: Box<dyn std::any::Any> = dvm;
    let dvm = dvm.downcast::<TestVm>().expect("the test VM");
    let dest = dvm.big.as_ref().expect("the destination's device").state();
    let source = src.big.as_ref().unwrap().state();
    assert_eq!(dest.len(), source.len());
    let first_diff = dest
        .chunks(BLOCK)
        .zip(source.chunks(BLOCK))
        .position(|(d, s)| d != s);
    assert_eq!(first_diff, None, "a block differs");
    summary
}

/// The state [`move_big_device`] moves, in bytes.
pub const BIG_STATE: usize = 256 << 20;

/// What [`try_big_device`] gives back: the source's result, the source,
/// and the destination's VM or its error.
pub type BigMove = (
    Result<MigrationSummary, ferry_engine::MigrationError>,
    TestVm,
    Result<Box<dyn Vm>, String>,
);

/// Migrates the test VM with the big device to a destination under
/// `opts`.
pub fn try_big_device(live_at_destination: bool, opts: ReceiveOptions) -> BigMove {
    const STATE: usize = BIG_STATE;
    let (to, handle) = spawn_receiver_with(opts, Backing::Anonymous, move |vm| {
        let mut big = BigDevice::destination(STATE);
        big.live = live_at_destination;
        vm.big = Some(big);
    });
    let mut src = TestVm::new(&config()).unwrap();
    src.big = Some(BigDevice::source(
        STATE,
        std::time::Duration::from_millis(1),
    ));
    src.start().unwrap();
    wait_for_passes(&src, 1);
    let result = migrate(&mut src, &to, &probed(), &NoProgress);
    let dvm = handle
        .join()
        .unwrap()
        .map(|(vm, _)| vm)
        .map_err(|e| e.chain());
    (result, src, dvm)
}
