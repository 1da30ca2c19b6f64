//! What a vCPU that only reads dirties while it is logged.
//!
//! The dirty quota promises that a reader is never slowed; that holds only
//! if what a reader dirties fits in the least quota a vCPU gets. Under
//! shadow paging (kvm_pvm) a memstress reader dirties its progress record
//! alone. Under nested paging, AMD counts the processor's walks of the
//! guest's page tables as writes (APM vol. 2, "Nested Paging": guest
//! page-table accesses are treated as user writes), so each walk after a
//! re-protection dirties the page-table pages too. This test names every
//! page two readers dirty, checks that each is one of those, and prints how
//! many a harvest brings, so the quota's floor can be checked against it.
//!
//! Needs /dev/kvm; prints a skip line where it is absent.

mod common;
use common::wait_for_passes;
use ferry_kvm::require_kvm;
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::{KvmVm, Role};
use ferry_memstress::{self as memstress, MemoryLayout};
use ferry_memstress::{VmConfig, Workload};
use ferry_vm::capability::{DirtyLog as _, DirtyMeter as _};
use ferry_vm::{Backing, DirtyPages, Gpa, Vm, PAGE_SIZE};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long the readers run logged.
const LOGGED_FOR: Duration = Duration::from_secs(2);
/// Time between harvests: each re-protects what the last one named.
const HARVEST_EVERY: Duration = Duration::from_millis(10);

#[test]
fn readers_dirty_only_their_progress_records_and_the_page_tables_they_walk() {
    if !require_kvm("what a reader dirties") {
        return;
    }
    let workload = Workload {
        vcpus: 2,
        bytes_per_vcpu: 16 << 20,
        write_percent: 0,
        readers: 2,
        ..Workload::default()
    };
    let layout = MemoryLayout::for_workload(&workload);
    let config = VmConfig {
        workload: workload.clone(),
        backing: Backing::Anonymous,
    };
    let mut vm = KvmVm::new(config, DirtyTracking::Ring { entries: 4096 }, Role::Source).unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    vm.start_dirty_log().unwrap();
    let mut first = DirtyPages::new(vm.ram().pages());
    vm.harvest_dirty(&mut first).unwrap();

    let page = PAGE_SIZE as u64;
    let page_of = |gpa: Gpa| gpa.0 / page;
    let mut expected: BTreeMap<u64, &str> = BTreeMap::new();
    expected.insert(page_of(memstress::PML4_GPA), "PML4");
    expected.insert(page_of(memstress::PDPT_GPA), "PDPT");
    let pd_pages = layout.total_bytes().div_ceil(1 << 30);
    for p in 0..pd_pages {
        expected.insert(page_of(memstress::PD_GPA) + p, "PD");
    }
    for v in 0..2 {
        expected.insert(page_of(MemoryLayout::progress_gpa(v)), "progress");
    }

    let dirtied_before = vm.dirtied();
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut harvests, mut most) = (0u64, 0u64);
    let until = Instant::now() + LOGGED_FOR;
    while Instant::now() < until {
        std::thread::sleep(HARVEST_EVERY);
        let mut dirty = DirtyPages::new(vm.ram().pages());
        vm.harvest_dirty(&mut dirty).unwrap();
        harvests += 1;
        most = most.max(dirty.count());
        for gfn in dirty.iter() {
            *seen.entry(gfn.0).or_default() += 1;
        }
    }
    let dirtied: Vec<u64> = vm
        .dirtied()
        .iter()
        .zip(&dirtied_before)
        .map(|(a, b)| a - b)
        .collect();
    vm.check_health().expect("vCPUs healthy");
    let named: Vec<String> = seen
        .iter()
        .map(|(gfn, n)| {
            let what = expected.get(gfn).copied().unwrap_or("UNEXPECTED");
            format!("{gfn:#x} {what} x{n}")
        })
        .collect();
    println!(
        "{harvests} harvests every {HARVEST_EVERY:?}: at most {most} pages in one; \
         per vCPU {dirtied:?} pages in {LOGGED_FOR:?}; pages: {named:?}"
    );
    let unexpected: Vec<&String> = named.iter().filter(|n| n.contains("UNEXPECTED")).collect();
    assert!(
        unexpected.is_empty(),
        "readers dirtied pages that are neither page tables nor progress records: {unexpected:?}"
    );
}
