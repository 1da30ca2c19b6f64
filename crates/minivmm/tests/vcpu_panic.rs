//! A panic on minivmm's vCPU thread (here in the console sink the VMM
//! handed it) fails the vCPU with the panic's message, and a pause still
//! returns, with that failure. Before, the thread died "running" and the pause waited for it
//! for ever.

use ferry_engine::vmm::{error_chain, Backing, Vm};
use minivmm::serial::ConsoleOut;
use minivmm::{MiniConfig, MiniVm};
use std::io::Write;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A console sink that breaks at the guest's first byte.
struct Broken;

impl Write for Broken {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        panic!("the console sink broke")
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_vcpu_thread_that_panics_fails_the_vcpu_and_a_pause_still_returns() {
    if !ferry_kvm::require_kvm("minivmm vcpu_panic") {
        return;
    }
    let path = std::env::temp_dir().join(format!("minivmm-panic-{}.img", std::process::id()));
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(minivmm::layout::DISK_BLOCKS * minivmm::layout::BLOCK_BYTES)
        .unwrap();
    let out = ConsoleOut::new(Box::new(Broken));
    let config = MiniConfig::new(1, 8, path.clone());
    let mut vm = MiniVm::boot(config, Backing::Anonymous, vec![out]).unwrap();
    vm.start().unwrap();

    // The guest prints within its first loops; its vCPU then fails.
    let started = Instant::now();
    let why = loop {
        match vm.check_health() {
            Err(e) => break error_chain(&e),
            Ok(()) if started.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(()) => {
                // Dropped, a VM whose vCPU thread died running would hang
                // the test in its drop, instead of failing it.
                std::mem::forget(vm);
                panic!("the vCPU never failed: the guest printed nothing in 60 s, or the panic was lost")
            }
        }
    };
    println!("health: {why}");
    assert!(
        why.contains("the vCPU thread panicked: the console sink broke"),
        "{why}"
    );

    // The pause returns, with the failure: a failed vCPU is no guest to
    // save. It runs on a thread so that a regression fails here instead of
    // hanging the test binary.
    let (done, paused) = mpsc::channel();
    let pauser = std::thread::spawn(move || {
        let result = vm.pause().map_err(|e| error_chain(&e));
        let _ = done.send(result);
        vm
    });
    let result = paused
        .recv_timeout(Duration::from_secs(60))
        .expect("a pause of the failed vCPU did not return");
    let why = result.expect_err("a pause of a failed vCPU reports the failure");
    assert!(why.contains("the console sink broke"), "{why}");
    // Dropping the VM joins its vCPU thread.
    drop(pauser.join().unwrap());
    let _ = std::fs::remove_file(path);
}
