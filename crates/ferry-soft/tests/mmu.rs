//! Deterministic behaviour of each mechanism and its baseline.

use ferry_soft::pte;
use ferry_soft::{Iteration, LeafSize, Mechanisms, Mmu, SplitMode, WriteProtect};
use ferry_vm::{DirtyPages, Gfn};

const FRAMES: u64 = 1 << 20; // 4 GiB

fn mmu(m: Mechanisms) -> Mmu {
    Mmu::new(FRAMES, 2, m).unwrap()
}

#[test]
fn read_fault_maps_a_huge_leaf_when_allowed() {
    let m = mmu(Mechanisms::default());
    let t = m.translate(None, Gfn(0x12345), false).unwrap();
    assert!(!t.writable);
    let (e, level) = m.lookup(Gfn(0x12345)).unwrap();
    assert_eq!(level, 2);
    assert_eq!(pte::frame(e), 0x12345 & !511);
    let m4k = mmu(Mechanisms {
        leaf: LeafSize::K4,
        ..Mechanisms::default()
    });
    m4k.translate(None, Gfn(0x12345), true).unwrap();
    assert_eq!(m4k.lookup(Gfn(0x12345)).unwrap().1, 1);
    assert!(
        m4k.translate(None, Gfn(FRAMES), false).is_err(),
        "out of range"
    );
}

#[test]
fn split_on_fault_maps_only_the_faulting_page() {
    let m = mmu(Mechanisms::baseline());
    m.populate(0, 512 * 4, 2, true).unwrap();
    m.start_dirty_log().unwrap();
    assert_eq!(m.census().leaves[1], 4, "baseline does not split eagerly");
    let t = m.translate(None, Gfn(700), true).unwrap();
    assert!(t.writable && t.dirtied);
    assert_eq!(m.lookup(Gfn(700)).unwrap().1, 1);
    assert!(m.lookup(Gfn(701)).is_none(), "neighbours stay unmapped");
    let before = m.stats().missing_faults;
    m.translate(None, Gfn(701), false).unwrap();
    assert_eq!(
        m.stats().missing_faults,
        before + 1,
        "a read of a neighbour faults"
    );
    assert_eq!(m.stats().fault_splits, 1);
    assert!(m.stats().flushes >= 1, "break-before-make flushed");
}

#[test]
fn eager_split_splits_every_huge_leaf_when_logging_starts() {
    let m = mmu(Mechanisms::default());
    m.populate(0, 1 << 18, 3, true).unwrap(); // one 1 GiB leaf
    m.populate(1 << 18, (1 << 18) + 1024, 2, false).unwrap(); // two 2 MiB leaves
    m.start_dirty_log().unwrap();
    let c = m.census();
    assert_eq!(c.leaves, [(1 << 18) + 1024, 0, 0, 0]);
    let t = m.translate(None, Gfn(5), false).unwrap();
    assert!(!t.writable, "split leaves are write-protected for logging");
    let t = m.translate(None, Gfn(5), true).unwrap();
    assert!(t.dirtied);
    let mut d = DirtyPages::new(FRAMES);
    m.harvest(&mut d).unwrap();
    assert_eq!(d.iter().collect::<Vec<_>>(), vec![Gfn(5)]);
}

#[test]
fn chunked_split_happens_at_harvest() {
    let m = mmu(Mechanisms {
        split: SplitMode::Chunked {
            chunk_pages: 1024,
            pace_us: 0,
        },
        ..Mechanisms::default()
    });
    m.populate(0, 4096, 2, false).unwrap();
    m.start_dirty_log().unwrap();
    assert_eq!(m.census().leaves[1], 8);
    m.harvest(&mut DirtyPages::new(FRAMES)).unwrap();
    assert_eq!(m.census().leaves, [4096, 0, 0, 0]);
}

#[test]
fn generation_write_protect_is_lazy_and_per_table() {
    let m = mmu(Mechanisms {
        leaf: LeafSize::K4,
        ..Mechanisms::default()
    });
    m.populate(0, 2048, 1, true).unwrap();
    m.start_dirty_log().unwrap();
    assert_eq!(m.census().writable, 2048, "O(1): no entry touched yet");
    assert_eq!(m.stats().protected_entries, 0);
    let t = m.translate(None, Gfn(3), true).unwrap();
    assert!(t.dirtied, "a write after write-protect-all faults");
    // Walking to gfn 3 synced the tables on its path: only its leaf table's
    // 512 entries were protected, then gfn 3 made writable again.
    assert_eq!(m.stats().protected_entries, 512);
    assert_eq!(m.census().writable, 2048 - 512 + 1);
}

#[test]
fn walk_write_protect_touches_every_leaf() {
    let m = mmu(Mechanisms {
        leaf: LeafSize::K4,
        ..Mechanisms::baseline()
    });
    m.populate(0, 2048, 1, true).unwrap();
    let s = m.write_protect_all();
    assert_eq!(s.changed, 2048);
    assert_eq!(m.census().writable, 0);
    assert_eq!(
        s.steps,
        512 * (1 + 1 + 1 + 4),
        "full scan visits every entry"
    );
}

#[test]
fn zap_steps_match_the_seed_shape() {
    // The seed's hello VM: root, one PDPT, two PDs, three PTs, two 4K leaves.
    for (mode, expect_steps) in [
        (Iteration::PresentOnly, None),
        (Iteration::FullScan, Some(3584 + 2048 + 1024 + 512)),
    ] {
        let m = mmu(Mechanisms {
            iteration: mode,
            leaf: LeafSize::K4,
            ..Mechanisms::default()
        });
        for gfn in [0x10, 0x210, 0x40010] {
            m.translate(None, Gfn(gfn), false).unwrap();
        }
        m.zap_range(0x40010, 0x40011);
        let c = m.census();
        assert_eq!((c.tables, c.present), (7, 8));
        let passes = m.zap_all();
        let steps: u64 = passes.iter().map(|p| p.steps).sum();
        let zapped: Vec<u64> = passes.iter().map(|p| p.changed).collect();
        assert_eq!(zapped, vec![2, 3, 2, 1], "entries per pass as in the seed");
        match expect_steps {
            Some(s) => assert_eq!(steps, s),
            None => {
                assert!(passes.iter().all(|p| p.empty_steps == 0));
                assert_eq!(
                    passes[0].steps, c.present,
                    "first pass: each present entry once"
                );
                assert!(steps <= 8 + 6 + 3 + 1);
            }
        }
        assert_eq!(m.census().tables, 1, "only the root is left");
        assert_eq!(m.stats().tables, 1, "zapped tables went back to the arena");
    }
}

#[test]
fn write_protect_modes_agree_on_what_is_dirty() {
    for wp in [WriteProtect::Generation, WriteProtect::Walk] {
        let m = mmu(Mechanisms {
            write_protect: wp,
            ..Mechanisms::default()
        });
        m.populate(0, 1 << 12, 2, true).unwrap();
        m.start_dirty_log().unwrap();
        for round in 0..3u64 {
            let pages: Vec<u64> = (0..50).map(|i| (i * 37 + round * 11) % (1 << 12)).collect();
            for &g in &pages {
                m.translate(None, Gfn(g), true).unwrap();
            }
            let mut d = DirtyPages::new(FRAMES);
            m.harvest(&mut d).unwrap();
            let mut want: Vec<u64> = pages.clone();
            want.sort_unstable();
            want.dedup();
            assert_eq!(
                d.iter().map(|g| g.0).collect::<Vec<_>>(),
                want,
                "{wp:?} round {round}"
            );
        }
    }
}

/// The access log's marks come from TLB misses, so each harvest must make
/// the vCPUs walk again: a page a vCPU keeps reading, with its translation
/// cached, is in every harvest, and the dirty log never sees it. A start
/// forgets what an earlier log marked; a stopped log marks nothing.
#[test]
fn the_access_log_sees_every_period_s_reads_and_the_dirty_log_none() {
    use ferry_soft::guest_mem::{HostView, VcpuMem};
    use ferry_vm::{Backing, GuestRam, PAGE_SIZE};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const PAGES: u64 = 512; // one 2 MiB slot
    let ram = Arc::new(GuestRam::new(&[PAGES * PAGE_SIZE as u64], Backing::Anonymous).unwrap());
    let mmu = Arc::new(Mmu::new(PAGES, 1, Mechanisms::default()).unwrap());
    mmu.start_dirty_log().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    // The page the vCPU reads, over and over.
    let page = Arc::new(AtomicU64::new(5));
    let vcpu = {
        let (mmu, ram, stop, reads, page) = (
            mmu.clone(),
            ram.clone(),
            stop.clone(),
            reads.clone(),
            page.clone(),
        );
        std::thread::spawn(move || {
            let mut mem = VcpuMem::new(mmu, HostView::of(&ram), 0);
            mem.online();
            while !stop.load(Ordering::Relaxed) {
                mem.boundary();
                let gpa = page.load(Ordering::Relaxed) * PAGE_SIZE as u64;
                mem.load_u64(gpa).unwrap();
                reads.fetch_add(1, Ordering::Relaxed);
            }
            mem.offline();
        })
    };
    // Waits until the vCPU has read 1,000 more times (or fails, should it
    // have stopped).
    let more_reads = || {
        let (from, deadline) = (
            reads.load(Ordering::Relaxed),
            Instant::now() + Duration::from_secs(30),
        );
        while reads.load(Ordering::Relaxed) < from + 1000 {
            assert!(
                !vcpu.is_finished() && Instant::now() < deadline,
                "the vCPU stopped reading"
            );
            std::thread::yield_now();
        }
    };
    let harvest = || {
        let mut touched = DirtyPages::new(PAGES);
        let n = mmu.harvest_accessed(&mut touched);
        (n, touched.iter().collect::<Vec<_>>())
    };
    // A log that marks page 5, then stops; the vCPU moves on to page 6,
    // and a new log starts: it forgets page 5.
    mmu.start_access_log();
    more_reads();
    mmu.stop_access_log();
    page.store(6, Ordering::Relaxed);
    more_reads();
    mmu.start_access_log();
    let mut periods = Vec::new();
    for _ in 0..3 {
        more_reads();
        periods.push(harvest());
    }
    // Once stopped (and drained), the reads go on unmarked. Twice: a read
    // that saw the log on may mark after the first exchange, but it ends
    // before the vCPU acknowledges that harvest's flush.
    mmu.stop_access_log();
    harvest();
    harvest();
    more_reads();
    let unmarked = harvest();
    stop.store(true, Ordering::Relaxed);
    vcpu.join().unwrap();
    assert_eq!(
        periods,
        vec![(1, vec![Gfn(6)]); 3],
        "each period sees the read, and only it"
    );
    assert_eq!(unmarked, (0, vec![]), "nothing marked once stopped");
    let mut dirty = DirtyPages::new(PAGES);
    mmu.harvest(&mut dirty).unwrap();
    assert!(dirty.is_empty(), "reads are not writes: {:?}", dirty.runs());
}
