//! `SoftVm`: the `Vm` trait on the soft MMU, so the engine and
//! `ferry demo --backend soft` run on it unchanged.
//!
//! ```text
//!  source:      new_source (RAM: memstress params) ─► start ─► start_dirty_log
//!               ─► harvest_dirty* (exchange, then write-protect-all) ─► pause ─► save_vcpus
//!  destination: new_destination (RAM empty, filled by the stream) ─► restore_vcpus ─► start
//! ```

use crate::config::Mechanisms;
use crate::error::SoftError;
use crate::fault_exit::{FaultDelivery, MemoryFault, PageResolver, Residency};
use crate::guest_mem::{HostView, VcpuMem};
use crate::mmu::Mmu;
use crate::quota::{LiveThrottle, Throttle, TimeThrottle};
use crate::vcpu::{self, Control, Program, VcpuState};
use ferry_memstress::{self as memstress, VmConfig};
use ferry_vm::capability;
use ferry_vm::{
    AccessLog, DirtyLog, DirtyLogMethod, DirtyMeter, DirtyPages, FaultExits, GuestRam,
    HarvestStats, MemoryFaults, Quota, Vm, VmError,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The soft backend's clock for the rate limit: nanoseconds, i.e. 1 GHz.
pub const CLOCK_KHZ: u64 = 1_000_000;

const STATE_MAGIC: &str = "ferry-soft-vcpus";
const STATE_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct SavedVcpus {
    magic: String,
    version: u32,
    vcpus: Vec<VcpuState>,
    /// The program they run: part of their state, as a kvm guest's code
    /// is part of its memory.
    #[serde(default)]
    program: Program,
}

/// The VMM id this VM's migration streams carry; a destination builds a
/// `SoftVm` for a stream that names it.
pub const VMM_ID: &str = "ferry-soft";
/// How this VM's errors name it.
const BACKEND: &str = "soft";

/// A VM whose vCPUs are host threads running memstress on the soft MMU.
pub struct SoftVm {
    config: VmConfig,
    ram: Arc<GuestRam>,
    mmu: Arc<Mmu>,
    ctl: Arc<Control>,
    throttle: Throttle,
    threads: Vec<JoinHandle<()>>,
    running: bool,
    /// Postcopy: the vCPUs resolve their own memory faults.
    faults: Option<FaultDelivery>,
    /// The guest program its vCPUs run.
    program: Program,
}

fn op(what: &str, e: SoftError) -> VmError {
    VmError::Operation {
        backend: BACKEND.into(),
        what: what.to_string(),
        source: Some(Box::new(e)),
    }
}

impl SoftVm {
    /// The configuration the VM was built from.
    pub fn config(&self) -> &VmConfig {
        &self.config
    }

    fn build(config: VmConfig, mech: Mechanisms, ram: Option<GuestRam>) -> Result<Self, VmError> {
        config
            .workload
            .validate()
            .map_err(|e| op("validate the workload", e.into()))?;
        let layout = config.layout();
        let ram = Arc::new(match ram {
            Some(ram) => ram,
            None => GuestRam::new(&layout.slot_sizes(), config.backing)?,
        });
        let vcpus = config.workload.vcpus as usize;
        let mmu = Mmu::new(ram.pages(), vcpus, mech).map_err(|e| op("build the MMU", e))?;
        Ok(SoftVm {
            config,
            ram,
            mmu: Arc::new(mmu),
            ctl: Arc::new(Control::new(vcpus)),
            // Off, both cost a relaxed load per access, and let the engine's
            // time throttle and dirty quota act live on running vCPUs.
            throttle: Throttle::Live(Arc::new(LiveThrottle::new(vcpus))),
            threads: Vec::new(),
            running: false,
            faults: None,
            program: Program::Memstress,
        })
    }

    /// A source VM: guest RAM initialised with the memstress parameters.
    pub fn new_source(config: VmConfig, mech: Mechanisms) -> Result<Self, VmError> {
        let vm = Self::build(config, mech, None)?;
        memstress::write_params(&vm.ram, &vm.config.workload, CLOCK_KHZ)?;
        Ok(vm)
    }

    /// A source VM whose vCPUs run `program` rather than memstress.
    pub fn with_program(
        config: VmConfig,
        mech: Mechanisms,
        program: Program,
    ) -> Result<Self, VmError> {
        let mut vm = Self::new_source(config, mech)?;
        vm.program = program;
        Ok(vm)
    }

    /// A destination VM: RAM left empty for the stream, then `restore_vcpus`
    /// and `start`.
    pub fn new_destination(config: VmConfig, mech: Mechanisms) -> Result<Self, VmError> {
        Self::build(config, mech, None)
    }

    /// A destination VM on RAM made elsewhere: a same-host upgrade maps the
    /// source process's memory files. Its slots must be the ones `config`
    /// lays out.
    pub fn on_ram(config: VmConfig, mech: Mechanisms, ram: GuestRam) -> Result<Self, VmError> {
        let want = config.layout().slot_sizes();
        let have: Vec<u64> = ram.slots().iter().map(|s| s.size).collect();
        if have != want {
            return Err(VmError::BadVcpuState(format!(
                "memory of slots {have:?} bytes, where this VM lays out {want:?}"
            )));
        }
        Self::build(config, mech, Some(ram))
    }

    /// Throttles the vCPUs (dirty quota or time-based). Takes effect for
    /// threads started afterwards.
    pub fn set_throttle(&mut self, throttle: Throttle) {
        self.throttle = throttle;
    }

    /// The live throttle the engine drives, unless an experiment installed
    /// its own with [`Self::set_throttle`].
    pub fn live_throttle(&self) -> Option<&Arc<LiveThrottle>> {
        match &self.throttle {
            Throttle::Live(l) => Some(l),
            _ => None,
        }
    }

    /// The MMU.
    pub fn mmu(&self) -> &Arc<Mmu> {
        &self.mmu
    }

    fn spawn(&mut self) -> Result<(), VmError> {
        let n = self.config.workload.vcpus;
        self.ctl.spawned(n as usize);
        for v in 0..n {
            let mut mem = VcpuMem::new(Arc::clone(&self.mmu), HostView::of(&self.ram), v as usize);
            if let Some(d) = &self.faults {
                mem.set_fault_delivery(d.clone());
            }
            let ctl = Arc::clone(&self.ctl);
            let throttle = self.throttle.clone();
            let program = self.program;
            let handle = std::thread::Builder::new()
                .name(format!("soft-vcpu{v}"))
                .spawn(move || vcpu::run(mem, v, &ctl, &throttle, program))
                .map_err(|e| VmError::Operation {
                    backend: BACKEND.into(),
                    what: format!("spawn vCPU thread {v}"),
                    source: Some(Box::new(e)),
                })?;
            self.threads.push(handle);
        }
        Ok(())
    }
}

impl Vm for SoftVm {
    fn vmm_id(&self) -> &str {
        VMM_ID
    }
    fn vcpus(&self) -> u32 {
        self.config.workload.vcpus
    }
    fn vcpu_threads(&self) -> Vec<u32> {
        self.ctl.thread_ids()
    }
    fn vmm_config(&self) -> serde_json::Value {
        self.config.vmm_config()
    }

    fn ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }

    fn start(&mut self) -> Result<(), VmError> {
        self.ctl.pause.store(false, Ordering::SeqCst);
        if self.threads.is_empty() {
            self.spawn()?;
        } else {
            self.ctl.wake();
        }
        self.running = true;
        Ok(())
    }

    fn pause(&mut self) -> Result<(), VmError> {
        self.ctl.pause.store(true, Ordering::SeqCst);
        self.ctl.wait_parked();
        self.running = false;
        Ok(())
    }

    fn is_running(&self) -> bool {
        self.running
    }

    fn check_health(&self) -> Result<(), VmError> {
        match &*self.ctl.failure.lock().expect("failure") {
            Some((vcpu, reason)) => Err(VmError::VcpuFailed {
                vcpu: *vcpu,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn dirty_log(&mut self) -> Option<&mut dyn DirtyLog> {
        Some(self)
    }

    fn time_throttle(&mut self) -> Option<&mut dyn capability::TimeThrottle> {
        Some(self)
    }

    /// The live throttle meters each vCPU; an experiment's own throttle
    /// is not for a migration's policies to turn.
    fn dirty_meter(&mut self) -> Option<&mut dyn DirtyMeter> {
        self.live_throttle().is_some().then_some(self as _)
    }

    fn vcpu_state(&mut self) -> Option<&mut dyn capability::VcpuState> {
        Some(self)
    }

    fn memory_faults(&mut self) -> Option<&mut dyn MemoryFaults> {
        Some(self)
    }

    fn access_log(&mut self) -> Option<&mut dyn AccessLog> {
        Some(self)
    }
}

/// The soft MMU's accessed bits: a vCPU marks each page it walks to.
impl AccessLog for SoftVm {
    fn start_access_log(&mut self) -> Result<(), VmError> {
        self.mmu.start_access_log();
        Ok(())
    }

    fn harvest_accessed(&mut self, into: &mut DirtyPages) -> Result<u64, VmError> {
        Ok(self.mmu.harvest_accessed(into))
    }

    fn stop_access_log(&mut self) -> Result<(), VmError> {
        self.mmu.stop_access_log();
        Ok(())
    }
}

impl DirtyLog for SoftVm {
    fn method(&self) -> DirtyLogMethod {
        let m = self.mmu.mechanisms();
        DirtyLogMethod::Soft(format!(
            "split {:?}, write-protect {:?}, iteration {:?}",
            m.split, m.write_protect, m.iteration
        ))
    }

    fn start_dirty_log(&mut self) -> Result<(), VmError> {
        self.mmu
            .start_dirty_log()
            .map_err(|e| op("start dirty logging", e))
    }

    fn harvest_dirty(&mut self, into: &mut DirtyPages) -> Result<HarvestStats, VmError> {
        let t = self
            .mmu
            .harvest(into)
            .map_err(|e| op("harvest the dirty log", e))?;
        Ok(HarvestStats {
            pages: t.pages,
            get_ns: t.get_ns,
            clear_ns: t.protect_ns,
        })
    }

    fn stop_dirty_log(&mut self) -> Result<(), VmError> {
        self.mmu.stop_dirty_log();
        Ok(())
    }
}

impl capability::TimeThrottle for SoftVm {
    fn set_time_throttle(&mut self, percent: u8) -> Result<(), VmError> {
        match &self.throttle {
            Throttle::Time(t) => {
                t.set_percent(u32::from(percent));
                Ok(())
            }
            Throttle::Live(l) => {
                l.time.set_percent(u32::from(percent));
                Ok(())
            }
            Throttle::None if self.threads.is_empty() => {
                let vcpus = self.config.workload.vcpus as usize;
                self.throttle =
                    Throttle::Time(Arc::new(TimeThrottle::new(vcpus, u32::from(percent))));
                Ok(())
            }
            _ => Err(VmError::Operation {
                backend: BACKEND.into(),
                what: "another throttle (a dirty quota) is installed; it cannot be \
                       replaced while the vCPUs run"
                    .into(),
                source: None,
            }),
        }
    }

    fn throttled(&self) -> Vec<std::time::Duration> {
        self.ctl.throttled()
    }
}

impl DirtyMeter for SoftVm {
    fn dirtied(&self) -> Vec<u64> {
        self.live_throttle().map_or_else(Vec::new, |l| l.dirtied())
    }

    fn set_dirty_quota(&mut self, quota: Option<&Quota>) -> Result<(), VmError> {
        match &self.throttle {
            Throttle::Live(l) => {
                l.set_quota(quota);
                Ok(())
            }
            _ => Err(VmError::Operation {
                backend: BACKEND.into(),
                what: "set a dirty quota: an experiment's own throttle is installed".into(),
                source: None,
            }),
        }
    }

    fn set_dirty_limit(&mut self, bytes_per_sec: Option<u64>) -> Result<(), VmError> {
        match &self.throttle {
            Throttle::Live(l) => {
                l.limit.set_limit(bytes_per_sec);
                Ok(())
            }
            _ => Err(VmError::Operation {
                backend: BACKEND.into(),
                what: "set a dirty limit: an experiment's own throttle is installed".into(),
                source: None,
            }),
        }
    }
}

impl capability::VcpuState for SoftVm {
    fn save_vcpus(&mut self) -> Result<Vec<u8>, VmError> {
        if self.running {
            return Err(VmError::NotPaused("save vCPU state"));
        }
        let saved = SavedVcpus {
            magic: STATE_MAGIC.into(),
            version: STATE_VERSION,
            vcpus: self
                .ctl
                .states
                .iter()
                .map(|s| *s.lock().expect("state"))
                .collect(),
            program: self.program,
        };
        serde_json::to_vec(&saved).map_err(|e| VmError::BadVcpuState(e.to_string()))
    }

    fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), VmError> {
        if self.running {
            return Err(VmError::NotPaused("restore vCPU state"));
        }
        let saved: SavedVcpus = serde_json::from_slice(state)
            .map_err(|e| VmError::BadVcpuState(format!("not soft-backend vCPU state: {e}")))?;
        if saved.magic != STATE_MAGIC || saved.version != STATE_VERSION {
            return Err(VmError::BadVcpuState(format!(
                "expected {STATE_MAGIC} version {STATE_VERSION}, got {} version {}",
                saved.magic, saved.version
            )));
        }
        if saved.vcpus.len() != self.ctl.states.len() {
            return Err(VmError::BadVcpuState(format!(
                "state has {} vCPUs, this VM {}",
                saved.vcpus.len(),
                self.ctl.states.len()
            )));
        }
        if !self.threads.is_empty() && saved.program != self.program {
            return Err(VmError::BadVcpuState(format!(
                "state of vCPUs running {:?}, and this VM's run {:?} already",
                saved.program, self.program
            )));
        }
        for (slot, s) in self.ctl.states.iter().zip(saved.vcpus) {
            *slot.lock().expect("state") = s;
        }
        self.program = saved.program;
        Ok(())
    }
}

impl MemoryFaults for SoftVm {
    fn set_fault_exits(&mut self, exits: FaultExits) -> Result<(), VmError> {
        if !self.threads.is_empty() {
            return Err(VmError::NotPaused(
                "deliver memory faults as vCPU exits (before the vCPUs first run)",
            ));
        }
        let residency = Arc::new(Residency::shared(exits.present));
        self.mmu
            .set_residency(Arc::clone(&residency))
            .map_err(|e| op("deliver memory faults as vCPU exits", e))?;
        let fetch = exits.fetch;
        let resolver: Arc<dyn PageResolver> =
            Arc::new(move |f: &MemoryFault| fetch(f.gpa.gfn()).map_err(SoftError::from));
        self.faults = Some(FaultDelivery::VcpuExit {
            resolver,
            residency,
        });
        Ok(())
    }
}

impl Drop for SoftVm {
    fn drop(&mut self) {
        self.ctl.exit.store(true, Ordering::SeqCst);
        self.ctl.wake();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
