//! The foreign_guest example, run as its `main` runs it: a VM that is not
//! ferry's own (a memory hole, two devices, a timer whose save writes guest
//! memory), migrated over loopback, then saved to a file while it runs and
//! restored lazily with its working set first. The example's source is
//! compiled into this test, so what is checked is what a reader reads.

#[allow(dead_code)]
#[path = "../examples/foreign_guest.rs"]
mod foreign_guest;

#[test]
fn a_foreign_vm_migrates_then_snapshots_and_restores_with_its_devices() {
    let args =
        foreign_guest::Args::parse_from(["--snapshot", "--json"].map(String::from).into_iter())
            .expect("the arguments parse")
            .expect("not --help");
    let j = foreign_guest::run(args);
    assert_eq!(j["digest_match"], true, "{j}");
    assert_eq!(j["devices_restored"], true, "{j}");
    assert_eq!(j["guest_errors_after"], 0, "{j}");
    let s = &j["snapshot"];
    assert_eq!(s["digest_match"], true, "{j}");
    assert_eq!(s["devices_restored"], true, "{j}");
    // The timer's save wrote its ticks into guest memory at the pause: the
    // file holds that page as the save left it.
    assert_eq!(
        s["timer_ticks_in_guest_memory"], s["timer_ticks_saved"],
        "{j}"
    );
    assert!(s["guest_passes_after"].as_u64().unwrap() >= 2, "{j}");
    assert_eq!(s["guest_errors_after"], 0, "{j}");
}
