//! Concurrency and property tests: vCPU threads write through their TLBs while
//! a host thread maps, splits, zaps, write-protects and harvests.
//!
//! * no write is ever lost from the dirty log: a copy kept up to date from the
//!   harvests alone equals guest RAM at the end;
//! * no vCPU writes through a stale writable TLB entry after write-protect-all
//!   returns: its next write faults and marks the page;
//! * every step of a present-only zap visits a present entry.

use ferry_memstress::next_rand32;
use ferry_soft::guest_mem::{HostView, VcpuMem};
use ferry_soft::{Iteration, LeafSize, Mechanisms, Mmu, SplitMode, WriteProtect};
use ferry_vm::{Backing, DirtyPages, Gfn, GuestRam, PAGE_SIZE};
use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const RAM: u64 = 8 << 20;
const FRAMES: u64 = RAM / PAGE_SIZE as u64;

#[derive(Clone, Debug)]
enum HostOp {
    Harvest,
    WriteProtectAll,
    Zap { first: u64, pages: u64 },
    ZapAll,
    Split { first: u64, pages: u64 },
    Yield,
}

fn host_op() -> impl Strategy<Value = HostOp> {
    prop_oneof![
        3 => Just(HostOp::Harvest),
        1 => Just(HostOp::WriteProtectAll),
        2 => (0..FRAMES, 1..2048u64).prop_map(|(first, pages)| HostOp::Zap { first, pages }),
        1 => Just(HostOp::ZapAll),
        1 => (0..FRAMES, 1..2048u64).prop_map(|(first, pages)| HostOp::Split { first, pages }),
        2 => Just(HostOp::Yield),
    ]
}

fn mechanisms() -> impl Strategy<Value = Mechanisms> {
    (
        prop_oneof![
            Just(SplitMode::Eager),
            Just(SplitMode::OnFault),
            Just(SplitMode::Chunked {
                chunk_pages: 512,
                pace_us: 0
            })
        ],
        prop_oneof![Just(Iteration::PresentOnly), Just(Iteration::FullScan)],
        prop_oneof![Just(WriteProtect::Generation), Just(WriteProtect::Walk)],
        prop_oneof![Just(LeafSize::K4), Just(LeafSize::M2)],
    )
        .prop_map(|(split, iteration, write_protect, leaf)| Mechanisms {
            split,
            iteration,
            write_protect,
            leaf,
        })
}

fn copy_pages(ram: &GuestRam, copy: &mut [u8], pages: &DirtyPages) {
    for gfn in pages.iter() {
        let off = gfn.0 as usize * PAGE_SIZE;
        ram.read_pages(gfn, &mut copy[off..off + PAGE_SIZE])
            .unwrap();
    }
}

/// vCPU `v` makes `accesses` accesses to random pages; a write stores a
/// fresh value in the vCPU's own 8 bytes of the page.
fn vcpu_thread(
    mmu: Arc<Mmu>,
    ram: Arc<GuestRam>,
    v: usize,
    seed: u64,
    write_percent: u64,
    accesses: u64,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut mem = VcpuMem::new(mmu, HostView::of(&ram), v);
        mem.online();
        let mut rng = seed ^ ((v as u64) << 40);
        for k in 0..accesses {
            mem.boundary();
            let page = next_rand32(&mut rng) % FRAMES;
            let gpa = page * PAGE_SIZE as u64 + 8 * v as u64;
            if next_rand32(&mut rng) % 100 < write_percent {
                mem.store_u64(gpa, ((v as u64) << 56) | (k + 1)).unwrap();
            } else {
                mem.load_u64(gpa).unwrap();
            }
        }
        mem.offline();
    })
}

fn run_interleaving(mech: Mechanisms, ops: Vec<HostOp>, seed: u64, write_percent: u64) {
    let ram = Arc::new(GuestRam::new(&[RAM], Backing::Anonymous).unwrap());
    let mmu = Arc::new(Mmu::new(FRAMES, 3, mech).unwrap());
    // Warm up with huge mappings, then log as a migration does.
    for g in (0..FRAMES).step_by(700) {
        mmu.translate(None, Gfn(g), g % 1400 == 0).unwrap();
    }
    mmu.start_dirty_log().unwrap();
    let vcpus: Vec<_> = (0..3)
        .map(|v| {
            vcpu_thread(
                Arc::clone(&mmu),
                Arc::clone(&ram),
                v,
                seed,
                write_percent,
                20_000,
            )
        })
        .collect();
    let mut copy = vec![0u8; RAM as usize];
    copy_pages(&ram, &mut copy, &DirtyPages::all(FRAMES));
    let mut i = 0;
    while !vcpus.iter().all(|h| h.is_finished()) {
        match &ops[i % ops.len()] {
            HostOp::Harvest => {
                let mut d = DirtyPages::new(FRAMES);
                mmu.harvest(&mut d).unwrap();
                copy_pages(&ram, &mut copy, &d);
            }
            HostOp::WriteProtectAll => {
                mmu.write_protect_all();
            }
            HostOp::Zap { first, pages } => {
                mmu.zap_range(*first, (first + pages).min(FRAMES));
            }
            HostOp::ZapAll => {
                mmu.zap_all();
            }
            HostOp::Split { first, pages } => {
                mmu.split_range(*first, (first + pages).min(FRAMES))
                    .unwrap();
            }
            HostOp::Yield => std::thread::yield_now(),
        }
        i += 1;
    }
    for h in vcpus {
        h.join().unwrap();
    }
    let mut d = DirtyPages::new(FRAMES);
    mmu.harvest(&mut d).unwrap();
    copy_pages(&ram, &mut copy, &d);
    let mut now = vec![0u8; RAM as usize];
    ram.read_pages(Gfn(0), &mut now).unwrap();
    let lost: Vec<usize> = (0..FRAMES as usize)
        .filter(|&p| {
            copy[p * PAGE_SIZE..(p + 1) * PAGE_SIZE] != now[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]
        })
        .collect();
    assert!(
        lost.is_empty(),
        "{mech:?}: writes lost from the dirty log on pages {lost:?}"
    );
    // Table metadata stayed consistent through it all.
    let c = mmu.census();
    assert_eq!(u64::from(mmu.stats().tables), c.tables, "no table leaked");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn no_write_is_lost_under_any_interleaving(
        mech in mechanisms(),
        ops in proptest::collection::vec(host_op(), 1..12),
        seed in any::<u64>(),
        write_percent in 10..100u64,
    ) {
        run_interleaving(mech, ops, seed, write_percent);
    }

    #[test]
    fn present_only_zap_steps_only_on_present_entries(
        gfns in proptest::collection::vec(0..(1u64 << 22), 1..40),
        huge in proptest::collection::vec(0..(1u64 << 13), 0..10),
    ) {
        let m = Mmu::new(1 << 22, 1, Mechanisms { leaf: LeafSize::K4, ..Mechanisms::default() }).unwrap();
        for g in &gfns {
            m.translate(None, Gfn(*g), g % 2 == 0).unwrap();
        }
        for h in &huge {
            let base = h * 512;
            if m.lookup(Gfn(base)).is_none() && (base..base + 512).all(|g| m.lookup(Gfn(g)).is_none()) {
                let _ = m.populate(base, base + 512, 2, false);
            }
        }
        let c = m.census();
        let passes = m.zap_all();
        prop_assert!(passes.iter().all(|p| p.empty_steps == 0));
        prop_assert_eq!(passes[0].steps, c.present);
        let steps: u64 = passes.iter().map(|p| p.steps).sum();
        let tables: u64 = passes.iter().map(|p| p.tables).sum();
        prop_assert!(steps <= 4 * c.present);
        prop_assert!(passes[0].steps <= c.present + c.tables && tables >= c.tables);
        prop_assert_eq!(m.census().tables, 1);
    }
}

/// After write-protect-all (inside harvest) returns, a vCPU's next write to a
/// page it keeps hot in its TLB must fault and mark the page.
#[test]
fn no_write_through_a_stale_tlb_entry_after_write_protect_all() {
    for wp in [WriteProtect::Generation, WriteProtect::Walk] {
        let ram = Arc::new(GuestRam::new(&[RAM], Backing::Anonymous).unwrap());
        let mmu = Arc::new(
            Mmu::new(
                FRAMES,
                2,
                Mechanisms {
                    write_protect: wp,
                    ..Mechanisms::default()
                },
            )
            .unwrap(),
        );
        mmu.start_dirty_log().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let counters: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let threads: Vec<_> = (0..2)
            .map(|v| {
                let (mmu, ram, stop, counters) = (
                    Arc::clone(&mmu),
                    Arc::clone(&ram),
                    Arc::clone(&stop),
                    Arc::clone(&counters),
                );
                std::thread::spawn(move || {
                    let mut mem = VcpuMem::new(mmu, HostView::of(&ram), v);
                    mem.online();
                    let mut k = 0;
                    while !stop.load(Ordering::Relaxed) {
                        mem.boundary();
                        k += 1;
                        mem.store_u64(100 * PAGE_SIZE as u64 * (v as u64 + 1), k)
                            .unwrap();
                        counters[v].fetch_add(1, Ordering::Release);
                    }
                    mem.offline();
                })
            })
            .collect();
        for _ in 0..300 {
            let mut d = DirtyPages::new(FRAMES);
            mmu.harvest(&mut d).unwrap();
            let c0: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Acquire)).collect();
            for v in 0..2 {
                while counters[v].load(Ordering::Acquire) < c0[v] + 2 {
                    std::thread::yield_now();
                }
                assert!(
                    mmu.dirty_bitmap().is_marked(Gfn(100 * (v as u64 + 1))),
                    "{wp:?}: vCPU {v} wrote after write-protect-all without a fault"
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
    }
}
