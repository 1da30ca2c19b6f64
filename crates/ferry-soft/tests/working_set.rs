//! A snapshot's working set on the soft VM, whose MMU keeps accessed bits
//! (`ferry_vm::AccessLog`): pages the guest only reads join it through the
//! access log, and only through it.

use ferry_engine::snapshot::{self, SnapshotOptions};
use ferry_memstress::{read_progress, AccessOrder, MemoryLayout, VmConfig, Workload};
use ferry_soft::{Mechanisms, SoftVm};
use ferry_vm::{Backing, PAGE_SIZE};
use std::time::Duration;

/// vCPU 0 writes its region, vCPU 1 only reads its own.
fn config() -> VmConfig {
    VmConfig {
        workload: Workload {
            vcpus: 2,
            bytes_per_vcpu: 4 << 20,
            write_percent: 100,
            readers: 1,
            order: AccessOrder::Random,
            stride_pages: 1,
            seed: 11,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    }
}

/// Saves a running guest with or without its access log; returns the
/// summary and how many of the reader's region's pages the working set
/// holds.
fn save(access_log: bool) -> (snapshot::SnapshotSummary, u64, u64) {
    let config = config();
    let layout = MemoryLayout::for_workload(&config.workload);
    let mut vm = SoftVm::new_source(config.clone(), Mechanisms::default()).unwrap();
    ferry_vm::Vm::start(&mut vm).unwrap();
    // Until the reader has been over its region a few times.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while read_progress(ferry_vm::Vm::ram(&vm), 2).unwrap()[1].passes < 3 {
        assert!(std::time::Instant::now() < deadline, "the reader never ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    let path = std::env::temp_dir().join(format!(
        "ferry-soft-working-set-{access_log}-{}.snap",
        std::process::id()
    ));
    let mut opts = SnapshotOptions::default();
    opts.access_log = access_log;
    let summary = snapshot::save(&mut vm, &path, &opts).unwrap();
    let info = snapshot::inspect(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let first = layout.region_gpa(1).0 / PAGE_SIZE as u64;
    let region = first..first + config.workload.pages_per_vcpu();
    let held = info
        .working_set
        .iter()
        .flat_map(|&(g, n)| g..g + n)
        .filter(|g| region.contains(g))
        .count() as u64;
    ferry_vm::Vm::pause(&mut vm).unwrap();
    (summary, held, config.workload.pages_per_vcpu())
}

#[test]
fn pages_the_guest_only_reads_join_its_working_set_through_the_access_log() {
    let (with, held, region) = save(true);
    assert!(with.access_log, "the soft VM offers its access log");
    // The reader goes over its whole region each pass, and ran through the
    // snapshot (on this machine all of it, 65 runs of 65); half leaves a
    // reader the host starved some slack.
    assert!(held * 2 >= region, "{held} of the reader's {region} pages");
    assert!(with.working_set_read_pages >= held, "{with:?}");
    let (without, held, _) = save(false);
    assert!(!without.access_log);
    assert_eq!(held, 0, "the dirty logs never see the reader's pages");
    assert_eq!(without.working_set_read_pages, 0);
}
