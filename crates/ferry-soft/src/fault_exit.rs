//! Postcopy page faults: annotated fault exits (seed) vs a shared fault queue
//! (userfaultfd, the baseline).
//!
//! With a [`Residency`] set on the MMU, a vCPU whose missing-page fault hits a
//! page that has not arrived yet gets [`SoftError::MemoryFault`], carrying
//! `(gpa, size, flags)`: KVM's `KVM_EXIT_MEMORY_FAULT` with
//! `KVM_CAP_NOWAIT_ON_FAULT`. How the fault is then resolved is the switch:
//!
//! ```text
//!  VcpuExit     the faulting vCPU calls the resolver itself, on its own thread;
//!               page-in rate scales with vCPUs
//!  SharedQueue  the vCPU queues the fault and sleeps on one wait queue behind
//!               one lock; N handler threads pop faults, resolve them and wake
//!               every sleeper (userfaultfd's single wait queue)
//! ```
//!
//! The resolver fetches the page into guest RAM (UFFDIO_COPY); it must be
//! idempotent, because two vCPUs may fault on the same page at once.

use crate::error::SoftError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

pub use crate::fault::{FaultFlags, MemoryFault, Residency};

/// Brings a faulting page into guest RAM.
pub trait PageResolver: Send + Sync {
    /// Makes `fault.size` bytes at `fault.gpa` hold their migrated contents.
    fn resolve(&self, fault: &MemoryFault) -> Result<(), SoftError>;
}

impl<F: Fn(&MemoryFault) -> Result<(), SoftError> + Send + Sync> PageResolver for F {
    fn resolve(&self, fault: &MemoryFault) -> Result<(), SoftError> {
        self(fault)
    }
}

#[derive(Default)]
struct QueueState {
    pending: VecDeque<MemoryFault>,
    shutdown: bool,
    failure: Option<String>,
}

/// The baseline: one queue, one lock, one wait queue, N handler threads.
pub struct FaultQueue {
    state: Mutex<QueueState>,
    wait: Condvar,
    residency: Arc<Residency>,
    resolved: AtomicU64,
}

impl FaultQueue {
    /// A queue served by `handlers` threads calling `resolver`.
    pub fn start(
        handlers: usize,
        residency: Arc<Residency>,
        resolver: Arc<dyn PageResolver>,
    ) -> (Arc<FaultQueue>, Vec<JoinHandle<()>>) {
        let q = Arc::new(FaultQueue {
            state: Mutex::new(QueueState::default()),
            wait: Condvar::new(),
            residency,
            resolved: AtomicU64::new(0),
        });
        let threads = (0..handlers.max(1))
            .map(|_| {
                let (q, r) = (Arc::clone(&q), Arc::clone(&resolver));
                std::thread::spawn(move || q.serve(&*r))
            })
            .collect();
        (q, threads)
    }

    fn serve(&self, resolver: &dyn PageResolver) {
        loop {
            let fault = {
                let mut s = self.state.lock().expect("fault queue");
                loop {
                    if s.shutdown {
                        return;
                    }
                    if let Some(f) = s.pending.pop_front() {
                        break f;
                    }
                    s = self.wait.wait(s).expect("fault queue");
                }
            };
            let gfn = fault.gpa.gfn();
            // A page several vCPUs queued is resolved once, unless two
            // handlers pop it at the same moment.
            let result = if self.residency.is_present(gfn) {
                Ok(false)
            } else {
                resolver.resolve(&fault).map(|()| true)
            };
            let mut s = self.state.lock().expect("fault queue");
            match result {
                Ok(resolved) => {
                    // Count before publishing: whoever sees the page present
                    // also sees it counted.
                    if resolved {
                        self.resolved.fetch_add(1, Ordering::Relaxed);
                    }
                    self.residency.mark_present(gfn);
                }
                Err(e) => s.failure = Some(e.to_string()),
            }
            // One wait queue: every sleeper wakes and re-checks its page.
            self.wait.notify_all();
        }
    }

    /// Queues `fault` and sleeps until its page is present.
    pub fn wait_resolved(&self, fault: MemoryFault) -> Result<(), SoftError> {
        let gfn = fault.gpa.gfn();
        let mut s = self.state.lock().expect("fault queue");
        s.pending.push_back(fault);
        self.wait.notify_all();
        while !self.residency.is_present(gfn) {
            if let Some(f) = &s.failure {
                return Err(SoftError::Options(format!("fault handler failed: {f}")));
            }
            s = self.wait.wait(s).expect("fault queue");
        }
        Ok(())
    }

    /// Faults resolved by the handlers.
    pub fn resolved(&self) -> u64 {
        self.resolved.load(Ordering::Relaxed)
    }

    /// Stops the handler threads.
    pub fn shutdown(&self) {
        self.state.lock().expect("fault queue").shutdown = true;
        self.wait.notify_all();
    }
}

/// How a vCPU's memory fault gets resolved.
#[derive(Clone)]
pub enum FaultDelivery {
    /// Annotated exit: the vCPU resolves it on its own thread.
    VcpuExit {
        /// Fetches pages.
        resolver: Arc<dyn PageResolver>,
        /// Pages present.
        residency: Arc<Residency>,
    },
    /// Baseline: through the shared queue.
    SharedQueue(Arc<FaultQueue>),
}

/// Counts of a vCPU's postcopy faults.
#[derive(Default, Debug)]
pub struct FaultCounts {
    /// Memory-fault exits taken.
    pub exits: AtomicU64,
    /// Set when a resolution failed.
    pub failed: AtomicBool,
}

impl FaultDelivery {
    /// Resolves one memory fault for the calling vCPU.
    pub fn resolve(&self, fault: MemoryFault) -> Result<(), SoftError> {
        match self {
            FaultDelivery::VcpuExit {
                resolver,
                residency,
            } => {
                if !residency.is_present(fault.gpa.gfn()) {
                    resolver.resolve(&fault)?;
                    residency.mark_present(fault.gpa.gfn());
                }
                Ok(())
            }
            FaultDelivery::SharedQueue(q) => q.wait_resolved(fault),
        }
    }
}
