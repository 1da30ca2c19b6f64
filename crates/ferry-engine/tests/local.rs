//! Same-host live upgrade between two test VMs in one process, over a
//! UNIX socket: the destination maps the source's memfd memory, so no page
//! is copied, and the guest (which checks every page it rewrites) runs on
//! there without a mismatch.

mod common;

use common::{check, config, wait_for_passes, TestConfig, TestProbe, TestVm};
use ferry_engine::local::{
    await_local, listen_local, migrate_local, receive_local_as, LocalOptions,
};
use ferry_engine::wire::StreamHeader;
use ferry_engine::{MigrationError, Outcome};
use ferry_vm::{Backing, GuestRam, Vm};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

fn socket(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ferry-local-{name}-{}.sock", std::process::id()))
}

fn opts() -> LocalOptions {
    {
        let mut o = LocalOptions::default();
        o.probe = Some(Arc::new(TestProbe));
        o
    }
}

fn memfd_source() -> TestVm {
    let mut vm = TestVm::new(&TestConfig {
        backing: Backing::Memfd,
        ..config()
    })
    .unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    vm
}

type Received = Result<(TestVm, ferry_engine::local::LocalSummary), MigrationError>;

/// A destination thread on `path`; `fail_restore` makes its VM refuse the
/// vCPU state (a destination that fails before it resumes).
fn destination(path: &Path, fail_restore: bool) -> JoinHandle<Received> {
    destination_with(path, move |vm| vm.fail_restore = fail_restore)
}

/// A destination thread on `path` whose VM `build` changes once made.
fn destination_with(
    path: &Path,
    build: impl Fn(&mut TestVm) + Send + 'static,
) -> JoinHandle<Received> {
    let listener = listen_local(path).unwrap();
    std::thread::spawn(move || {
        let incoming = await_local(&listener, &opts())?;
        let mut factory = |h: &StreamHeader, ram: GuestRam| {
            let config = TestVm::config_from(h, Backing::Memfd)?;
            let mut vm = TestVm::on_ram(&config, ram);
            build(&mut vm);
            Ok(vm)
        };
        receive_local_as(incoming, &mut factory, &opts())
    })
}

#[test]
fn a_memfd_vm_moves_to_another_process_without_copying_its_memory() {
    let path = socket("moves");
    let dest = destination(&path, false);
    let mut src = memfd_source();
    let summary = migrate_local(&mut src, &path, &opts()).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed);
    assert!(summary.digest_match && dsum.digest_match, "{summary:?}");
    assert_eq!(summary.regions, 2);
    assert!(!src.is_running() && dvm.is_running());
    // The guest runs on here, on the same pages, checking what it rewrites.
    let at = check(&dvm);
    wait_for_passes(&dvm, at.progress + 2);
    assert_eq!(check(&dvm).errors, 0);
    assert!(summary.guest.is_some() && dsum.guest.is_some());
    let _ = std::fs::remove_file(path);
}

#[test]
fn anonymous_memory_is_refused_before_anything_starts_naming_memfd() {
    let mut src = TestVm::new(&config()).unwrap();
    src.start().unwrap();
    let err = migrate_local(&mut src, &socket("anon"), &opts()).unwrap_err();
    assert!(err.to_string().contains("--backing memfd"), "{err}");
    assert!(src.is_running());
}

#[test]
fn a_destination_that_fails_before_it_resumes_leaves_the_source_running() {
    let path = socket("fails");
    let dest = destination(&path, true);
    let mut src = memfd_source();
    let err = migrate_local(&mut src, &path, &opts()).unwrap_err();
    assert!(
        err.chain().contains("failed before it resumed"),
        "{}",
        err.chain()
    );
    assert!(dest.join().unwrap().is_err());
    // The guest is the source's again: it runs on, and lost nothing.
    assert!(src.is_running());
    let at = check(&src);
    wait_for_passes(&src, at.progress + 2);
    assert_eq!(check(&src).errors, 0);
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_section_over_its_declared_size_fails_the_pause_and_the_source_runs_on() {
    let path = socket("outgrew");
    let devices = common::Devices {
        specs: vec![ferry_vm::SectionSpec::new("gpu", 1, 1).with_max_bytes(1024)],
        payload_bytes: 4096,
        ..common::Devices::default()
    };
    let at_dest = devices.clone();
    let dest = destination_with(&path, move |vm| vm.devices = at_dest.clone());
    let mut src = memfd_source();
    src.devices = devices;
    let err = migrate_local(&mut src, &path, &opts()).unwrap_err().chain();
    assert!(
        err.contains("section 'gpu' instance 0 took 4.0 KiB at the pause, more than the 1.0 KiB"),
        "{err}"
    );
    assert!(src.is_running(), "the source runs on");
    let _ = dest.join();
    let _ = std::fs::remove_file(path);
}
