//! minivmm's in-kernel irqchip: the PIC, IOAPIC and each vCPU's LAPIC are
//! saved with the vCPUs and load into a fresh VM equal, after the disks
//! have raised completion interrupts through their irqfds. (The guest at
//! CPL3 polls and takes none: `docs/kvm-host-devices.md` says why.)

mod common;

use ferry_engine::vmm::{Backing, Vm};
use ferry_kvm::cpu_state::vm_level::Irqchip;
use ferry_kvm::cpu_state::Snapshot;
use minivmm::{MiniConfig, MiniVm};
use std::time::Duration;

const VCPUS: u32 = 2;

/// The irqchip and the LAPICs of a snapshot, as comparable values (the
/// clock, which moves while paused, left out).
fn chips(bytes: &[u8]) -> (serde_json::Value, Vec<serde_json::Value>) {
    let snap = Snapshot::decode(bytes).unwrap();
    assert!(
        matches!(snap.vm.irqchip, Irqchip::InKernel(_)),
        "no in-kernel irqchip saved"
    );
    let lapics = snap
        .vcpus
        .iter()
        .map(|v| serde_json::to_value(v.lapic.as_ref().expect("a LAPIC saved")).unwrap())
        .collect();
    (serde_json::to_value(&snap.vm.irqchip).unwrap(), lapics)
}

#[test]
fn the_irqchip_and_every_lapic_load_into_a_fresh_vm_equal() {
    if !ferry_kvm::require_kvm("minivmm irqchip") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("minivmm-irqchip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = MiniConfig::new(VCPUS, 8, dir.join("disk.img"));
    assert!(config.irqchip);
    common::make_disks(&config);
    let mut source =
        MiniVm::boot(config.clone(), Backing::Anonymous, common::sinks(VCPUS)).unwrap();
    source.start().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    source.pause().unwrap();
    assert!(
        source.interrupts_raised() > 0,
        "no disk raised an interrupt"
    );
    let saved = source.vcpu_state().unwrap().save_vcpus().unwrap();
    let (irqchip, lapics) = chips(&saved);
    assert_eq!(lapics.len(), VCPUS as usize);
    assert_ne!(lapics[0], lapics[1], "each vCPU has its own LAPIC (its id)");

    let mut destination =
        MiniVm::incoming(config.clone(), Backing::Anonymous, common::sinks(VCPUS)).unwrap();
    destination
        .vcpu_state()
        .unwrap()
        .restore_vcpus(&saved)
        .unwrap();
    let again = destination.vcpu_state().unwrap().save_vcpus().unwrap();
    assert_eq!(chips(&again), (irqchip, lapics));
    drop((source, destination));
    let _ = std::fs::remove_dir_all(dir);
}
