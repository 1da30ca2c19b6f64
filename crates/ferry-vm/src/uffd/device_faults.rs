//! Faults of devices in other processes (a vhost-user backend's
//! userfaultfd, [`crate::DeviceUserfaultfd`]) while guest memory comes in
//! lazily: a postcopy destination's pages from the source, a lazy restore's
//! from its file. One thread per device reads its faults, brings each page
//! in as a vCPU's own fault would (`fetch`), and once the page is in guest
//! memory wakes the device, whose mapping of the same memory now finds it.
//!
//! ```text
//!  backend touches a missing page ── its uffd queues the fault, it blocks
//!  device-faults thread: wait_faults ─► fetch(gfn): the page placed in guest memory
//!                                     └► UFFDIO_WAKE on the backend's uffd
//! ```

use super::{Fault, Placer};
use crate::{DeviceUserfaultfd, FetchPage};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a thread waits for faults before it looks at `stop`.
const POLL: Duration = Duration::from_millis(50);

/// The threads serving every device's faults.
pub struct DeviceFaults {
    stop: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl DeviceFaults {
    /// Serves `devices`' faults, each page brought in by `fetch`.
    pub fn start(devices: Vec<DeviceUserfaultfd>, fetch: FetchPage) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let threads = devices
            .into_iter()
            .filter_map(|device| {
                let name = device.name.clone();
                let thread_name = name.clone();
                let placer = Placer::foreign(device);
                let fetch = Arc::clone(&fetch);
                let (stop, served) = (Arc::clone(&stop), Arc::clone(&served));
                std::thread::Builder::new()
                    .name("device-faults".into())
                    .spawn(move || serve(&thread_name, &placer, &fetch, &stop, &served))
                    .map_err(|e| tracing::warn!("{name}: no thread for its faults: {e}"))
                    .ok()
            })
            .collect();
        DeviceFaults {
            stop,
            served,
            threads,
        }
    }

    /// Stops the threads; returns the faults they served.
    pub fn stop(mut self) -> u64 {
        self.join();
        self.served.load(Ordering::Relaxed)
    }

    fn join(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for DeviceFaults {
    /// Whatever failed on the way stops them too.
    fn drop(&mut self) {
        self.join();
    }
}

fn serve(name: &str, placer: &Placer, fetch: &FetchPage, stop: &AtomicBool, served: &AtomicU64) {
    let mut faults = Vec::new();
    while !stop.load(Ordering::Acquire) {
        faults.clear();
        if let Err(e) = placer.wait_faults(POLL, &mut faults) {
            tracing::warn!("{name}: reading its faults failed: {e}");
            return;
        }
        for &Fault { gfn, .. } in &faults {
            if let Err(why) = fetch(gfn) {
                tracing::warn!("{name}: page {:#x}: {why}", gfn.0);
            }
            // Woken either way: a page that could not come leaves the
            // device to fault again, and what brings memory in fails on
            // its own.
            if let Err(e) = placer.wake(gfn, 1) {
                tracing::warn!("{name}: waking it at page {:#x}: {e}", gfn.0);
            }
            served.fetch_add(1, Ordering::Relaxed);
        }
    }
}
