//! The pause of a VM whose disks are busy: minivmm pauses again and again
//! until it has caught requests in flight (made available by the guest,
//! not yet completed by the disks' I/O threads) several times. Each such
//! pause must leave guest memory still (the I/O threads quiesced, checked
//! in memory, not from a flag), and after all of them every vCPU's console
//! and disk streams are whole: no request lost or done twice.

mod common;

use ferry_engine::vmm::{Backing, Gfn, Vm};
use minivmm::serial::ConsoleOut;
use minivmm::{checks, probe, MiniConfig, MiniVm};
use std::time::Duration;

const VCPUS: u32 = 2;
/// Pauses with requests in flight to catch before the checks.
const CATCHES: usize = 5;

/// All of guest memory, page by page.
fn memory(vm: &MiniVm) -> Vec<u8> {
    let ram = vm.ram();
    let mut all = Vec::new();
    for slot in ram.slots() {
        let mut buf = vec![0u8; slot.size as usize];
        ram.read_pages(Gfn(slot.gpa.0 / 4096), &mut buf).unwrap();
        all.extend(buf);
    }
    all
}

#[test]
fn a_pause_with_requests_in_flight_finishes_them_and_loses_none() {
    if !ferry_kvm::require_kvm("minivmm quiesce") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("minivmm-quiesce-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = MiniConfig::new(VCPUS, 8, dir.join("disk.img"));
    common::make_disks(&config);
    let consoles: Vec<common::Captured> = (0..VCPUS).map(|_| common::Captured::default()).collect();
    let outs = consoles
        .iter()
        .map(|c| ConsoleOut::new(Box::new(c.clone())))
        .collect();
    let mut vm = MiniVm::boot(config, Backing::Anonymous, outs).unwrap();
    vm.start().unwrap();

    let (mut pauses, mut caught) = (0, 0);
    while caught < CATCHES && pauses < 2000 {
        std::thread::sleep(Duration::from_millis(3));
        vm.pause().unwrap();
        pauses += 1;
        if vm.requests_in_flight_at_pause() > 0 {
            caught += 1;
            let before = memory(&vm);
            std::thread::sleep(Duration::from_millis(30));
            assert!(
                before == memory(&vm),
                "guest memory changed after pause {pauses}: an I/O thread still served"
            );
            // The sections save with the VM stopped, whatever waits.
            vm.save_sections().unwrap();
        }
        vm.start().unwrap();
    }
    println!("{caught} pauses with requests in flight out of {pauses}");
    assert_eq!(caught, CATCHES, "no pause caught a request in flight");

    std::thread::sleep(Duration::from_millis(200));
    vm.pause().unwrap();
    let guest = probe::counters(&vm).unwrap();
    assert_eq!(guest.bad_reads + guest.status_errors, 0, "{guest:?}");
    for (i, (console, journal)) in consoles.iter().zip(vm.disk_journals()).enumerate() {
        let text = console.text();
        let lines = checks::console(&text);
        assert!(lines.lines > 0, "vCPU {i}: {lines:?}");
        assert_eq!(
            (lines.lost, lines.doubled, lines.bad),
            (0, 0, 0),
            "vCPU {i}: {lines:?}"
        );
        let disk = checks::disk(&journal);
        assert!(disk.requests > 0, "vCPU {i}: {disk:?}");
        assert_eq!((disk.lost, disk.doubled), (0, 0), "vCPU {i}: {disk:?}");
    }
    drop(vm);
    let _ = std::fs::remove_dir_all(dir);
}
