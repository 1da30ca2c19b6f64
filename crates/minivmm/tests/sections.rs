//! minivmm's device sections through the engine, both ends in this process
//! over loopback: a destination that cannot load the source's virtio-blk
//! section refuses it by name before any memory moves, and the source's
//! guest runs on with its console and disk streams unbroken.

mod common;

use ferry_engine::vmm::{receive_as, Backing, StreamHeader, Vm, VmError};
use ferry_engine::{
    await_migration, listen, migrate, NoProgress, PrecopyOptions, ReceiveOptions, TcpDialer,
};
use minivmm::serial::ConsoleOut;
use minivmm::{checks, probe, MiniConfig, MiniVm};
use std::time::Duration;

/// vCPUs of the VM under test: two, so that each section has two
/// instances.
const VCPUS: u32 = 2;

fn disk(name: &str) -> MiniConfig {
    let path = std::env::temp_dir().join(format!("minivmm-{name}-{}.img", std::process::id()));
    let config = MiniConfig::new(VCPUS, 8, path);
    common::make_disks(&config);
    config
}

#[test]
fn a_virtio_blk_section_the_destination_cannot_load_is_refused_by_name() {
    if !ferry_kvm::require_kvm("minivmm sections") {
        return;
    }
    let config = disk("sections");
    let listener = listen("127.0.0.1:0").unwrap();
    let to = TcpDialer(listener.local_addr().unwrap().to_string());
    let destination = std::thread::spawn(move || {
        let incoming = await_migration(&listener, None).unwrap();
        let mut factory = |h: &StreamHeader| -> Result<MiniVm, VmError> {
            let config: MiniConfig = serde_json::from_value(h.vmm_config.clone()).unwrap();
            let outs = common::sinks(config.vcpus);
            Ok(MiniVm::incoming(config, Backing::Anonymous, outs)?)
        };
        receive_as(
            incoming,
            &listener,
            &mut factory,
            &ReceiveOptions::default(),
        )
        .err()
    });

    // A source whose virtio-blk state is a version this minivmm does not load.
    let consoles: Vec<common::Captured> = (0..VCPUS).map(|_| common::Captured::default()).collect();
    let config = MiniConfig {
        blk_version: minivmm::blk::VERSION + 1,
        ..config
    };
    let outs = consoles
        .iter()
        .map(|c| ConsoleOut::new(Box::new(c.clone())))
        .collect();
    let mut vm = MiniVm::boot(config.clone(), Backing::Anonymous, outs).unwrap();
    vm.start().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let err = migrate(&mut vm, &to, &PrecopyOptions::default(), &NoProgress)
        .expect_err("the destination cannot load it");
    let why = ferry_engine::vmm::error_chain(&err);
    println!("refused: {why}");
    assert!(why.contains("virtio-blk"), "{why}");
    let versions = format!("{}", minivmm::blk::VERSION + 1);
    assert!(why.contains(&versions), "{why}");
    assert!(
        destination.join().unwrap().is_some(),
        "the destination failed too"
    );

    // The source runs on: more lines and disk requests, none lost.
    assert!(vm.is_running());
    let before = probe::counters(&vm).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    vm.pause().unwrap();
    let after = probe::counters(&vm).unwrap();
    assert!(
        after.console_lines > before.console_lines,
        "{before:?} {after:?}"
    );
    assert!(after.reads_verified > before.reads_verified);
    assert_eq!(after.bad_reads + after.status_errors, 0);
    for (console, journal) in consoles.iter().zip(vm.disk_journals()) {
        let lines = checks::console(&console.text());
        assert!(lines.lines > 0, "{lines:?}");
        assert_eq!(
            (lines.lost, lines.doubled, lines.bad),
            (0, 0, 0),
            "{lines:?}"
        );
        let disk = checks::disk(&journal);
        assert!(disk.requests > 0, "{disk:?}");
        assert_eq!((disk.lost, disk.doubled), (0, 0), "{disk:?}");
    }
    for i in 0..VCPUS {
        let _ = std::fs::remove_file(config.disk_path(i));
    }
}
