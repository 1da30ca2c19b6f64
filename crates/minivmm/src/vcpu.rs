//! A vCPU thread: runs the vCPU, serves its port I/O (the serial ports)
//! and MMIO (the virtio-blk devices' registers) exits, and parks when
//! asked. A queue notification that exits here either is served on this
//! thread or wakes the I/O thread, as the device was built
//! ([`crate::blk::Notify`]).
//!
//! Pausing: the VMM sets the wish, then signals the thread until it has
//! parked (a signal that lands just before `KVM_RUN` is lost, so it is
//! sent again). Before parking, the thread enters `KVM_RUN` once more with
//! `immediate_exit` set: KVM completes the I/O instruction it last exited
//! for and returns at once. Without it the saved RIP would still point at
//! that `out`, and the destination would print the byte again.
//!
//! Throttling: the VM's one throttle thread ([`ferry_kvm::throttle`])
//! kicks the vCPU out with a sleep to take; the thread takes it before its
//! next `KVM_RUN`. With the dirty ring on, the vCPU's ring is its dirty
//! meter, and a full ring is drained here before the vCPU runs on.

use crate::layout::{MMIO_BASE, MMIO_SIZE};
use crate::linux::SLEEP_PORT;
use crate::Devices;
use ferry_engine::vmm::{catch_panic, GuestEntries};
use ferry_kvm::dirty::ring::DirtyRing;
use ferry_kvm::dirty::{RingFull, EXIT_DIRTY_RING_FULL};
use ferry_kvm::stats::KvmStats;
use ferry_kvm::throttle::{ThrottleSlot, Throttled};
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

const RUN: u8 = 0;
const PAUSE: u8 = 1;
const EXIT: u8 = 2;

/// Where the thread is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Parked,
    Running,
    Failed(String),
    /// The guest powered itself off (or asked for another sleep state):
    /// the vCPU does not run again.
    Off,
}

/// Why the run loop returned.
enum Stop {
    /// The VMM asked.
    Asked,
    /// The guest wrote its sleep control register.
    GuestOff,
}

/// What the vCPU's thread and the VM's throttle thread share.
pub struct Shared {
    fd: Mutex<VcpuFd>,
    want: AtomicU8,
    state: Mutex<State>,
    changed: Condvar,
    pthread: AtomicU64,
    /// The thread's kernel id (0 until it starts), for reports.
    tid: AtomicU32,
    /// The sleep the throttle leaves it, and those taken.
    slot: ThrottleSlot,
    /// Its dirty ring, where the VM tracks dirty pages by ring.
    ring: Option<RingFull>,
    devices: Arc<Devices>,
    /// The longest the thread has spent between two KVM_RUNs while the
    /// vCPU was wanted running, in ns: a throttle sleep, the exit's
    /// service and the host's scheduling, all that the guest cannot run.
    longest_out_ns: AtomicU64,
    /// KVM_RUN returns while wanted running: all, for a full dirty ring,
    /// and interrupted (a kick, or EAGAIN).
    exits: RunExits,
    /// Nanoseconds spent inside KVM_RUN.
    in_run_ns: AtomicU64,
    /// KVM_RUN calls while wanted running, counted as each begins.
    entries: AtomicU64,
    /// Inside KVM_RUN now (while wanted running).
    in_guest: AtomicBool,
    /// What KVM counts for the vCPU (`None` on kernels before 5.14).
    kvm_stats: Option<KvmStats>,
}

/// How often KVM_RUN returned, and why, as the vCPU thread counts it.
#[derive(Debug, Default)]
struct RunExits {
    all: AtomicU64,
    ring_full: AtomicU64,
    interrupted: AtomicU64,
}

/// What the throttle and KVM_RUN did to one vCPU, for its VM's summary.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// Throttle sleeps taken.
    pub sleeps: u64,
    /// Their time.
    pub slept: Duration,
    /// The longest stretch out of KVM_RUN while the vCPU was wanted
    /// running: a throttle sleep, an exit's service and the host's
    /// scheduling, all that the guest cannot run.
    pub longest_out_of_run: Duration,
    /// KVM_RUN returns while wanted running.
    pub kvm_run_returns: u64,
    /// Of those, for a full dirty ring.
    pub ring_full_exits: u64,
    /// Of those, interrupted (a kick, or EAGAIN).
    pub interrupted: u64,
    /// Time inside KVM_RUN: the guest's share of the wall clock, with
    /// KVM's own work for it (faults, exits it serves in the kernel).
    pub in_run: Duration,
    /// KVM's cumulative counters for the vCPU (`exits`, `pf_fixed`,
    /// `signal_exits`...; empty where the kernel has none).
    pub kvm: BTreeMap<String, u64>,
}

/// A handle on one vCPU's [`RunStats`], for a thread that samples them
/// while the VM runs.
#[derive(Clone)]
pub struct RunProbe(Arc<Shared>);

impl RunProbe {
    /// What the throttle and KVM_RUN did to the vCPU so far.
    pub fn run_stats(&self) -> RunStats {
        self.0.run_stats()
    }

    /// The vCPU thread's kernel id (0 until it has started).
    pub fn thread_id(&self) -> u32 {
        self.0.tid.load(Ordering::Acquire)
    }
}

/// One vCPU and its thread.
pub struct Vcpu {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

fn kick_signal() -> libc::c_int {
    SIGRTMIN() + 1
}

impl Vcpu {
    /// Spawns the thread for vCPU `index`, `fd` (with its dirty `ring`,
    /// if any), parked.
    pub fn spawn(
        index: u32,
        fd: VcpuFd,
        ring: Option<RingFull>,
        devices: Arc<Devices>,
    ) -> std::io::Result<Self> {
        static HANDLER: Once = Once::new();
        HANDLER.call_once(|| {
            register_signal_handler(kick_signal(), on_kick).expect("a real-time signal");
        });
        // Diagnostics only: a kernel without them runs the guest the same.
        let kvm_stats = KvmStats::of_vcpu(&fd).ok();
        let shared = Arc::new(Shared {
            fd: Mutex::new(fd),
            want: AtomicU8::new(PAUSE),
            state: Mutex::new(State::Parked),
            changed: Condvar::new(),
            pthread: AtomicU64::new(0),
            tid: AtomicU32::new(0),
            slot: ThrottleSlot::default(),
            longest_out_ns: AtomicU64::new(0),
            exits: RunExits::default(),
            in_run_ns: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            in_guest: AtomicBool::new(false),
            kvm_stats,
            ring,
            devices,
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("minivmm-vcpu{index}"))
            .spawn(move || {
                // A panic (in a device's code, say) must not leave the state
                // "running": a pause would wait for this thread for ever. It
                // fails the vCPU instead, and the thread waits to be dropped.
                if let Some(why) = catch_panic(|| run(&s)) {
                    set_state(
                        &s,
                        State::Failed(format!("the vCPU thread panicked: {why}")),
                    );
                    wait_for_exit(&s);
                }
            })?;
        Ok(Vcpu {
            shared,
            thread: Some(thread),
        })
    }

    /// The vCPU fd, for saving or loading its state while parked.
    pub fn fd(&self) -> std::sync::MutexGuard<'_, VcpuFd> {
        self.shared.fd.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The thread's kernel id (0 until it has started).
    pub fn thread_id(&self) -> u32 {
        self.shared.tid.load(Ordering::Acquire)
    }

    /// Lets the vCPU run.
    pub fn resume(&self) {
        self.shared.want.store(RUN, Ordering::Release);
        let _state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.changed.notify_all();
    }

    /// Asks the vCPU to stop; [`Vcpu::wait_parked`] waits for it. Asking
    /// every vCPU first stops them together.
    pub fn ask_pause(&self) {
        self.shared.want.store(PAUSE, Ordering::Release);
        self.shared.slot.interrupt();
        self.kick();
    }

    /// Returns once the vCPU is parked (or has failed).
    pub fn wait_parked(&self) {
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        while *state == State::Running {
            self.kick();
            state = self
                .shared
                .changed
                .wait_timeout(state, Duration::from_millis(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn kick(&self) {
        kick(&self.shared);
    }

    /// Why the vCPU stopped on its own, if it did.
    pub fn failure(&self) -> Option<String> {
        match &*self.shared.state.lock().unwrap_or_else(|e| e.into_inner()) {
            State::Failed(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// What the VM's throttle thread acts on.
    pub fn throttled(&self) -> Arc<dyn Throttled> {
        Arc::clone(&self.shared) as Arc<dyn Throttled>
    }

    /// What the throttle and KVM_RUN did to this vCPU so far.
    pub fn run_stats(&self) -> RunStats {
        self.shared.run_stats()
    }

    /// Its passes into the guest while wanted running: KVM_RUN calls so
    /// far, and whether it is in one now.
    pub fn guest_entries(&self) -> GuestEntries {
        GuestEntries {
            entered: self.shared.entries.load(Ordering::Acquire),
            inside: self.shared.in_guest.load(Ordering::Acquire),
        }
    }

    /// A handle that samples [`Vcpu::run_stats`] from another thread.
    pub fn run_probe(&self) -> RunProbe {
        RunProbe(Arc::clone(&self.shared))
    }
}

impl Shared {
    fn run_stats(&self) -> RunStats {
        let (slot, exits) = (&self.slot, &self.exits);
        RunStats {
            sleeps: slot.sleeps(),
            slept: slot.slept(),
            longest_out_of_run: Duration::from_nanos(self.longest_out_ns.load(Ordering::Relaxed)),
            kvm_run_returns: exits.all.load(Ordering::Relaxed),
            ring_full_exits: exits.ring_full.load(Ordering::Relaxed),
            interrupted: exits.interrupted.load(Ordering::Relaxed),
            in_run: Duration::from_nanos(self.in_run_ns.load(Ordering::Relaxed)),
            kvm: self
                .kvm_stats
                .as_ref()
                .and_then(|k| k.read().ok())
                .unwrap_or_default(),
        }
    }
}

impl Throttled for Shared {
    fn is_running(&self) -> bool {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) == State::Running
    }
    fn kick(&self) {
        kick(self)
    }
    fn slot(&self) -> &ThrottleSlot {
        &self.slot
    }
    fn ring(&self) -> Option<&DirtyRing> {
        self.ring.as_ref().map(RingFull::ring)
    }
}

fn kick(s: &Shared) {
    let thread = s.pthread.load(Ordering::Acquire);
    if thread != 0 {
        // The thread set its own id; the VM drops its throttle thread (the
        // only other kicker) before its vCPUs, and a Vcpu joins the thread
        // after its own last kick.
        // SAFETY: the pthread id is of a thread that is still alive.
        unsafe { libc::pthread_kill(thread as libc::pthread_t, kick_signal()) };
    }
}

impl Drop for Vcpu {
    fn drop(&mut self) {
        self.shared.want.store(EXIT, Ordering::Release);
        self.shared.slot.interrupt();
        {
            let _state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.changed.notify_all();
        }
        self.wait_parked();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits, parked, until the VM drops this vCPU.
fn wait_for_exit(s: &Shared) {
    let mut state = s.state.lock().unwrap_or_else(|e| e.into_inner());
    while s.want.load(Ordering::Acquire) != EXIT {
        state = s.changed.wait(state).unwrap_or_else(|e| e.into_inner());
    }
}

fn set_state(s: &Shared, state: State) {
    *s.state.lock().unwrap_or_else(|e| e.into_inner()) = state;
    s.changed.notify_all();
}

fn run(s: &Shared) {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    s.pthread.store(me as u64, Ordering::Release);
    s.tid
        .store(ferry_engine::vmm::current_thread_id(), Ordering::Release);
    loop {
        {
            let mut state = s.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                match s.want.load(Ordering::Acquire) {
                    EXIT => return,
                    RUN if !matches!(*state, State::Failed(_) | State::Off) => break,
                    _ => {}
                }
                state = s.changed.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            *state = State::Running;
        }
        let outcome = run_until_asked(s);
        let mut fd = s.fd.lock().unwrap_or_else(|e| e.into_inner());
        // Complete the I/O of the last exit before the state can be saved.
        fd.set_kvm_immediate_exit(1);
        let _ = fd.run();
        fd.set_kvm_immediate_exit(0);
        drop(fd);
        set_state(
            s,
            match outcome {
                Ok(Stop::Asked) => State::Parked,
                Ok(Stop::GuestOff) => State::Off,
                Err(why) => State::Failed(why),
            },
        );
    }
}

fn run_until_asked(s: &Shared) -> Result<Stop, String> {
    let mut fd = s.fd.lock().unwrap_or_else(|e| e.into_inner());
    let running = || s.want.load(Ordering::Acquire) == RUN;
    let mut out_since: Option<Instant> = None;
    while running() {
        // A kick that came outside KVM_RUN (while an exit was served)
        // left its sleep here: take it now, not a period late.
        s.slot.take(running);
        let entered = Instant::now();
        if let Some(t) = out_since {
            s.longest_out_ns
                .fetch_max((entered - t).as_nanos() as u64, Ordering::Relaxed);
        }
        s.entries.fetch_add(1, Ordering::Release);
        s.in_guest.store(true, Ordering::Release);
        let ran = fd.run();
        s.in_guest.store(false, Ordering::Release);
        let left = Instant::now();
        s.in_run_ns
            .fetch_add((left - entered).as_nanos() as u64, Ordering::Relaxed);
        out_since = Some(left);
        s.exits.all.fetch_add(1, Ordering::Relaxed);
        match ran {
            Ok(VcpuExit::Unsupported(EXIT_DIRTY_RING_FULL)) => {
                s.exits.ring_full.fetch_add(1, Ordering::Relaxed);
                if let Some(ring) = &s.ring {
                    ring.drain()
                        .map_err(|e| format!("draining the dirty ring: {e}"))?;
                }
            }
            Ok(VcpuExit::IoOut(port, data)) => {
                if let Some((console, offset)) = s.devices.console_at(port) {
                    lock(console).write(offset, data[0]);
                } else if port == SLEEP_PORT && s.devices.sleep_write(data[0]) {
                    return Ok(Stop::GuestOff);
                }
            }
            Ok(VcpuExit::IoIn(port, data)) => {
                data.fill(0xff);
                if let Some((console, offset)) = s.devices.console_at(port) {
                    data[0] = lock(console).read(offset);
                }
            }
            Ok(VcpuExit::MmioWrite(addr, data)) => {
                if let Some(offset) = mmio_offset(addr) {
                    s.devices.mmio_write(offset, data);
                }
            }
            Ok(VcpuExit::MmioRead(addr, data)) => {
                data.fill(0);
                if let Some(offset) = mmio_offset(addr) {
                    s.devices.mmio_read(offset, data);
                }
            }
            Ok(exit) => {
                let exit = format!("{exit:?}");
                let at = ferry_kvm::stopped::describe(&fd);
                return Err(format!("the guest stopped: {exit} ({at})"));
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                s.exits.interrupted.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => return Err(format!("KVM_RUN failed: {e}")),
        }
    }
    Ok(Stop::Asked)
}

/// The offset from the first device's registers, within the window of
/// the four disks and the fill device.
fn mmio_offset(addr: u64) -> Option<u64> {
    addr.checked_sub(MMIO_BASE)
        .filter(|&o| o < MMIO_SIZE * u64::from(crate::fill::MMIO_INDEX + 1))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
