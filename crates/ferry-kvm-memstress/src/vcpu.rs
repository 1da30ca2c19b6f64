//! vCPU threads: each owns one `VcpuFd` and loops in `KVM_RUN` until told to stop.
//!
//! Pausing: the controller sets `want = Pause` and signals the thread (a no-op
//! handler on `SIGRTMIN`) so `KVM_RUN` returns `EINTR`. A signal that lands just
//! before the thread re-enters `KVM_RUN` would be missed, so the controller
//! repeats it every millisecond until the thread acknowledges; the thread
//! re-checks `want` before every `KVM_RUN`.
//!
//! While paused, the thread holds no lock on its `VcpuFd`, so the controller can
//! save or restore its state.

use ferry_kvm::dirty::ring::DirtyRing;
use ferry_kvm::dirty::EXIT_DIRTY_RING_FULL;
use ferry_kvm::throttle::{ThrottleSlot, Throttled};
use ferry_memstress::{progress, MemoryLayout, SLEEP_PORT};
use ferry_vm::GuestRam;
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

const WANT_RUN: u8 = 0;
const WANT_PAUSE: u8 = 1;
const WANT_EXIT: u8 = 2;

/// Where a vCPU thread is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum VcpuState {
    /// Waiting, not in KVM_RUN.
    Paused,
    /// In (or about to enter) KVM_RUN.
    Running,
    /// Stopped on its own; the reason is kept for the engine.
    Failed(String),
}

/// What a vCPU thread needs to serve the guest's sleep requests.
pub(crate) struct Sleeper {
    pub ram: Arc<GuestRam>,
    pub tsc_khz: u64,
}

/// Longest single sleep a guest can ask for; it asks again if still ahead.
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// Sleep slice, so a pause request never waits longer than this.
const SLEEP_SLICE: Duration = Duration::from_millis(1);

impl Sleeper {
    /// Sleeps vCPU `index` for the ticks it asked for, in slices, returning
    /// early when it is asked to stop running.
    fn sleep(&self, index: u32, want: &AtomicU8) {
        let gpa = MemoryLayout::progress_gpa(index).add(progress::SLEEP_TICKS);
        let ticks = self.ram.load_u64(gpa).unwrap_or(0);
        let ns = u128::from(ticks) * 1_000_000 / u128::from(self.tsc_khz.max(1));
        sleep_while_running(MAX_SLEEP.min(Duration::from_nanos(ns as u64)), want);
    }
}

/// Sleeps for `total` in slices, returning early when the vCPU is asked to
/// stop running.
fn sleep_while_running(total: Duration, want: &AtomicU8) {
    let until = Instant::now() + total;
    while want.load(Ordering::Acquire) == WANT_RUN {
        let now = Instant::now();
        if now >= until {
            break;
        }
        std::thread::sleep(SLEEP_SLICE.min(until - now));
    }
}

/// State shared between a vCPU thread and its controller.
pub(crate) struct VcpuShared {
    pub index: u32,
    sleeper: Sleeper,
    /// The thread's pthread id (0 until it starts), for kicks by the throttler.
    pthread: AtomicU64,
    /// The thread's kernel id (0 until it starts), for reports.
    pub tid: AtomicU32,
    /// The sleep the throttle leaves it, and those taken.
    pub slot: ThrottleSlot,
    pub fd: Mutex<VcpuFd>,
    pub ring: Option<Arc<DirtyRing>>,
    want: AtomicU8,
    state: Mutex<VcpuState>,
    changed: Condvar,
}

/// A vCPU thread and its controls.
pub(crate) struct VcpuThread {
    pub shared: Arc<VcpuShared>,
    handle: Option<JoinHandle<()>>,
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

fn install_kick_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        register_signal_handler(SIGRTMIN(), kick_handler)
            .expect("SIGRTMIN is a valid real-time signal");
    });
}

impl VcpuThread {
    /// Spawns the thread for `fd`, initially paused.
    pub fn spawn(
        index: u32,
        fd: VcpuFd,
        ring: Option<Arc<DirtyRing>>,
        sleeper: Sleeper,
    ) -> std::io::Result<Self> {
        install_kick_handler();
        let shared = Arc::new(VcpuShared {
            index,
            sleeper,
            pthread: AtomicU64::new(0),
            tid: AtomicU32::new(0),
            slot: ThrottleSlot::default(),
            fd: Mutex::new(fd),
            ring,
            want: AtomicU8::new(WANT_PAUSE),
            state: Mutex::new(VcpuState::Paused),
            changed: Condvar::new(),
        });
        let thread_shared = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || {
                // A panic must not leave the state "running": a pause would
                // wait for this thread for ever. It fails the vCPU instead.
                if let Some(why) = ferry_vm::catch_panic(|| run_loop(&thread_shared)) {
                    let reason = format!("the vCPU thread panicked: {why}");
                    set_state(&thread_shared, VcpuState::Failed(reason));
                    park_failed(&thread_shared);
                }
            })?;
        Ok(VcpuThread {
            shared,
            handle: Some(handle),
        })
    }

    /// Lets the vCPU run.
    pub fn resume(&self) {
        let state = self.shared.lock_state();
        self.shared.want.store(WANT_RUN, Ordering::Release);
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Asks the vCPU to stop; does not wait.
    pub fn request_pause(&self) {
        self.shared.want.store(WANT_PAUSE, Ordering::Release);
        self.shared.slot.interrupt();
    }

    /// Waits until the vCPU is out of KVM_RUN, kicking it as needed.
    pub fn wait_paused(&self) -> VcpuState {
        let mut state = self.shared.lock_state();
        while *state == VcpuState::Running {
            if let Some(h) = &self.handle {
                // A failed kick means the thread is gone; the loop then sees
                // its final state.
                let _ = h.kill(SIGRTMIN());
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, Duration::from_millis(1))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.clone()
    }

    /// Runs the vCPU thread on host CPU `cpu` only.
    pub fn pin(&self, cpu: usize) -> std::io::Result<()> {
        use std::os::unix::thread::JoinHandleExt;
        let Some(h) = &self.handle else {
            return Err(std::io::Error::other("the vCPU thread has exited"));
        };
        ferry_vm::affinity::pin_thread(h.as_pthread_t(), cpu)
    }

    /// The vCPU's current state.
    pub fn state(&self) -> VcpuState {
        self.shared.lock_state().clone()
    }
}

impl VcpuShared {
    /// The state, even after a panic on the vCPU thread poisoned its lock
    /// (the thread then records its failure under it).
    fn lock_state(&self) -> MutexGuard<'_, VcpuState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The vCPU fd, even after a panic on the vCPU thread poisoned its lock.
    pub fn lock_fd(&self) -> MutexGuard<'_, VcpuFd> {
        self.fd.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the vCPU is in (or entering) KVM_RUN.
    pub fn is_running(&self) -> bool {
        *self.lock_state() == VcpuState::Running
    }

    /// Interrupts KVM_RUN on the vCPU's thread, if it has started.
    pub fn kick(&self) {
        let thread = self.pthread.load(Ordering::Acquire);
        if thread != 0 {
            // SAFETY: `thread` is this vCPU's live pthread: it is set by the
            // thread itself and the thread only exits when its VcpuThread is
            // dropped, after every kicker (the VM's throttler) has stopped.
            unsafe {
                libc::pthread_kill(thread as libc::pthread_t, SIGRTMIN());
            }
        }
    }
}

impl Throttled for VcpuShared {
    fn is_running(&self) -> bool {
        VcpuShared::is_running(self)
    }
    fn kick(&self) {
        VcpuShared::kick(self)
    }
    fn slot(&self) -> &ThrottleSlot {
        &self.slot
    }
    fn ring(&self) -> Option<&DirtyRing> {
        self.ring.as_deref()
    }
}

impl Drop for VcpuThread {
    fn drop(&mut self) {
        {
            // Store under the state lock so a thread between its check of
            // `want` and its wait cannot miss the notification.
            let _state = self.shared.lock_state();
            self.shared.want.store(WANT_EXIT, Ordering::Release);
        }
        self.shared.slot.interrupt();
        self.shared.changed.notify_all();
        self.wait_paused();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Sleeps the throttle share the throttler left for this vCPU, if any.
fn throttle_sleep(shared: &VcpuShared) {
    shared
        .slot
        .take(|| shared.want.load(Ordering::Acquire) == WANT_RUN);
}

fn set_state(shared: &VcpuShared, new: VcpuState) {
    *shared.lock_state() = new;
    shared.changed.notify_all();
}

fn run_loop(shared: &VcpuShared) {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    shared.pthread.store(me as u64, Ordering::Release);
    shared
        .tid
        .store(ferry_vm::current_thread_id(), Ordering::Release);
    loop {
        // Wait until asked to run (or to exit).
        {
            let mut state = shared.lock_state();
            loop {
                match shared.want.load(Ordering::Acquire) {
                    WANT_EXIT => return,
                    WANT_RUN if !matches!(*state, VcpuState::Failed(_)) => break,
                    _ => {
                        if *state == VcpuState::Running {
                            *state = VcpuState::Paused;
                            shared.changed.notify_all();
                        }
                        state = shared
                            .changed
                            .wait(state)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                }
            }
            *state = VcpuState::Running;
            shared.changed.notify_all();
        }
        let mut fd = shared.lock_fd();
        while shared.want.load(Ordering::Acquire) == WANT_RUN {
            // A kick that arrived outside KVM_RUN (during an exit's handling)
            // left its throttle sleep here: take it now, not a period late.
            throttle_sleep(shared);
            match fd.run() {
                Ok(VcpuExit::Unsupported(EXIT_DIRTY_RING_FULL)) => {
                    if let Some(ring) = &shared.ring {
                        if let Err(e) = ring.drain_full() {
                            drop(fd);
                            set_state(shared, VcpuState::Failed(e.to_string()));
                            return park_failed(shared);
                        }
                    }
                }
                Ok(VcpuExit::IoOut(SLEEP_PORT, _)) => {
                    shared.sleeper.sleep(shared.index, &shared.want);
                }
                Ok(exit) => {
                    let exit = format!("{exit:?}");
                    let reason = format!(
                        "unexpected exit {exit} ({})",
                        ferry_kvm::stopped::describe(&fd)
                    );
                    drop(fd);
                    set_state(shared, VcpuState::Failed(reason));
                    return park_failed(shared);
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    throttle_sleep(shared);
                }
                Err(e) => {
                    drop(fd);
                    set_state(shared, VcpuState::Failed(format!("KVM_RUN failed: {e}")));
                    return park_failed(shared);
                }
            }
        }
        drop(fd);
        set_state(shared, VcpuState::Paused);
    }
}

/// A failed vCPU waits for the VM to be torn down.
fn park_failed(shared: &VcpuShared) {
    let mut state = shared.lock_state();
    while shared.want.load(Ordering::Acquire) != WANT_EXIT {
        state = shared
            .changed
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
}
