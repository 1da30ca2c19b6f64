//! The engine's conformance kit on minivmm, with and without its
//! vhost-user fill device. The kit's pages are written by vCPU 0 running
//! minivmm's own guest, which takes a list of addresses in its lane and
//! stores to each (`layout::WRITE_LIST`): guest writes that KVM's dirty
//! log must report. With the fill device, its backend process writes
//! guest memory all along, and the pause must stop it too.

mod common;

use ferry_engine::conformance::{run_all, Saved, VmmUnderTest};
use ferry_engine::vmm::{Backing, Gfn, Gpa, Vm, VmError};
use ferry_kvm::cpu_state::clock_free_difference;
use minivmm::layout::{lane, var, VARS, WRITE_LIST, WRITE_LIST_MAX};
use minivmm::{MiniConfig, MiniVm};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long the guest may take to write a list.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);
const VCPUS: u32 = 2;

struct Minivmm {
    fill: bool,
    dir: PathBuf,
}

impl Minivmm {
    fn new(fill: bool) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "minivmm-conformance-{}-{}",
            std::process::id(),
            fill
        ));
        std::fs::create_dir_all(&dir).unwrap();
        // In-process tests are not the minivmm binary: name the backend.
        std::env::set_var("MINIVMM_VHOST", env!("CARGO_BIN_EXE_minivmm-vhost"));
        Minivmm { fill, dir }
    }

    fn backing(&self) -> Backing {
        match self.fill {
            true => Backing::Memfd,
            false => Backing::Anonymous,
        }
    }
}

impl Drop for Minivmm {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config_error(e: minivmm::vm::MiniVmError) -> VmError {
    VmError::Guest(ferry_engine::vmm::error_chain(&e))
}

impl VmmUnderTest for Minivmm {
    type Vm = MiniVm;

    fn label(&self) -> String {
        match self.fill {
            true => "minivmm (with its vhost-user fill device)".into(),
            false => "minivmm".into(),
        }
    }

    fn source(&mut self) -> Result<MiniVm, VmError> {
        let mut config = MiniConfig::new(VCPUS, 8, self.dir.join("disk.img"));
        config.fill = self.fill;
        common::make_disks(&config);
        MiniVm::boot(config, self.backing(), common::sinks(VCPUS)).map_err(config_error)
    }

    fn destination(&mut self, source_config: &serde_json::Value) -> Result<MiniVm, VmError> {
        let config: MiniConfig = serde_json::from_value(source_config.clone())
            .map_err(|e| VmError::Guest(e.to_string()))?;
        MiniVm::incoming(config, self.backing(), common::sinks(VCPUS)).map_err(config_error)
    }

    fn write_pages(&mut self, vm: &mut MiniVm, pages: &[Gfn]) -> Result<(), VmError> {
        let ram = vm.ram();
        let at = |off: u64| Gpa(lane(0) + VARS + off);
        let fail = |e: ferry_engine::vmm::RamError| VmError::Guest(e.to_string());
        for chunk in pages.chunks(WRITE_LIST_MAX as usize) {
            let done = ram.load_u64(at(var::WRITE_DONE)).map_err(fail)?;
            for (i, page) in chunk.iter().enumerate() {
                let entry = Gpa(lane(0) + WRITE_LIST + i as u64 * 8);
                ram.store_u64(entry, page.0 << 12).map_err(fail)?;
            }
            ram.store_u64(at(var::WRITE_COUNT), chunk.len() as u64)
                .map_err(fail)?;
            let started = Instant::now();
            while ram.load_u64(at(var::WRITE_DONE)).map_err(fail)? == done {
                if started.elapsed() > WRITE_DEADLINE {
                    return Err(VmError::Guest(format!(
                        "vCPU 0 did not write its list of {} pages in {WRITE_DEADLINE:?}",
                        chunk.len()
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    }

    /// vCPU state compared without its clocks, which run on while paused.
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

fn conforms(fill: bool) {
    if !ferry_kvm::require_kvm("minivmm conformance") {
        return;
    }
    let report = run_all(&mut Minivmm::new(fill));
    print!("{report}");
    if let Err(e) = report.result() {
        panic!("{e}");
    }
}

#[test]
fn minivmm_conforms() {
    conforms(false);
}

#[test]
fn minivmm_with_its_vhost_user_device_conforms() {
    conforms(true);
}
