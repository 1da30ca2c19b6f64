//! `ferry bench demand-paging` on kvm: the shape of the kernel's
//! `demand_paging_test`, measuring the postcopy fault path alone (no
//! network).
//!
//! Each vCPU writes one u64 into every page of its own region, once, in
//! order (the probe's write loop with a pass limit of 1). Every region page
//! starts missing; handler threads place each page from a source copy when a
//! vCPU touches it, and the vCPU, blocked inside `KVM_RUN`, goes on:
//!
//! ```text
//!  source copy (text fill) ─► discard (MISSING) or unmap (MINOR) the regions
//!  ─► register: one userfaultfd for all regions, or one per vCPU region
//!  ─► start vCPUs ─► handlers: event ─► UFFDIO_COPY / UFFDIO_CONTINUE
//!  ─► every vCPU done: pages / elapsed ─► check every page against the source
//! ```
//!
//! The knobs are the ones the issue names: 4 KiB vs 2 MiB (hugetlb) pages,
//! MISSING (copy) vs MINOR (the contents already in a memfd's page cache,
//! only mapped on fault), handlers that sleep in `poll` vs busy-poll, and
//! prefetch (place the next pages of the region with the faulting one).

use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::{KvmVm, Program, Role};
use ferry_memstress::{read_progress, set_pass_limit};
use ferry_memstress::{Fill, VmConfig, Workload};
use ferry_vm::uffd::{FaultMode, Placed, Placer};
use ferry_vm::{Backing, Gfn, Vm, PAGE_SIZE};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a sleeping handler waits in `poll` before re-checking stop.
const POLL_SLICE: Duration = Duration::from_millis(10);
/// A run that has not finished by then is reported as stuck.
const STUCK: Duration = Duration::from_secs(120);

/// One configuration of the fault path.
#[derive(Clone, Debug, Serialize)]
pub struct KvmCase {
    /// anon (4 KiB), memfd (4 KiB, shared) or hugetlb (2 MiB).
    pub backing: String,
    /// MISSING or MINOR.
    pub mode: String,
    /// One userfaultfd for all regions (handlers share it, the selftest's
    /// `-a`) or one per vCPU region with its own handler.
    pub per_vcpu_uffd: bool,
    /// Handlers spin on the fd instead of sleeping in `poll`.
    pub busy_poll: bool,
    /// vCPU i and its handler share host CPU i (mod cores).
    pub pinned: bool,
    /// Pages placed per fault (1 = the faulting page only).
    pub prefetch: u64,
    /// vCPUs.
    pub vcpus: u32,
}

impl KvmCase {
    /// A short label for tables and plots.
    pub fn label(&self) -> String {
        let page = if self.backing == "hugetlb" {
            "2M"
        } else {
            "4K"
        };
        let mut s = format!("{page} {} {}", self.backing, self.mode);
        s += if self.per_vcpu_uffd {
            ", uffd per vCPU"
        } else {
            ", one uffd"
        };
        s += if self.busy_poll { ", busy" } else { ", poll" };
        if self.pinned {
            s += ", pinned";
        }
        if self.prefetch > 1 {
            s += &format!(", prefetch {}", self.prefetch);
        }
        s
    }

    fn backing(&self) -> Result<Backing, String> {
        self.backing.parse()
    }

    fn fault_mode(&self) -> FaultMode {
        if self.mode == "MINOR" {
            FaultMode::Minor
        } else {
            FaultMode::Missing
        }
    }
}

/// The result of one case.
#[derive(Clone, Debug, Serialize)]
pub struct KvmCell {
    /// The case: backing, placement and vCPUs.
    pub case: KvmCase,
    /// Fault handler threads.
    pub handlers: usize,
    /// Region pages (4 KiB) every vCPU together touched.
    pub pages: u64,
    /// From the first touch to the last page in, in ms.
    pub elapsed_ms: f64,
    /// 4 KiB pages per second, all vCPUs.
    pub pages_per_s: f64,
    /// The same per vCPU.
    pub pages_per_s_per_vcpu: f64,
    /// Fault events the handlers read.
    pub fault_events: u64,
    /// Placements (copies or continues) that placed something.
    pub placements: u64,
    /// Pages whose contents differ from the source (must be 0).
    pub bad_pages: u64,
}

/// What the handlers share.
struct Handling {
    source: Vec<u8>,
    first: u64,
    /// Frames per vCPU region.
    region_pages: u64,
    prefetch: u64,
    mode: FaultMode,
    busy: bool,
    stop: AtomicBool,
    events: AtomicU64,
    placements: AtomicU64,
    failure: Mutex<Option<String>>,
}

impl Handling {
    fn serve(&self, placer: &Placer) {
        let mut faults = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            faults.clear();
            let got = if self.busy {
                placer.read_faults(&mut faults)
            } else {
                placer.wait_faults(POLL_SLICE, &mut faults)
            };
            let result = got.and_then(|()| {
                faults
                    .iter()
                    .try_for_each(|f| self.place(placer, f.gfn).map(|_| ()))
            });
            self.events
                .fetch_add(faults.len() as u64, Ordering::Relaxed);
            if let Err(e) = result {
                *self.failure.lock().expect("failure") = Some(e.to_string());
                return;
            }
            if self.busy && faults.is_empty() {
                std::hint::spin_loop();
            }
        }
    }

    /// Places the granule holding `gfn`, plus up to `prefetch` pages of the
    /// same region after it.
    fn place(&self, placer: &Placer, gfn: Gfn) -> std::io::Result<bool> {
        let g = placer.granule_pages();
        let base = gfn.0 - gfn.0 % g;
        let rel = base - self.first;
        let region_end = (rel / self.region_pages + 1) * self.region_pages;
        let n = self.prefetch.max(g).min(region_end - rel);
        let placed = match self.mode {
            FaultMode::Minor => placer.resume(Gfn(base), n)?,
            FaultMode::Missing => {
                let at = rel as usize * PAGE_SIZE;
                let data = &self.source[at..at + n as usize * PAGE_SIZE];
                !matches!(placer.copy(Gfn(base), data)?, Placed::PresentAt(0))
            }
        };
        if placed {
            self.placements.fetch_add(1, Ordering::Relaxed);
        }
        Ok(placed)
    }
}

/// Runs one case with `bytes_per_vcpu` of guest memory per vCPU.
pub fn run_case(case: &KvmCase, bytes_per_vcpu: u64) -> Result<KvmCell, String> {
    // The default workload writes every page in order; the probe's loop
    // (below) only uses its layout.
    let workload = Workload {
        vcpus: case.vcpus,
        bytes_per_vcpu,
        ..Workload::default()
    };
    let config = VmConfig {
        workload,
        backing: case.backing()?,
    };
    let layout = config.layout();
    let mut vm = KvmVm::with_program(
        config,
        DirtyTracking::Bitmap,
        Role::Source,
        Program::RawWrites,
    )
    .map_err(|e| ferry_vm::error_chain(&e))?;
    let ram = Arc::clone(vm.ram());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if case.pinned {
        for v in 0..case.vcpus {
            vm.pin_vcpu(v, v as usize % cores)
                .map_err(|e| ferry_vm::error_chain(&e))?;
        }
    }
    set_pass_limit(&ram, case.vcpus, 1).map_err(|e| ferry_vm::error_chain(&e))?;

    // The source: honest, text-like contents with a stamp the guest's write
    // must replace. Written into the VM's memory too, which is where a
    // MINOR fault finds it (the page cache), then dropped from the mapping.
    let first = layout.data_gpa().gfn().0;
    let pages = layout.data_bytes / PAGE_SIZE as u64;
    let mut source = vec![0u8; layout.data_bytes as usize];
    for (i, page) in source.chunks_exact_mut(PAGE_SIZE).enumerate() {
        page[..8].copy_from_slice(&(i as u64 | 1 << 63).to_le_bytes());
        Fill::Text.fill_page(first + i as u64, page);
    }
    ram.write_pages(Gfn(first), &source)
        .map_err(|e| ferry_vm::error_chain(&e))?;
    let dropped = match case.fault_mode() {
        FaultMode::Missing => ram.discard(Gfn(first), pages),
        FaultMode::Minor => ram.unmap(Gfn(first), pages),
    };
    dropped.map_err(|e| ferry_vm::error_chain(&e))?;

    let region_pages = bytes_per_vcpu / PAGE_SIZE as u64;
    let placers: Vec<Arc<Placer>> = if case.per_vcpu_uffd {
        (0..u64::from(case.vcpus))
            .map(|v| {
                Placer::register_range(
                    &ram,
                    Gfn(first + v * region_pages),
                    region_pages,
                    case.fault_mode(),
                )
                .map(Arc::new)
            })
            .collect::<Result<_, _>>()
    } else {
        Placer::register_range(&ram, Gfn(first), pages, case.fault_mode())
            .map(|p| vec![Arc::new(p)])
    }
    .map_err(|e| format!("userfaultfd registration: {e}"))?;
    let handling = Arc::new(Handling {
        source,
        first,
        region_pages,
        prefetch: case.prefetch.max(1),
        mode: case.fault_mode(),
        busy: case.busy_poll,
        stop: AtomicBool::new(false),
        events: AtomicU64::new(0),
        placements: AtomicU64::new(0),
        failure: Mutex::new(None),
    });
    // One handler per vCPU: sharing one fd, or each on its own.
    let handlers: Vec<_> = (0..case.vcpus as usize)
        .map(|i| {
            let placer = Arc::clone(&placers[i % placers.len()]);
            let h = Arc::clone(&handling);
            let pin = case.pinned.then_some(i % cores);
            std::thread::Builder::new()
                .name(format!("uffd-handler-{i}"))
                .spawn(move || {
                    if let Some(cpu) = pin {
                        if let Err(e) = ferry_vm::affinity::pin_current_thread(cpu) {
                            *h.failure.lock().expect("failure") = Some(format!("pinning: {e}"));
                            return;
                        }
                    }
                    h.serve(&placer)
                })
                .map_err(|e| ferry_vm::error_chain(&e))
        })
        .collect::<Result<_, _>>()?;

    // The clock starts before the vCPUs do: a small run can finish inside
    // `start`, which waits for every vCPU thread to be running.
    let t0 = Instant::now();
    let outcome = vm
        .start()
        .map_err(|e| ferry_vm::error_chain(&e))
        .and_then(|()| wait_all_done(&vm, &handling, t0));
    let elapsed = t0.elapsed();
    handling.stop.store(true, Ordering::Release);
    for h in handlers {
        let _ = h.join();
    }
    outcome?;
    vm.pause().map_err(|e| ferry_vm::error_chain(&e))?;
    drop(placers);

    let mut bad_pages = 0u64;
    let mut page = vec![0u8; PAGE_SIZE];
    for (i, want) in handling.source.chunks_exact(PAGE_SIZE).enumerate() {
        ram.read_pages(Gfn(first + i as u64), &mut page)
            .map_err(|e| ferry_vm::error_chain(&e))?;
        let stamp_written = page[..8] == 1u64.to_le_bytes();
        if !stamp_written || page[8..] != want[8..] {
            bad_pages += 1;
        }
    }
    let secs = elapsed.as_secs_f64();
    Ok(KvmCell {
        case: case.clone(),
        handlers: case.vcpus as usize,
        pages,
        elapsed_ms: secs * 1e3,
        pages_per_s: pages as f64 / secs,
        pages_per_s_per_vcpu: pages as f64 / secs / f64::from(case.vcpus),
        fault_events: handling.events.load(Ordering::Relaxed),
        placements: handling.placements.load(Ordering::Relaxed),
        bad_pages,
    })
}

/// Waits until every vCPU has finished its pass, a handler fails, or the
/// run is stuck.
fn wait_all_done(vm: &KvmVm, handling: &Handling, t0: Instant) -> Result<(), String> {
    let vcpus = vm.config().workload.vcpus;
    loop {
        if let Some(e) = handling.failure.lock().expect("failure").clone() {
            return Err(format!("fault handler failed: {e}"));
        }
        vm.check_health().map_err(|e| ferry_vm::error_chain(&e))?;
        let p = read_progress(vm.ram(), vcpus).map_err(|e| ferry_vm::error_chain(&e))?;
        if p.iter().all(|v| v.passes >= 1) {
            return Ok(());
        }
        if t0.elapsed() > STUCK {
            return Err(format!("vCPUs stuck before the end of their pass: {p:?}"));
        }
        // Sleep, don't spin: this host has 2 cores. Short, because a 2 MiB
        // run over 16 MiB lasts only milliseconds.
        std::thread::sleep(Duration::from_micros(50));
    }
}
