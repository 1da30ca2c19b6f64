//! Writers of guest memory with their own dirty log: a device's DMA reaches
//! the destination because its source reports it (and would be lost
//! without), and a source that cannot report refuses the migration.

mod common;
use common::*;

use ferry_engine::{migrate, migrate_accounted, NoProgress};
use ferry_vm::Vm;

/// A running test VM whose DMA device writes frame 5 as the guest runs.
fn source_with_dma(report: Option<bool>) -> TestVm {
    let mut vm = running_source();
    vm.pause().unwrap();
    let dma = Dma::new(vm.ram().pages());
    vm.dma = Some(dma.clone());
    if let Some(broken) = report.map(|r| !r) {
        vm.sources.push(Box::new(DmaSource { dma, broken }));
    }
    vm.start().unwrap();
    vm
}

#[test]
fn a_devices_dma_moves_because_its_dirty_source_reports_it() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = source_with_dma(Some(true));
    // Rounds long enough for the device to write after its page went.
    let opts = {
        let mut o = probed();
        o.batch_pages = 16;
        o
    };
    let summary = migrate(&mut src, &to, &opts, &NoProgress).unwrap();
    let (dvm, _) = dest.join().unwrap().unwrap();
    assert!(summary.digest_match, "{summary:?}");
    let gpa = src.dma.as_ref().unwrap().gfn.gpa();
    assert_eq!(
        dvm.ram().load_u64(gpa).unwrap(),
        src.ram().load_u64(gpa).unwrap()
    );
}

#[test]
fn without_its_dirty_source_a_devices_dma_is_caught_by_the_digest() {
    // The same device, unreported: it writes its page as it runs and once
    // more as it is saved, after the last round, and nothing says so. The
    // digest catches it, and the source runs on.
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = source_with_dma(None);
    let opts = {
        let mut o = probed();
        o.batch_pages = 16;
        o
    };
    let (summary, _) = migrate_accounted(&mut src, &to, &opts, &NoProgress);
    assert!(
        summary.digest_checked && !summary.digest_match,
        "{summary:?}"
    );
    let error = summary.error.unwrap_or_default();
    assert!(error.contains("memory digest mismatch"), "{error}");
    assert!(dest.join().unwrap().is_err());
    assert!(src.is_running());
}

#[test]
fn a_dirty_source_that_cannot_report_refuses_the_migration_by_name() {
    let (to, dest) = spawn_receiver(quick_receive());
    let mut src = source_with_dma(Some(false));
    let err = migrate(&mut src, &to, &probed(), &NoProgress)
        .unwrap_err()
        .chain();
    assert!(
        err.contains(
            "the dirty source 'test-dma': cannot report what it writes: the device has no dirty log"
        ),
        "{err}"
    );
    assert!(dest.join().unwrap().is_err());
    assert!(src.is_running(), "the source VM keeps running");
    let before = check(&src);
    wait_for_passes(&src, before.progress + 1);
    assert_eq!(check(&src).errors, 0);
}
