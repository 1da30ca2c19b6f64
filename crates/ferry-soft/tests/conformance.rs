//! The engine's conformance kit on the soft VM, with the seed mechanisms
//! and with the baselines: its vCPUs run the write-list program
//! (`ferry_memstress::write_list`), so every page the kit chooses is
//! written by a vCPU through the soft MMU, which must log it.

use ferry_engine::conformance::{run_all, VmmUnderTest};
use ferry_memstress::{write_list, AccessOrder, VmConfig, Workload};
use ferry_soft::{Mechanisms, Program, SoftVm};
use ferry_vm::{Backing, Gfn, Vm, VmError};
use std::time::Duration;

/// How long the vCPUs may take to write a list.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// The soft VMM with `mech`, named `name` in the kit's messages.
struct SoftVmm {
    name: &'static str,
    mech: Mechanisms,
}

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

impl VmmUnderTest for SoftVmm {
    type Vm = SoftVm;

    fn label(&self) -> String {
        format!("{} ({})", ferry_soft::VMM_ID, self.name)
    }

    fn source(&mut self) -> Result<SoftVm, VmError> {
        SoftVm::with_program(config(), self.mech, Program::WriteList)
    }

    fn destination(&mut self, source_config: &serde_json::Value) -> Result<SoftVm, VmError> {
        SoftVm::new_destination(
            VmConfig::from_stream(source_config, Backing::Anonymous)?,
            self.mech,
        )
    }

    fn write_pages(&mut self, vm: &mut SoftVm, pages: &[Gfn]) -> Result<(), VmError> {
        write_list::write_pages(vm.ram(), &vm.config().workload, pages, WRITE_DEADLINE)
            .map_err(|e| VmError::Guest(ferry_vm::error_chain(&e)))
    }
}

fn conforms(name: &'static str, mech: Mechanisms) {
    let mut vmm = SoftVmm { name, mech };
    let report = run_all(&mut vmm);
    print!("{report}");
    if let Err(e) = report.result() {
        panic!("{e}");
    }
}

#[test]
fn the_soft_vm_conforms_with_the_seed_mechanisms() {
    conforms("seed mechanisms", Mechanisms::default());
}

#[test]
fn the_soft_vm_conforms_with_the_baselines() {
    conforms("baselines", Mechanisms::baseline());
}
