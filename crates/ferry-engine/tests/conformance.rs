//! The conformance kit on the engine's own test VM: its guest walking
//! memory through GuestRam, its pass counter stored behind GuestRam's back
//! (its dirty log), a DMA device with a dirty source of its own, and the
//! sections of two kinds of device, one with two instances and a
//! subsection.

mod common;

use common::{Dma, DmaSource, TestConfig, TestVm};
use ferry_engine::conformance::{run_all, VmmUnderTest};
use ferry_vm::{Gfn, SectionSpec, VmError};

/// The test VM as a VMM builds it for the kit.
struct EngineTestVmm;

impl EngineTestVmm {
    /// A test VM of `config` with its devices.
    fn build(config: &TestConfig) -> Result<TestVm, VmError> {
        let mut vm = TestVm::new(config)?;
        let dma = Dma::new(vm_pages(&vm));
        vm.sources.push(Box::new(DmaSource {
            dma: dma.clone(),
            broken: false,
        }));
        vm.dma = Some(dma);
        vm.devices.specs = vec![
            SectionSpec::new("serial", 2, 1).with_subsection("fifo"),
            SectionSpec::new("virtio-blk", 1, 1).with_instances(vec![0, 1]),
        ];
        vm.devices.subsections_needed = true;
        Ok(vm)
    }
}

fn vm_pages(vm: &TestVm) -> u64 {
    ferry_vm::Vm::ram(vm).pages()
}

impl VmmUnderTest for EngineTestVmm {
    type Vm = TestVm;

    fn label(&self) -> String {
        format!(
            "{} (DMA device, serial and virtio-blk sections)",
            common::TEST_VMM
        )
    }

    fn source(&mut self) -> Result<TestVm, VmError> {
        // A hole between the regions, so the kit covers it too.
        let config = TestConfig {
            hole_bytes: 2 << 20,
            ..common::config()
        };
        Self::build(&config)
    }

    fn destination(&mut self, source_config: &serde_json::Value) -> Result<TestVm, VmError> {
        let config: TestConfig = serde_json::from_value(source_config.clone())
            .map_err(|e| VmError::Guest(format!("not a test VM's configuration: {e}")))?;
        Self::build(&config)
    }

    fn write_pages(&mut self, vm: &mut TestVm, pages: &[Gfn]) -> Result<(), VmError> {
        vm.write_pages(pages)
    }
}

#[test]
fn the_engine_test_vm_conforms() {
    let report = run_all(&mut EngineTestVmm);
    print!("{report}");
    if let Err(e) = report.result() {
        panic!("{e}");
    }
    assert_eq!(report.skipped().count(), 0, "{report}");
}
