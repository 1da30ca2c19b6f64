//! The engine's conformance kit on ferry's kvm VM, in each of KVM's three
//! dirty-tracking modes: its vCPUs run the write-list program
//! (`ferry_memstress::write_list`), so every page the kit chooses is
//! written by a vCPU in guest mode, and KVM's log must report it. Skipped
//! (with a SKIP line) where /dev/kvm is absent.

use ferry_engine::conformance::{run_all, Saved, VmmUnderTest};
use ferry_kvm::cpu_state::clock_free_difference;
use ferry_kvm::{require_kvm, DirtyTracking};
use ferry_kvm_memstress::{KvmVm, Program, Role};
use ferry_memstress::{write_list, AccessOrder, VmConfig, Workload};
use ferry_vm::{Backing, Gfn, Vm, VmError};
use std::time::Duration;

/// How long the vCPUs may take to write a list.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// The kvm VMM with one dirty-tracking mode.
struct KvmVmm(DirtyTracking);

fn config() -> VmConfig {
    VmConfig {
        workload: Workload {
            vcpus: 2,
            bytes_per_vcpu: 2 << 20,
            write_percent: 100,
            order: AccessOrder::Sequential,
            stride_pages: 1,
            seed: 7,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    }
}

fn kvm_error(e: ferry_kvm_memstress::KvmVmError) -> VmError {
    VmError::Guest(ferry_vm::error_chain(&e))
}

impl VmmUnderTest for KvmVmm {
    type Vm = KvmVm;

    fn label(&self) -> String {
        format!(
            "{} ({} dirty log)",
            ferry_kvm_memstress::VMM_ID,
            self.0.name()
        )
    }

    fn source(&mut self) -> Result<KvmVm, VmError> {
        KvmVm::with_program(config(), self.0, Role::Source, Program::WriteList).map_err(kvm_error)
    }

    fn destination(&mut self, source_config: &serde_json::Value) -> Result<KvmVm, VmError> {
        let config = VmConfig::from_stream(source_config, Backing::Anonymous)?;
        KvmVm::new(config, self.0, Role::Destination).map_err(kvm_error)
    }

    fn write_pages(&mut self, vm: &mut KvmVm, pages: &[Gfn]) -> Result<(), VmError> {
        write_list::write_pages(vm.ram(), &vm.config().workload, pages, WRITE_DEADLINE)
            .map_err(|e| VmError::Guest(ferry_vm::error_chain(&e)))
    }

    /// vCPU state compared without its clocks, which run on while a VM is
    /// paused and between a save and the next (as `tests/vcpu_state.rs`
    /// checks on its own); every other byte must be the same.
    fn same_state(&self, saved: Saved<'_>, resaved: Saved<'_>) -> bool {
        match (saved, resaved) {
            (Saved::Vcpus(a), Saved::Vcpus(b)) => match clock_free_difference(a, b) {
                None => true,
                Some(at) => {
                    println!("the vCPU state differs at {at}");
                    false
                }
            },
            (a, b) => a == b,
        }
    }
}

fn conforms(mode: DirtyTracking) {
    if !require_kvm("kvm conformance") {
        return;
    }
    let report = run_all(&mut KvmVmm(mode));
    print!("{report}");
    if let Err(e) = report.result() {
        panic!("{e}");
    }
}

#[test]
fn the_kvm_vm_conforms_with_the_bitmap_log() {
    conforms(DirtyTracking::Bitmap);
}

#[test]
fn the_kvm_vm_conforms_with_the_clear_log() {
    conforms(DirtyTracking::Clear {
        chunk_pages: 4096,
        pace_us: 0,
    });
}

#[test]
fn the_kvm_vm_conforms_with_the_dirty_ring() {
    // A small ring, so that ring-full exits happen and the vCPUs drain them.
    conforms(DirtyTracking::Ring { entries: 1024 });
}
