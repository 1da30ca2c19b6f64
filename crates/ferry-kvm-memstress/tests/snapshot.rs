//! A snapshot of real vCPUs: memstress writing on two vCPUs is saved to a
//! file while it runs (KVM's dirty log feeds the rounds), restored into a
//! fresh VM, and walks on there with its own stamp checks clean, while the
//! source's guest runs on too. The bitmap and the ring each feed one.
//!
//! Needs /dev/kvm; prints a skip line where it is absent.

mod common;
use common::wait_for_passes;

use ferry_engine::snapshot::{self, RestoreOptions, SnapshotOptions};
use ferry_engine::vmm::StreamHeader;
use ferry_kvm::require_kvm;
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::{KvmVm, Role};
use ferry_memstress::{read_progress, MemstressProbe, VmConfig, Workload};
use ferry_vm::{Backing, GuestProbe, Vm, VmError};

fn config() -> VmConfig {
    VmConfig {
        workload: Workload {
            vcpus: 2,
            bytes_per_vcpu: 16 << 20,
            write_percent: 100,
            readers: 0,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    }
}

fn passes(vm: &KvmVm) -> u64 {
    read_progress(vm.ram(), vm.vcpus())
        .unwrap()
        .iter()
        .map(|p| p.passes)
        .min()
        .unwrap_or(0)
}

#[test]
fn a_writing_kvm_guest_saved_live_restores_and_runs_on_with_its_stamps_clean() {
    if !require_kvm("kvm snapshot") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferry-kvm-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in [DirtyTracking::Bitmap, DirtyTracking::Ring { entries: 4096 }] {
        let path = dir.join(format!("{}.snap", mode.name()));
        let mut src = KvmVm::new(config(), mode, Role::Source).unwrap();
        src.start().unwrap();
        wait_for_passes(&src, 1);
        let s = snapshot::save(&mut src, &path, &SnapshotOptions::default()).unwrap();
        assert!(src.is_running(), "{mode:?}: the source runs on");
        assert!(s.rounds.len() >= 2, "{mode:?}: {s:?}");

        let mut build = |h: &StreamHeader| -> Result<KvmVm, VmError> {
            assert_eq!(h.vcpus, 2);
            KvmVm::new(config(), mode, Role::Destination).map_err(|e| VmError::Guest(e.to_string()))
        };
        let (dst, r) = snapshot::restore_as(&path, &mut build, &RestoreOptions::default()).unwrap();
        assert!(r.digest_match && dst.is_running(), "{mode:?}: {r:?}");
        let from = passes(&dst);
        wait_for_passes(&dst, from + 2);
        wait_for_passes(&src, passes(&src) + 1);
        for (side, vm) in [("restored", &dst), ("source", &src)] {
            let check = MemstressProbe.read(vm).unwrap();
            assert_eq!(check.errors, 0, "{mode:?}: the {side} guest's stamps");
        }
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
