//! `ferry bench demand-paging --backend soft`: the annotated-memory-faults
//! seed's table. Postcopy page-in rate against vCPU threads, for the two
//! ways a vCPU's missing-page fault gets resolved:
//!
//! ```text
//!  shared queue  the vCPU queues its fault on one queue (one lock, one wait
//!                queue) and sleeps; as many handler threads as vCPUs pop
//!                faults, place pages and wake every sleeper (userfaultfd
//!                with one fd for all memory, the seed's baseline)
//!  vCPU-direct   the vCPU exits with (gpa, size, flags) and places the page
//!                on its own thread (KVM_EXIT_MEMORY_FAULT with
//!                KVM_CAP_NOWAIT_ON_FAULT, the seed)
//! ```
//!
//! Each vCPU thread reads every page of its own region once, in order, and
//! checks it holds the source's stamp. Both paths place a page with the
//! same copy; the direct path also pays a modelled exit to the VMM
//! (`exit_cost_ns`) for each memory-fault exit, which the queue's sleepers
//! do not, so the comparison leans against the seed's mechanism.

use ferry_soft::fault_exit::{
    FaultCounts, FaultDelivery, FaultQueue, MemoryFault, PageResolver, Residency,
};
use ferry_soft::guest_mem::{HostView, VcpuMem};
use ferry_soft::{Mechanisms, Mmu, SoftError};
use ferry_vm::{Backing, Gfn, GuestRam, PAGE_SIZE};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct SoftCell {
    /// vCPUs touching missing pages.
    pub vcpus: usize,
    /// "shared queue" or "vCPU-direct".
    pub delivery: String,
    /// Fault handler threads (shared queue only).
    pub handlers: usize,
    /// Pages placed.
    pub pages: u64,
    /// From the first touch to the last page in, in ms.
    pub elapsed_ms: f64,
    /// Pages per second, all vCPUs.
    pub pages_per_s: f64,
    /// Pages per second per vCPU.
    pub pages_per_s_per_vcpu: f64,
    /// Memory-fault exits the vCPUs took.
    pub exits: u64,
    /// Pages that read back differently from the source (must be 0).
    pub bad_pages: u64,
}

/// The stamp of source page `gfn`.
fn stamp(gfn: u64) -> u64 {
    gfn.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// Runs `vcpus` threads over `pages_per_vcpu` missing pages each.
pub fn run(
    vcpus: usize,
    shared_queue: bool,
    pages_per_vcpu: u64,
    exit_cost_ns: u64,
) -> Result<SoftCell, SoftError> {
    let frames = pages_per_vcpu * vcpus as u64;
    let bytes = frames * PAGE_SIZE as u64;
    let src = Arc::new(GuestRam::new(&[bytes], Backing::Anonymous)?);
    let mut page = vec![0u8; PAGE_SIZE];
    for g in 0..frames {
        ferry_memstress::Fill::Text.fill_page(g, &mut page);
        page[..8].copy_from_slice(&stamp(g).to_le_bytes());
        src.write_pages(Gfn(g), &page)?;
    }
    let dst = Arc::new(GuestRam::new(&[bytes], Backing::Anonymous)?);
    let residency = Arc::new(Residency::new(frames));
    let mmu = Arc::new(Mmu::new(frames, vcpus, Mechanisms::default())?);
    mmu.set_residency(Arc::clone(&residency))?;
    let copy = {
        let (src, dst) = (Arc::clone(&src), Arc::clone(&dst));
        move |f: &MemoryFault| -> Result<(), SoftError> {
            let mut page = [0u8; PAGE_SIZE];
            src.read_pages(f.gpa.gfn(), &mut page)?;
            dst.write_pages(f.gpa.gfn(), &page)?;
            Ok(())
        }
    };
    let (delivery, handlers) = if shared_queue {
        let (q, h) = FaultQueue::start(vcpus, Arc::clone(&residency), Arc::new(copy));
        (FaultDelivery::SharedQueue(q), h)
    } else {
        let resolver: Arc<dyn PageResolver> = Arc::new(move |f: &MemoryFault| {
            ferry_soft::hw_cost::spin_for(exit_cost_ns);
            copy(f)
        });
        (
            FaultDelivery::VcpuExit {
                resolver,
                residency: Arc::clone(&residency),
            },
            Vec::new(),
        )
    };
    let counts = Arc::new(FaultCounts::default());
    let bad = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(vcpus + 1));
    let threads: Vec<_> = (0..vcpus)
        .map(|v| {
            let (mmu, dst, delivery, counts, bad, start) = (
                Arc::clone(&mmu),
                Arc::clone(&dst),
                delivery.clone(),
                Arc::clone(&counts),
                Arc::clone(&bad),
                Arc::clone(&start),
            );
            std::thread::spawn(move || -> Result<(), SoftError> {
                let mut mem = VcpuMem::new(mmu, HostView::of(&dst), v);
                mem.set_exit_cost_ns(0);
                start.wait();
                mem.online();
                let first = v as u64 * pages_per_vcpu;
                for g in first..first + pages_per_vcpu {
                    mem.boundary();
                    let got = mem.load_u64_resolving(g * PAGE_SIZE as u64, &delivery, &counts)?;
                    if got != stamp(g) {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
                mem.offline();
                Ok(())
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let mut result = Ok(());
    for t in threads {
        let r = t
            .join()
            .unwrap_or_else(|_| Err(SoftError::Options("a vCPU thread panicked".into())));
        result = result.and(r);
    }
    let secs = t0.elapsed().as_secs_f64();
    if let FaultDelivery::SharedQueue(q) = &delivery {
        q.shutdown();
    }
    for h in handlers {
        let _ = h.join();
    }
    result?;
    Ok(SoftCell {
        vcpus,
        delivery: if shared_queue {
            "shared queue"
        } else {
            "vCPU-direct"
        }
        .into(),
        handlers: if shared_queue { vcpus } else { 0 },
        pages: frames,
        elapsed_ms: secs * 1e3,
        pages_per_s: frames as f64 / secs,
        pages_per_s_per_vcpu: frames as f64 / secs / vcpus as f64,
        exits: counts.exits.load(Ordering::Relaxed),
        bad_pages: bad.load(Ordering::Relaxed),
    })
}
