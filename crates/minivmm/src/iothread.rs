//! An I/O thread: serves disks' queues off the vCPU threads, as Cloud
//! Hypervisor's virtio threads and QEMU's iothreads do, so that requests
//! are in flight while the vCPUs run. minivmm gives each disk its own, as
//! Cloud Hypervisor does, so that one disk's slow write does not hold up
//! another's.
//!
//! It waits on one eventfd per disk it serves (signalled by KVM through
//! `KVM_IOEVENTFD`, or by a vCPU's exit handler) and on its own wake
//! eventfd. The VMM quiesces it once the vCPUs are parked: the batch it is
//! serving finishes, and it takes no further notification; one that
//! arrives meanwhile stays in its eventfd, where the device's section sees
//! it (the `notify` subsection) and a resumed thread finds it.

use crate::Devices;
use ferry_engine::vmm::catch_panic;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use vmm_sys_util::eventfd::EventFd;

/// What the VMM wants of the thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Serve,
    Quiesce,
    Exit,
}

struct State {
    want: Want,
    /// Between taking notifications and finishing their batches.
    busy: bool,
    failure: Option<String>,
}

struct Shared {
    devices: Arc<Devices>,
    /// The disks served (their index in `devices.blks`), and the eventfd
    /// that notifies each.
    kicks: Vec<(usize, EventFd)>,
    /// Wakes the thread out of its wait when the VMM wants something.
    wake: EventFd,
    state: Mutex<State>,
    changed: Condvar,
}

/// Errors starting the thread.
#[derive(Debug, thiserror::Error)]
pub enum IoThreadError {
    /// An eventfd or the thread itself.
    #[error("cannot start the I/O thread: {0}")]
    Start(#[source] std::io::Error),
}

/// The I/O thread, quiesced until [`IoThread::resume`].
pub struct IoThread {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl IoThread {
    /// Starts thread `name`, quiesced, serving each disk of `kicks` (its
    /// index in `devices.blks`) when its eventfd fires.
    pub fn spawn(
        name: String,
        devices: Arc<Devices>,
        kicks: Vec<(usize, EventFd)>,
    ) -> Result<Self, IoThreadError> {
        let shared = Arc::new(Shared {
            devices,
            kicks,
            wake: EventFd::new(libc::EFD_NONBLOCK).map_err(IoThreadError::Start)?,
            state: Mutex::new(State {
                want: Want::Quiesce,
                busy: false,
                failure: None,
            }),
            changed: Condvar::new(),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                if let Some(why) = catch_panic(|| run(&s)) {
                    let mut state = lock(&s.state);
                    state.failure = Some(format!("the I/O thread panicked: {why}"));
                    state.busy = false;
                    s.changed.notify_all();
                }
            })
            .map_err(IoThreadError::Start)?;
        Ok(IoThread {
            shared,
            thread: Some(thread),
        })
    }

    /// Lets the thread serve notifications, including any that waited.
    pub fn resume(&self) {
        self.set(Want::Serve);
    }

    /// Returns once the thread has finished the batch it was serving and
    /// takes no more.
    pub fn quiesce(&self) {
        self.set(Want::Quiesce);
        let mut state = lock(&self.shared.state);
        while state.busy {
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Why the thread stopped on its own, if it did.
    pub fn failure(&self) -> Option<String> {
        lock(&self.shared.state).failure.clone()
    }

    fn set(&self, want: Want) {
        lock(&self.shared.state).want = want;
        self.shared.changed.notify_all();
        // Fails only with the counter near u64::MAX: the thread wakes.
        let _ = self.shared.wake.write(1);
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        self.set(Want::Exit);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn run(s: &Shared) {
    let mut fds: Vec<libc::pollfd> = s
        .kicks
        .iter()
        .map(|(_, kick)| kick)
        .chain(std::iter::once(&s.wake))
        .map(|e| libc::pollfd {
            fd: e.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        {
            let mut state = lock(&s.state);
            loop {
                match state.want {
                    Want::Exit => return,
                    Want::Serve => break,
                    Want::Quiesce => {
                        state.busy = false;
                        s.changed.notify_all();
                        state = s.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
            state.busy = true;
        }
        for f in &mut fds {
            f.revents = 0;
        }
        // SAFETY: `fds` is a valid array of its length; the fds live in
        // `s` for as long as this thread.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            continue; // EINTR: look again.
        }
        if fds[fds.len() - 1].revents & libc::POLLIN != 0 {
            let _ = s.wake.read();
        }
        // A quiesce that woke the thread leaves the notifications that
        // came with it untaken.
        if lock(&s.state).want != Want::Serve {
            continue;
        }
        for ((disk, kick), fd) in s.kicks.iter().zip(&fds) {
            if fd.revents & libc::POLLIN != 0 && kick.read().is_ok() {
                lock(&s.devices.blks[*disk]).serve();
            }
        }
    }
}
