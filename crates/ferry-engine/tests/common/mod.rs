//! A small but real test VM: one "vCPU" thread that walks the data region
//! writing stamps through `GuestRam` (so every write is tracked through the
//! VMM-dirty bitmap) and checks, before each write, that the page still holds
//! the stamp of the previous pass — the memstress self-check in miniature.
//! Its "vCPU state" is the walk position, so a migrated guest continues where
//! the source stopped and any lost page shows up as a mismatch.

#![allow(dead_code)]

pub mod relay;

use ferry_backend::memstress::{progress, stamp};
use ferry_backend::{
    BackendError, BackendKind, Backing, DirtyPages, GuestRam, HarvestStats, MemoryLayout, Vm,
    VmConfig, Workload, PAGE_SIZE,
};
use ferry_engine::wire::StreamHeader;
use ferry_engine::{
    await_migration, listen, receive, MigrationError, ReceiveOptions, ReceiveSummary, TcpDialer,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub type Received = Result<(Box<dyn Vm>, ReceiveSummary), MigrationError>;

/// A test VM whose guest thread is running and has written every page
/// once (so a full pass sends data, not zero pages, even on a loaded host).
pub fn running_source() -> TestVm {
    let mut vm = TestVm::new(&config()).unwrap();
    vm.start().unwrap();
    let pass = MemoryLayout::progress_gpa(0).add(progress::PASS);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while vm.ram.load_u64(pass).unwrap() < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the test guest did not finish a pass in 30 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    vm
}

/// A destination in a thread, listening on loopback; returns how to reach it.
pub fn spawn_receiver(opts: ReceiveOptions) -> (TcpDialer, JoinHandle<Received>) {
    spawn_receiver_on(opts, Backing::Anonymous)
}

/// [`spawn_receiver`] with the destination's guest RAM on `backing`.
pub fn spawn_receiver_on(
    opts: ReceiveOptions,
    backing: Backing,
) -> (TcpDialer, JoinHandle<Received>) {
    let listener = listen("127.0.0.1:0").unwrap();
    let to = TcpDialer(listener.local_addr().unwrap().to_string());
    let dest = std::thread::spawn(move || {
        let incoming = await_migration(&listener)?;
        let mut create = |h: &StreamHeader| -> Result<Box<dyn Vm>, BackendError> {
            let config = VmConfig::from_guest_section(h.backend, &h.guest, backing)?;
            TestVm::boxed(&config)
        };
        receive(incoming, &listener, &mut create, &opts)
    });
    (to, dest)
}

/// Builds a destination test VM from a stream header.
pub fn create_test_vm(h: &StreamHeader) -> Result<Box<dyn Vm>, BackendError> {
    let config = VmConfig::from_guest_section(h.backend, &h.guest, Backing::Anonymous)?;
    TestVm::boxed(&config)
}

/// Destination options that report soon after switchover.
pub fn quick_receive() -> ReceiveOptions {
    ReceiveOptions {
        run_after: Duration::from_millis(50),
        ..ReceiveOptions::default()
    }
}

pub fn config() -> VmConfig {
    VmConfig {
        backend: BackendKind::Soft,
        workload: Workload {
            vcpus: 1,
            bytes_per_vcpu: 4 << 20,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    }
}

pub struct TestVm {
    config: VmConfig,
    ram: Arc<GuestRam>,
    /// pass << 32 | next page
    position: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    /// Percent of its time the guest thread sleeps (time throttling).
    throttle: Arc<AtomicU64>,
    /// The guest stops writing once it reaches this pass.
    last_pass: Arc<AtomicU64>,
    pub logging: bool,
    /// Write a page after the final harvest, so the digest must catch it.
    pub untracked_write_on_save: bool,
}

impl TestVm {
    pub fn new(config: &VmConfig) -> Result<Self, BackendError> {
        let layout = config.layout();
        let ram = Arc::new(GuestRam::new(&layout.slot_sizes(), config.backing)?);
        // Something for the VMM to have written at build time, as backends do.
        ram.store_u64(MemoryLayout::params_gpa(0), 0xc0de)?;
        Ok(TestVm {
            config: config.clone(),
            ram,
            position: Arc::new(AtomicU64::new(1 << 32)),
            stop: Arc::new(AtomicBool::new(false)),
            worker: None,
            throttle: Arc::new(AtomicU64::new(0)),
            last_pass: Arc::new(AtomicU64::new(u64::MAX)),
            logging: false,
            untracked_write_on_save: false,
        })
    }

    pub fn boxed(config: &VmConfig) -> Result<Box<dyn Vm>, BackendError> {
        Ok(Box::new(Self::new(config)?))
    }

    /// Has the guest write `passes` more passes from now, then idle: a page
    /// written in them and lost by the migration is never written again,
    /// so the digest catches it.
    pub fn stop_writing_after(&self, passes: u64) {
        let pass = self.position.load(Ordering::Acquire) >> 32;
        self.last_pass.store(pass + passes, Ordering::Release);
    }

    /// The time throttle, in percent, readable while the VM migrates.
    pub fn throttle_handle(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.throttle)
    }
}

fn guest(
    ram: Arc<GuestRam>,
    layout: MemoryLayout,
    position: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    throttle: Arc<AtomicU64>,
    last_pass: Arc<AtomicU64>,
) {
    let pages = layout.data_bytes / PAGE_SIZE as u64;
    let prog = MemoryLayout::progress_gpa(0);
    let pos = position.load(Ordering::Acquire);
    let (mut pass, mut page) = (pos >> 32, pos & 0xffff_ffff);
    while !stop.load(Ordering::Acquire) {
        if pass >= last_pass.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let gpa = layout.data_gpa().add(page * PAGE_SIZE as u64);
        let expect = if pass <= 1 {
            0
        } else {
            stamp(0, page, (pass - 1) as u32)
        };
        if ram.load_u64(gpa).unwrap() != expect {
            let m = ram.load_u64(prog.add(progress::MISMATCHES)).unwrap();
            ram.store_u64(prog.add(progress::MISMATCHES), m + 1)
                .unwrap();
        }
        ram.store_u64(gpa, stamp(0, page, pass as u32)).unwrap();
        page += 1;
        if page == pages {
            ram.store_u64(prog.add(progress::PASS), pass).unwrap();
            page = 0;
            pass += 1;
        }
        position.store(pass << 32 | page, Ordering::Release);
        if page % 64 == 0 {
            // 100 µs of rest per 64 pages, stretched by the throttle.
            let pct = throttle.load(Ordering::Relaxed).min(99);
            std::thread::sleep(Duration::from_micros(100 * 100 / (100 - pct)));
        }
    }
}

impl Vm for TestVm {
    fn config(&self) -> &VmConfig {
        &self.config
    }
    fn set_time_throttle(&mut self, percent: u8) -> Result<(), BackendError> {
        self.throttle.store(u64::from(percent), Ordering::Relaxed);
        Ok(())
    }
    fn ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }
    fn start(&mut self) -> Result<(), BackendError> {
        if self.worker.is_none() {
            self.stop.store(false, Ordering::Release);
            let (ram, pos, stop, throttle, last) = (
                Arc::clone(&self.ram),
                Arc::clone(&self.position),
                Arc::clone(&self.stop),
                Arc::clone(&self.throttle),
                Arc::clone(&self.last_pass),
            );
            let layout = self.config.layout();
            self.worker = Some(std::thread::spawn(move || {
                guest(ram, layout, pos, stop, throttle, last)
            }));
        }
        Ok(())
    }
    fn pause(&mut self) -> Result<(), BackendError> {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.worker.take() {
            w.join().map_err(|_| BackendError::VcpuFailed {
                vcpu: 0,
                reason: "panicked".into(),
            })?;
        }
        Ok(())
    }
    fn is_running(&self) -> bool {
        self.worker.is_some()
    }
    fn check_health(&self) -> Result<(), BackendError> {
        match &self.worker {
            Some(w) if w.is_finished() => Err(BackendError::VcpuFailed {
                vcpu: 0,
                reason: "guest thread exited".into(),
            }),
            _ => Ok(()),
        }
    }
    fn dirty_tracking(&self) -> String {
        "vmm-bitmap".into()
    }
    fn start_dirty_log(&mut self) -> Result<(), BackendError> {
        self.logging = true;
        Ok(())
    }
    fn harvest_dirty(&mut self, _into: &mut DirtyPages) -> Result<HarvestStats, BackendError> {
        // Every guest write goes through GuestRam, so the engine's
        // take_vmm_dirty sees it; the "hardware" log is empty.
        Ok(HarvestStats::default())
    }
    fn stop_dirty_log(&mut self) -> Result<(), BackendError> {
        self.logging = false;
        Ok(())
    }
    fn save_vcpus(&mut self) -> Result<Vec<u8>, BackendError> {
        if self.is_running() {
            return Err(BackendError::NotPaused("save vCPUs"));
        }
        if self.untracked_write_on_save {
            let gpa = self
                .config
                .layout()
                .data_gpa()
                .add(12 * PAGE_SIZE as u64 + 512);
            self.ram.store_u64(gpa, 0xbad)?;
        }
        Ok(self.position.load(Ordering::Acquire).to_le_bytes().to_vec())
    }
    fn restore_vcpus(&mut self, state: &[u8]) -> Result<(), BackendError> {
        let bytes: [u8; 8] = state
            .try_into()
            .map_err(|_| BackendError::BadVcpuState(format!("{} bytes", state.len())))?;
        self.position
            .store(u64::from_le_bytes(bytes), Ordering::Release);
        Ok(())
    }
}

impl Drop for TestVm {
    fn drop(&mut self) {
        let _ = self.pause();
    }
}
