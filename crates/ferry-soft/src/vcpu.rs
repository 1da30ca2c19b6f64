//! vCPU threads running the memstress loop through the soft MMU.
//!
//! The loop is exactly the one documented in `ferry_memstress` and
//! assembled for the kvm guest: same parameters read from the parameter
//! records, same shadow arrays, stamps and progress records, every access
//! (parameters, shadow, region, progress) going through the vCPU's TLB and
//! the MMU, so the dirty log sees every page the guest writes.
//!
//! The state that is not in guest memory (the kvm guest's registers) is
//! [`VcpuState`]: pass, loop index, random state and time into the pass. A
//! vCPU stops only at an access boundary, where that state is exact, so a
//! migration resumes the loop at the very access where it stopped.
//!
//! ```text
//!  run: loop { boundary: flush ack │ pause → park │ throttle → sleep offline
//!              one memstress access (shadow read, stamp check, maybe write) }
//! ```

use crate::error::SoftError;
use crate::guest_mem::VcpuMem;
use crate::quota::Throttle;
use ferry_memstress::{
    next_rand32, param, progress, scale_rand, stamp, MemoryLayout, RATE_BURST_PAGES,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The loop state of one vCPU outside guest memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuState {
    /// Pass being run (1-based); 0 means not started yet.
    pub pass: u64,
    /// Next access index in the pass.
    pub index: u64,
    /// Random generator state.
    pub rng: u64,
    /// Nanoseconds of the current pass already run (rate-limit baseline).
    pub pass_elapsed_ns: u64,
}

/// Which guest program the vCPUs run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    /// The memstress loop.
    #[default]
    Memstress,
    /// The write-list program of [`ferry_memstress::write_list`]: writes
    /// the pages the host lists. Its state here: `pass` is the generation
    /// being written, `index` the next entry.
    WriteList,
}

/// Parameters of one vCPU, read from its parameter record.
#[derive(Clone, Copy, Debug)]
struct Params {
    region: u64,
    pages: u64,
    stride: u64,
    /// Guest address of the write threshold, re-read at every access so the
    /// host can change it while the guest runs (as the kvm guest does).
    threshold_gpa: u64,
    random: bool,
    shadow: u64,
    ns_per_page: u64,
    vcpu: u32,
    seed: u64,
    progress: u64,
}

impl Params {
    fn read(mem: &mut VcpuMem, vcpu: u32) -> Result<Self, SoftError> {
        let base = MemoryLayout::params_gpa(vcpu).0;
        let mut f = |off: u64| mem.load_u64(base + off);
        Ok(Params {
            region: f(param::REGION)?,
            pages: f(param::PAGES)?,
            stride: f(param::STRIDE)?.max(1),
            threshold_gpa: base + param::WRITE_THRESHOLD,
            random: f(param::RANDOM)? != 0,
            shadow: f(param::SHADOW)?,
            ns_per_page: f(param::TSC_PER_PAGE)?,
            vcpu: f(param::VCPU)? as u32,
            seed: f(param::SEED)?,
            progress: f(param::PROGRESS)?,
        })
    }
}

/// Run control shared by the VM and its vCPU threads.
pub struct Control {
    /// Pause requested.
    pub pause: AtomicBool,
    /// Threads must exit.
    pub exit: AtomicBool,
    park: Mutex<Parked>,
    cond: Condvar,
    /// Saved loop state per vCPU (authoritative while the vCPU is parked).
    pub states: Vec<Mutex<VcpuState>>,
    /// First failure of a vCPU thread.
    pub failure: Mutex<Option<(u32, String)>>,
    /// Nanoseconds each vCPU has napped on a throttle.
    throttled_ns: Vec<AtomicU64>,
    /// Each vCPU thread's kernel id (0 until it starts).
    thread_ids: Vec<AtomicU32>,
}

#[derive(Default)]
struct Parked {
    parked: usize,
    alive: usize,
}

impl Control {
    /// Control for `vcpus` vCPUs, not yet running.
    pub fn new(vcpus: usize) -> Self {
        Control {
            pause: AtomicBool::new(false),
            exit: AtomicBool::new(false),
            park: Mutex::new(Parked::default()),
            cond: Condvar::new(),
            states: (0..vcpus)
                .map(|_| Mutex::new(VcpuState::default()))
                .collect(),
            failure: Mutex::new(None),
            throttled_ns: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
            thread_ids: (0..vcpus).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Each vCPU thread's kernel id, in vCPU order (0: not started).
    pub fn thread_ids(&self) -> Vec<u32> {
        self.thread_ids
            .iter()
            .map(|t| t.load(Ordering::Acquire))
            .collect()
    }

    /// Registers `n` new threads.
    pub fn spawned(&self, n: usize) {
        self.park.lock().expect("park").alive += n;
    }

    /// Blocks until every live thread is parked (or has exited).
    pub fn wait_parked(&self) {
        let mut p = self.park.lock().expect("park");
        // Wake vCPUs napping on a throttle: they park at once.
        self.cond.notify_all();
        while p.parked < p.alive {
            p = self.cond.wait(p).expect("park");
        }
    }

    /// Wakes parked threads (after clearing `pause` or setting `exit`).
    pub fn wake(&self) {
        let _p = self.park.lock().expect("park");
        self.cond.notify_all();
    }

    /// Sleeps `d`, or less if a pause or an exit is asked for meanwhile: a
    /// throttle sleep (up to 990 ms at 99%) must not hold up a pause, which
    /// would be downtime.
    fn nap(&self, vcpu: usize, d: Duration) {
        let start = Instant::now();
        self.nap_until(start + d);
        let slept = start.elapsed().as_nanos() as u64;
        self.throttled_ns[vcpu].fetch_add(slept, Ordering::Relaxed);
    }

    /// Time each vCPU has napped on a throttle so far.
    pub fn throttled(&self) -> Vec<Duration> {
        let ns = |n: &AtomicU64| Duration::from_nanos(n.load(Ordering::Relaxed));
        self.throttled_ns.iter().map(ns).collect()
    }

    fn nap_until(&self, until: Instant) {
        let mut p = self.park.lock().expect("park");
        while !self.pause.load(Ordering::SeqCst) && !self.exit.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= until {
                break;
            }
            p = self.cond.wait_timeout(p, until - now).expect("park").0;
        }
    }

    fn park(&self) {
        let mut p = self.park.lock().expect("park");
        p.parked += 1;
        self.cond.notify_all();
        while self.pause.load(Ordering::SeqCst) && !self.exit.load(Ordering::SeqCst) {
            p = self.cond.wait(p).expect("park");
        }
        p.parked -= 1;
    }

    fn fail(&self, vcpu: u32, reason: String) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some((vcpu, reason));
        }
    }

    fn exited(&self) {
        let mut p = self.park.lock().unwrap_or_else(|p| p.into_inner());
        p.alive -= 1;
        self.cond.notify_all();
    }
}

/// Accesses between two updates of a vCPU's published access count.
const ACCESS_BATCH: u64 = 64;

/// How far ahead of its rate limit a vCPU may run before it sleeps.
const RATE_LIMIT_SLACK_NS: u64 = 1_000_000;

fn clock_ns(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Runs vCPU `vcpu` on `program` until `ctl.exit`. Records a failure in
/// `ctl` on error.
pub fn run(mut mem: VcpuMem, vcpu: u32, ctl: &Control, throttle: &Throttle, program: Program) {
    // Even if the loop panics, the thread must leave the flush domain and
    // the park count, or a flush or a pause would wait for it forever.
    struct Leave<'a> {
        ctl: &'a Control,
        vcpu: u32,
    }
    impl Drop for Leave<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.ctl.fail(self.vcpu, "the vCPU thread panicked".into());
            }
            self.ctl.exited();
        }
    }
    let _leave = Leave { ctl, vcpu };
    if let Some(t) = ctl.thread_ids.get(vcpu as usize) {
        t.store(ferry_vm::current_thread_id(), Ordering::Release);
    }
    struct Offline<'a>(&'a crate::tlb::FlushDomain, usize);
    impl Drop for Offline<'_> {
        fn drop(&mut self) {
            self.0.go_offline(self.1);
        }
    }
    let mmu = std::sync::Arc::clone(mem.mmu());
    let _offline = Offline(mmu.flush_domain(), vcpu as usize);
    let ran = match program {
        Program::Memstress => run_inner(&mut mem, vcpu, ctl, throttle),
        Program::WriteList => write_list(&mut mem, vcpu, ctl),
    };
    if let Err(e) = ran {
        ctl.fail(vcpu, format!("{e}"));
    }
}

/// Parks vCPU `v` at a boundary if a pause or an exit is asked for,
/// having saved `st`; returns whether to exit, and otherwise `st` as it is
/// after the pause (a restore may have replaced it).
fn park_if_asked(mem: &mut VcpuMem, v: usize, ctl: &Control, st: &mut VcpuState) -> bool {
    if !ctl.pause.load(Ordering::Relaxed) && !ctl.exit.load(Ordering::Relaxed) {
        return false;
    }
    *ctl.states[v].lock().expect("state") = *st;
    if ctl.exit.load(Ordering::SeqCst) {
        return true;
    }
    mem.offline();
    ctl.park();
    if ctl.exit.load(Ordering::SeqCst) {
        return true;
    }
    mem.online();
    *st = *ctl.states[v].lock().expect("state");
    false
}

/// The write-list program (see [`ferry_memstress::write_list`]), with its
/// loop state in `VcpuState` (`pass`: the generation being written,
/// `index`: the next entry), so a pause mid-list resumes at that entry.
fn write_list(mem: &mut VcpuMem, vcpu: u32, ctl: &Control) -> Result<(), SoftError> {
    use ferry_memstress::write_list::{COUNT, ENTRIES, GENERATION, LIST_GPA, VCPUS};
    let v = vcpu as usize;
    mem.online();
    let progress_gpa = MemoryLayout::progress_gpa(vcpu).0;
    let list = |offset: u64| LIST_GPA.0 + offset;
    let mut st = *ctl.states[v].lock().expect("state");
    loop {
        mem.boundary();
        if park_if_asked(mem, v, ctl, &mut st) {
            return Ok(());
        }
        let beats = mem.load_u64(progress_gpa + progress::ACCESSES)?;
        mem.store_u64(progress_gpa + progress::ACCESSES, beats + 1)?;
        let generation = mem.load_u64(list(GENERATION))?;
        if st.pass == 0 || st.pass != generation {
            if mem.load_u64(progress_gpa + progress::PASS)? == generation {
                // Idle: this generation is done. Rest a little, offline so
                // that a flush does not wait for a resting vCPU.
                mem.offline();
                std::thread::sleep(Duration::from_micros(50));
                mem.online();
                continue;
            }
            st = VcpuState {
                pass: generation,
                index: u64::from(vcpu),
                ..VcpuState::default()
            };
        }
        let (count, step) = (
            mem.load_u64(list(COUNT))?,
            mem.load_u64(list(VCPUS))?.max(1),
        );
        if st.index < count {
            let page = mem.load_u64(list(ENTRIES) + st.index * 8)?;
            mem.or_u64(page, 0)?;
            st.index += step;
        } else {
            mem.store_u64(progress_gpa + progress::PASS, generation)?;
            st.pass = 0;
        }
    }
}

fn run_inner(
    mem: &mut VcpuMem,
    vcpu: u32,
    ctl: &Control,
    throttle: &Throttle,
) -> Result<(), SoftError> {
    let epoch = Instant::now();
    let v = vcpu as usize;
    mem.online();
    let mut p = Params::read(mem, vcpu)?;
    let mut st = *ctl.states[v].lock().expect("state");
    let mut pass_start = 0;
    let mut resume = true;
    loop {
        if resume {
            resume = false;
            if st.pass == 0 {
                st = VcpuState {
                    pass: mem.load_u64(p.progress + progress::PASS)? + 1,
                    index: 0,
                    rng: p.seed,
                    pass_elapsed_ns: 0,
                };
            }
            pass_start = clock_ns(epoch).wrapping_sub(st.pass_elapsed_ns);
        }
        let accesses = p.pages / p.stride;
        let stamp_pass = st.pass as u32;
        while st.index < accesses {
            // Access boundary.
            mem.boundary();
            if ctl.pause.load(Ordering::Relaxed) || ctl.exit.load(Ordering::Relaxed) {
                st.pass_elapsed_ns = clock_ns(epoch).wrapping_sub(pass_start);
                *ctl.states[v].lock().expect("state") = st;
                if ctl.exit.load(Ordering::SeqCst) {
                    return Ok(());
                }
                mem.offline();
                ctl.park();
                if ctl.exit.load(Ordering::SeqCst) {
                    return Ok(());
                }
                mem.online();
                st = *ctl.states[v].lock().expect("state");
                p = Params::read(mem, vcpu)?;
                resume = true;
                break;
            }
            if let Some(sleep) = throttle.after_access(v, mem.take_dirtied()) {
                mem.offline();
                ctl.nap(v, sleep);
                mem.online();
                continue;
            }
            let page = if p.random {
                scale_rand(next_rand32(&mut st.rng), p.pages)
            } else {
                st.index * p.stride
            };
            let addr = p.region + (page << 12);
            let shadow_gpa = p.shadow + page * 4;
            let last = mem.load_u32(shadow_gpa)?;
            let expect = if last == 0 {
                0
            } else {
                stamp(p.vcpu, page, last)
            };
            if mem.load_u64(addr)? != expect {
                let m = mem.load_u64(p.progress + progress::MISMATCHES)?;
                mem.store_u64(p.progress + progress::MISMATCHES, m + 1)?;
            }
            let threshold = mem.load_u64(p.threshold_gpa)?;
            if next_rand32(&mut st.rng) < threshold {
                mem.store_u64(addr, stamp(p.vcpu, page, stamp_pass))?;
                mem.store_u32(shadow_gpa, stamp_pass)?;
                let w = mem.load_u64(p.progress + progress::WRITES)?;
                mem.store_u64(p.progress + progress::WRITES, w + 1)?;
            }
            st.index += 1;
            // Published every ACCESS_BATCH accesses (and at the pass's end),
            // so a host reading progress over a fraction of a pass sees it.
            if st.index.is_multiple_of(ACCESS_BATCH) {
                let a = mem.load_u64(p.progress + progress::ACCESSES)?;
                mem.store_u64(p.progress + progress::ACCESSES, a + ACCESS_BATCH)?;
            }
            if p.ns_per_page != 0 {
                // Rate limit, as the kvm guest does it: run up to a millisecond
                // ahead of schedule, then sleep (offline, so flushes do not
                // wait for a sleeping vCPU) instead of spinning.
                let due = st.index * p.ns_per_page;
                // Behind by more than the burst: only that much is made up.
                let burst = RATE_BURST_PAGES * p.ns_per_page;
                let behind = clock_ns(epoch).wrapping_sub(pass_start).saturating_sub(due);
                if behind > burst {
                    pass_start = pass_start.wrapping_add(behind - burst);
                }
                loop {
                    let ahead = due.saturating_sub(clock_ns(epoch).wrapping_sub(pass_start));
                    if ahead < RATE_LIMIT_SLACK_NS || ctl.pause.load(Ordering::Relaxed) {
                        break;
                    }
                    mem.offline();
                    std::thread::sleep(Duration::from_nanos(ahead.min(RATE_LIMIT_SLACK_NS)));
                    mem.online();
                }
            }
        }
        if resume {
            continue;
        }
        // End of pass: publish what the batches left, then start the next one.
        let a = mem.load_u64(p.progress + progress::ACCESSES)?;
        mem.store_u64(p.progress + progress::ACCESSES, a + accesses % ACCESS_BATCH)?;
        mem.store_u64(p.progress + progress::PASS, st.pass)?;
        st.pass += 1;
        st.index = 0;
        st.pass_elapsed_ns = 0;
        pass_start = clock_ns(epoch);
    }
}
