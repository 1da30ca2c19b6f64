//! Postcopy faults: annotated exits resolved on the vCPU's thread, and the
//! shared-queue baseline, both delivering every page exactly as migrated.

use ferry_soft::fault_exit::{
    FaultCounts, FaultDelivery, FaultFlags, FaultQueue, MemoryFault, PageResolver, Residency,
};
use ferry_soft::guest_mem::{HostView, VcpuMem};
use ferry_soft::{Mechanisms, Mmu, SoftError};
use ferry_vm::{Backing, Gfn, Gpa, GuestRam, PAGE_SIZE};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const RAM: u64 = 4 << 20;
const FRAMES: u64 = RAM / PAGE_SIZE as u64;

#[test]
fn a_missing_page_exits_with_its_address_size_and_flags() {
    let mmu = Mmu::new(FRAMES, 1, Mechanisms::default()).unwrap();
    let residency = Arc::new(Residency::new(FRAMES));
    mmu.set_residency(Arc::clone(&residency)).unwrap();
    match mmu.translate(None, Gfn(77), true) {
        Err(SoftError::MemoryFault(f)) => assert_eq!(
            f,
            MemoryFault {
                gpa: Gpa(77 * 4096),
                size: 4096,
                flags: FaultFlags { write: true }
            }
        ),
        other => panic!("expected a memory fault, got {other:?}"),
    }
    residency.mark_present(Gfn(77));
    assert!(mmu.translate(None, Gfn(77), false).is_ok());
    assert_eq!(
        mmu.lookup(Gfn(77)).unwrap().1,
        1,
        "postcopy maps 4 KiB pages"
    );
    assert!(mmu.set_residency(residency).is_err());
}

fn postcopy(shared_queue: bool) {
    let src = Arc::new(GuestRam::new(&[RAM], Backing::Anonymous).unwrap());
    for g in 0..FRAMES {
        src.store_u64(Gfn(g).gpa(), g * 3 + 1).unwrap();
    }
    let dst = Arc::new(GuestRam::new(&[RAM], Backing::Anonymous).unwrap());
    let residency = Arc::new(Residency::new(FRAMES));
    let fetched = Arc::new(AtomicU64::new(0));
    let resolver: Arc<dyn PageResolver> = {
        let (src, dst, fetched) = (Arc::clone(&src), Arc::clone(&dst), Arc::clone(&fetched));
        Arc::new(move |f: &MemoryFault| -> Result<(), SoftError> {
            let mut page = vec![0u8; PAGE_SIZE];
            src.read_pages(f.gpa.gfn(), &mut page)?;
            dst.write_pages(f.gpa.gfn(), &page)?;
            fetched.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    };
    let mmu = Arc::new(Mmu::new(FRAMES, 4, Mechanisms::default()).unwrap());
    mmu.set_residency(Arc::clone(&residency)).unwrap();
    let (delivery, handlers) = if shared_queue {
        let (q, h) = FaultQueue::start(2, Arc::clone(&residency), resolver);
        (FaultDelivery::SharedQueue(q), h)
    } else {
        (
            FaultDelivery::VcpuExit {
                resolver,
                residency: Arc::clone(&residency),
            },
            Vec::new(),
        )
    };
    let counts = Arc::new(FaultCounts::default());
    let vcpus: Vec<_> = (0..4u64)
        .map(|v| {
            let (mmu, dst, delivery, counts) = (
                Arc::clone(&mmu),
                Arc::clone(&dst),
                delivery.clone(),
                Arc::clone(&counts),
            );
            std::thread::spawn(move || {
                let mut mem = VcpuMem::new(mmu, HostView::of(&dst), v as usize);
                mem.online();
                // Each vCPU reads every page, starting at its own quarter, so
                // vCPUs race on the same pages.
                for k in 0..FRAMES {
                    mem.boundary();
                    let g = (k + v * FRAMES / 4) % FRAMES;
                    let value = mem
                        .load_u64_resolving(g * PAGE_SIZE as u64, &delivery, &counts)
                        .unwrap();
                    assert_eq!(value, g * 3 + 1, "page {g} arrived with the wrong contents");
                }
                mem.offline();
            })
        })
        .collect();
    for t in vcpus {
        t.join().unwrap();
    }
    if let FaultDelivery::SharedQueue(q) = &delivery {
        // Two handlers may pop the same page at once; never fewer than one each.
        assert!(
            q.resolved() >= FRAMES,
            "every page resolved by the handlers"
        );
        q.shutdown();
    }
    for h in handlers {
        h.join().unwrap();
    }
    assert!((0..FRAMES).all(|g| residency.is_present(Gfn(g))));
    assert!(fetched.load(Ordering::Relaxed) >= FRAMES);
    assert!(counts.exits.load(Ordering::Relaxed) >= FRAMES);
}

#[test]
fn annotated_exits_resolve_on_the_vcpu_thread() {
    postcopy(false);
}

#[test]
fn shared_fault_queue_resolves_every_page() {
    postcopy(true);
}
