//! memstress: the guest program of ferry's own VMs, and its contract with
//! the host side (parameters, memory layout, stamps, progress records).
//!
//! The migration engine does not know this crate: ferry's kvm and soft VMs
//! run memstress, and hand the engine a [`MemstressProbe`] so that the
//! guest's own self-check shows in the summaries.
//!
//! This is the workload of the Linux KVM selftests (`dirty_log_perf_test`,
//! `demand_paging_test`): each vCPU loops over its own region and, for each
//! page, reads or (with probability `write_percent`) writes 8 bytes. ferry adds
//! a self-check: a write stores a stamp `(vcpu, page, pass)`, and before every
//! access the guest checks that the page still holds the stamp it last put
//! there. A page lost or stale after a migration is caught by the guest itself.
//!
//! Both backends run exactly this loop (x86-64 code on kvm, Rust on soft) over
//! exactly this memory layout, so their pages, stamps and digests are comparable.
//!
//! ```text
//!  guest-physical layout (identity-mapped; every address below is also the gva)
//!  0x0000_0500  GDT (3 entries)
//!  0x0000_1000  PML4       0x0000_2000  PDPT
//!  0x0000_4000  vCPU parameters, 256 bytes each   (PARAMS_GPA)
//!  0x0000_8000  vCPU progress, 64 bytes each      (PROGRESS_GPA)
//!  0x0000_c000  guest code                        (CODE_GPA)
//!  0x0001_0000  page directories, one per GiB     (PD_GPA)
//!  0x0010_0000  shadow arrays: u32 last-written pass per page, per vCPU
//!  ── system slot ends (2 MiB aligned) ── data slot: vCPU 0 region, vCPU 1 region, ...
//! ```
//!
//! Per pass, for `i` in `0 .. pages/stride`:
//! ```text
//!   page = random ? (next_rand32() * pages) >> 32 : i * stride
//!   expect = shadow[page] == 0 ? 0 : stamp(vcpu, page, shadow[page])
//!   if *(region + page*4096) != expect { mismatches += 1 }
//!   if next_rand32() < write_threshold { *(..) = stamp(vcpu, page, pass); shadow[page] = pass }
//!   (rate limit: spin on rdtsc until pass_start + accessed * tsc_per_page;
//!    behind by more than RATE_BURST_PAGES pages' worth, move pass_start up)
//! ```
//! (`accesses` is published as it goes: per access on kvm, per 64 on soft),
//! then publish `pass` and `mismatches` in the vCPU's progress record,
//! and wait while `pass_limit != 0 && pass >= pass_limit` (a benchmark barrier).

#![warn(missing_docs)]

mod config;
pub mod fill;
mod probe;
pub mod write_list;

pub use config::VmConfig;
use ferry_vm::{Gpa, PAGE_SIZE};
use ferry_vm::{GuestRam, RamError};
pub use fill::Fill;
pub use probe::MemstressProbe;
use serde::{Deserialize, Serialize};

/// Guest-physical address of the GDT.
pub const GDT_GPA: Gpa = Gpa(0x500);
/// Guest-physical address of the PML4.
pub const PML4_GPA: Gpa = Gpa(0x1000);
/// Guest-physical address of the PDPT (one covers 512 GiB).
pub const PDPT_GPA: Gpa = Gpa(0x2000);
/// Guest-physical address of the per-vCPU parameter records.
pub const PARAMS_GPA: Gpa = Gpa(0x4000);
/// Size of one parameter record.
pub const PARAMS_STRIDE: u64 = 256;
/// Guest-physical address of the per-vCPU progress records.
pub const PROGRESS_GPA: Gpa = Gpa(0x8000);
/// Size of one progress record (a cache line, so vCPUs do not share one).
pub const PROGRESS_STRIDE: u64 = 64;
/// Guest-physical address of the guest code.
pub const CODE_GPA: Gpa = Gpa(0xc000);
/// Maximum guest code size.
pub const CODE_MAX: usize = 0x4000;
/// Guest-physical address of the first page directory.
pub const PD_GPA: Gpa = Gpa(0x1_0000);
/// Guest-physical address where shadow arrays start.
pub const SHADOW_GPA: Gpa = Gpa(0x10_0000);
/// Most vCPUs one layout supports (parameter pages hold 64 records).
pub const MAX_VCPUS: u32 = 64;
/// Most guest RAM one layout supports: one page directory per GiB fits below
/// `SHADOW_GPA`.
pub const MAX_RAM_BYTES: u64 = 192 << 30;

const MIB2: u64 = 2 << 20;

/// Offsets of fields in a vCPU parameter record (all u64).
pub mod param {
    /// Guest address of the vCPU's region.
    pub const REGION: u64 = 0;
    /// Pages the loop visits, from the region's start (its hot set).
    pub const PAGES: u64 = 8;
    /// Page stride of sequential order.
    pub const STRIDE: u64 = 16;
    /// A write happens when `rand32 < WRITE_THRESHOLD` (0..=2^32).
    pub const WRITE_THRESHOLD: u64 = 24;
    /// 1 for random order, 0 for sequential.
    pub const RANDOM: u64 = 32;
    /// Guest address of the shadow array.
    pub const SHADOW: u64 = 40;
    /// TSC ticks per page access for the rate limit; 0 means unlimited.
    pub const TSC_PER_PAGE: u64 = 48;
    /// vCPU index.
    pub const VCPU: u64 = 56;
    /// Initial random state.
    pub const SEED: u64 = 64;
    /// Guest address of the progress record.
    pub const PROGRESS: u64 = 72;
    /// Accesses per pass (`pages / stride`), precomputed by the host.
    pub const ACCESSES: u64 = 80;
    /// If non-zero, the guest waits (spinning, no exit) after completing this
    /// pass until the host raises the limit: the iteration barrier of
    /// `dirty_log_perf_test`. 0 = run freely.
    pub const PASS_LIMIT: u64 = 88;
    /// Clock ticks the guest may run ahead of its rate limit; further ahead it
    /// asks the host to sleep it (see [`super::SLEEP_PORT`]). 0 = never sleep: spin
    /// page by page instead.
    pub const SLEEP_MIN: u64 = 96;
}

/// Pages' worth of time a rate-limited guest behind its schedule makes up
/// in a burst; beyond that, the time it lost (a throttle's sleep, a pause,
/// a busy host) is lost. A rate limit caps the rate over any stretch, as a
/// real writer's pace does: a guest that caught up on all it missed would
/// write flat out after every throttle sleep, so a throttle would postpone
/// its writes rather than cut them (a kvm guest slept 200 ms by the dirty
/// quota rewrote its whole region in the 10 ms it then ran).
pub const RATE_BURST_PAGES: u64 = 16;

/// A rate-limited guest runs ahead of its schedule by up to
/// [`param::SLEEP_MIN`] ticks; once further ahead, it writes the ticks left into
/// [`progress::SLEEP_TICKS`] and does `out` to this port; the host sleeps the
/// vCPU for that long. So an idle guest costs the host (almost) no CPU, as a
/// real idle guest halting on a timer would, while a busy guest never exits.
pub const SLEEP_PORT: u16 = 0xf0;

/// Offsets of fields in a vCPU progress record (all u64, written by the guest).
pub mod progress {
    /// Completed passes.
    pub const PASS: u64 = 0;
    /// Stamp mismatches seen so far.
    pub const MISMATCHES: u64 = 8;
    /// Page accesses completed (reads and writes).
    pub const ACCESSES: u64 = 16;
    /// Writes completed.
    pub const WRITES: u64 = 24;
    /// Backend-private clock value at the start of the current pass (the rate
    /// limit's baseline; the kvm guest keeps its TSC here).
    pub const PASS_START: u64 = 32;
    /// Clock ticks the guest asks the host to sleep it (see [`super::SLEEP_PORT`]).
    pub const SLEEP_TICKS: u64 = 40;
}

/// Order in which a vCPU visits the pages of its region.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessOrder {
    /// Page 0, stride, 2*stride, ...
    #[default]
    Sequential,
    /// Uniformly random pages, as many accesses per pass as sequential order.
    Random,
}

impl std::str::FromStr for AccessOrder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "seq" | "sequential" => Ok(AccessOrder::Sequential),
            "random" | "rand" => Ok(AccessOrder::Random),
            other => Err(format!(
                "unknown access order '{other}': expected sequential or random"
            )),
        }
    }
}

/// What the guest does. Both ends of a migration carry the same workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// Number of vCPUs, each with its own region.
    pub vcpus: u32,
    /// Bytes in each vCPU's region (a multiple of 2 MiB).
    pub bytes_per_vcpu: u64,
    /// Percentage of accesses that write, 0..=100.
    pub write_percent: u8,
    /// How many of the vCPUs, counted from the last, only read (write
    /// percent 0 whatever `write_percent` says): writers and readers in one
    /// VM, the dirty-quota seed's guest-performance mixes.
    #[serde(default)]
    pub readers: u32,
    /// Visiting order.
    pub order: AccessOrder,
    /// Page stride in sequential order (1 = every page; 512 = one page per 2 MiB).
    pub stride_pages: u64,
    /// Optional cap on pages visited, in MiB/s per vCPU (4 KiB per visited page).
    pub rate_limit_mib_s: Option<u64>,
    /// Seed of the guest's random generator.
    pub seed: u64,
    /// What data pages hold besides the stamp (written once, at boot).
    #[serde(default)]
    pub fill: Fill,
    /// Each vCPU's write percentage, one per vCPU; overrides
    /// `write_percent` and `readers` (empty: those apply).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vcpu_write_percents: Vec<u8>,
    /// Each vCPU's rate limit in MiB/s, one per vCPU, 0 for none; overrides
    /// `rate_limit_mib_s` (empty: that applies to all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vcpu_rate_limits_mib_s: Vec<u64>,
    /// Percentage of each vCPU's region its loop visits, from the
    /// region's start (1..=100): the guest's hot set. The rest holds what
    /// boot wrote there (the [`Fill`]) and is never touched again, as most
    /// of a real guest's memory is.
    #[serde(default = "all_hot", skip_serializing_if = "is_all_hot")]
    pub hot_percent: u8,
}

fn all_hot() -> u8 {
    100
}

fn is_all_hot(p: &u8) -> bool {
    *p == 100
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            vcpus: 2,
            bytes_per_vcpu: 512 << 20,
            write_percent: 100,
            readers: 0,
            order: AccessOrder::Sequential,
            stride_pages: 1,
            rate_limit_mib_s: None,
            seed: 0x5eed,
            fill: Fill::Zero,
            vcpu_write_percents: Vec::new(),
            vcpu_rate_limits_mib_s: Vec::new(),
            hot_percent: 100,
        }
    }
}

/// A workload that cannot be run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkloadError {
    /// vCPU count outside 1..=MAX_VCPUS.
    #[error("vCPU count {0} is out of range: use 1 to {MAX_VCPUS}")]
    Vcpus(u32),
    /// Region size not a positive multiple of 2 MiB.
    #[error("bytes per vCPU {0} must be a positive multiple of 2 MiB")]
    RegionSize(u64),
    /// More than 100 percent.
    #[error("write percent {0} is over 100")]
    WritePercent(u8),
    /// Stride of zero or larger than the region.
    #[error("page stride {stride} must be between 1 and the {pages} pages its loop visits")]
    Stride {
        /// The stride asked for, in pages.
        stride: u64,
        /// Pages the loop visits (the hot set).
        pages: u64,
    },
    /// Too much memory for one layout.
    #[error("{0} bytes of guest RAM is more than the {MAX_RAM_BYTES} a layout supports")]
    TooLarge(u64),
    /// A rate limit of zero.
    #[error("a rate limit must be at least 1 MiB/s")]
    RateLimit,
    /// More readers than vCPUs.
    #[error("{readers} reader vCPUs but only {vcpus} vCPUs")]
    Readers {
        /// Reader vCPUs asked for.
        readers: u32,
        /// vCPUs in all.
        vcpus: u32,
    },
    /// A hot set of no pages, or more than all.
    #[error("hot percent {0} must be 1 to 100")]
    HotPercent(u8),
    /// A per-vCPU list of the wrong length.
    #[error("{what} lists {given} values for {vcpus} vCPUs: give one per vCPU, or one for all")]
    PerVcpu {
        /// The setting (`--rate-limit`, say).
        what: &'static str,
        /// Values given.
        given: usize,
        /// vCPUs in all.
        vcpus: u32,
    },
}

impl Workload {
    /// Checks that the workload can be laid out and run.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(WorkloadError::Vcpus(self.vcpus));
        }
        if self.bytes_per_vcpu == 0 || !self.bytes_per_vcpu.is_multiple_of(MIB2) {
            return Err(WorkloadError::RegionSize(self.bytes_per_vcpu));
        }
        if let Some(&p) = std::iter::once(&self.write_percent)
            .chain(&self.vcpu_write_percents)
            .find(|&&p| p > 100)
        {
            return Err(WorkloadError::WritePercent(p));
        }
        for (what, given) in [
            ("the write percent", self.vcpu_write_percents.len()),
            ("the rate limit", self.vcpu_rate_limits_mib_s.len()),
        ] {
            if given != 0 && given != self.vcpus as usize {
                return Err(WorkloadError::PerVcpu {
                    what,
                    given,
                    vcpus: self.vcpus,
                });
            }
        }
        if !(1..=100).contains(&self.hot_percent) {
            return Err(WorkloadError::HotPercent(self.hot_percent));
        }
        if self.stride_pages == 0 || self.stride_pages > self.hot_pages_per_vcpu() {
            return Err(WorkloadError::Stride {
                stride: self.stride_pages,
                pages: self.hot_pages_per_vcpu(),
            });
        }
        if self.rate_limit_mib_s == Some(0) {
            return Err(WorkloadError::RateLimit);
        }
        if self.readers > self.vcpus {
            return Err(WorkloadError::Readers {
                readers: self.readers,
                vcpus: self.vcpus,
            });
        }
        // Checked first: the layout multiplies, and a crafted header may
        // carry any size.
        let data = self.bytes_per_vcpu.checked_mul(u64::from(self.vcpus));
        if data.is_none_or(|d| d > MAX_RAM_BYTES) {
            return Err(WorkloadError::TooLarge(data.unwrap_or(u64::MAX)));
        }
        let total = MemoryLayout::for_workload(self).total_bytes();
        if total > MAX_RAM_BYTES {
            return Err(WorkloadError::TooLarge(total));
        }
        Ok(())
    }

    /// Pages in each vCPU's region.
    pub fn pages_per_vcpu(&self) -> u64 {
        self.bytes_per_vcpu / PAGE_SIZE as u64
    }

    /// Pages of each vCPU's region its loop visits ([`Self::hot_percent`]
    /// of them, at least one).
    pub fn hot_pages_per_vcpu(&self) -> u64 {
        (self.pages_per_vcpu() * u64::from(self.hot_percent.min(100)) / 100).max(1)
    }

    /// Accesses per pass: the same in both orders.
    pub fn accesses_per_pass(&self) -> u64 {
        self.hot_pages_per_vcpu() / self.stride_pages
    }

    /// `rand32 < threshold` decides a write.
    pub fn write_threshold(&self) -> u64 {
        (u64::from(self.write_percent) << 32) / 100
    }

    /// Whether vCPU `v` only reads.
    pub fn is_reader(&self, v: u32) -> bool {
        self.vcpu_write_percent(v) == 0
    }

    /// Write percentage of vCPU `v`: its own if listed, else 0 for one of
    /// the last [`Self::readers`], else `write_percent`.
    pub fn vcpu_write_percent(&self, v: u32) -> u8 {
        match self.vcpu_write_percents.get(v as usize) {
            Some(&p) => p,
            None if v >= self.vcpus.saturating_sub(self.readers) => 0,
            None => self.write_percent,
        }
    }

    /// Rate limit of vCPU `v` in MiB/s (`None`: as fast as it can).
    pub fn vcpu_rate_limit_mib_s(&self, v: u32) -> Option<u64> {
        match self.vcpu_rate_limits_mib_s.get(v as usize) {
            Some(0) => None,
            Some(&r) => Some(r),
            None => self.rate_limit_mib_s,
        }
    }

    /// Whether any vCPU runs under a rate limit.
    pub fn has_rate_limit(&self) -> bool {
        (0..self.vcpus).any(|v| self.vcpu_rate_limit_mib_s(v).is_some())
    }
}

/// Where everything of a workload lives in guest-physical memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLayout {
    /// Size of slot 0: tables, code, parameters, progress and shadow arrays.
    pub system_bytes: u64,
    /// Size of slot 1: the vCPU regions.
    pub data_bytes: u64,
    /// Bytes in each vCPU's region.
    pub bytes_per_vcpu: u64,
    /// Bytes of each vCPU's shadow array (page aligned).
    pub shadow_bytes_per_vcpu: u64,
    /// vCPU count.
    pub vcpus: u32,
}

impl MemoryLayout {
    /// The layout of `w`. Deterministic: both ends compute the same one.
    pub fn for_workload(w: &Workload) -> Self {
        let pages = w.bytes_per_vcpu / PAGE_SIZE as u64;
        let shadow = (pages * 4).next_multiple_of(PAGE_SIZE as u64);
        let system = (SHADOW_GPA.0 + shadow * u64::from(w.vcpus)).next_multiple_of(MIB2);
        MemoryLayout {
            system_bytes: system,
            data_bytes: w.bytes_per_vcpu * u64::from(w.vcpus),
            bytes_per_vcpu: w.bytes_per_vcpu,
            shadow_bytes_per_vcpu: shadow,
            vcpus: w.vcpus,
        }
    }

    /// Slot sizes in guest-physical order.
    pub fn slot_sizes(&self) -> [u64; 2] {
        [self.system_bytes, self.data_bytes]
    }

    /// Total guest RAM.
    pub fn total_bytes(&self) -> u64 {
        self.system_bytes + self.data_bytes
    }

    /// Start of the data slot.
    pub fn data_gpa(&self) -> Gpa {
        Gpa(self.system_bytes)
    }

    /// Start of vCPU `vcpu`'s region.
    pub fn region_gpa(&self, vcpu: u32) -> Gpa {
        Gpa(self.system_bytes + u64::from(vcpu) * self.bytes_per_vcpu)
    }

    /// Start of vCPU `vcpu`'s shadow array.
    pub fn shadow_gpa(&self, vcpu: u32) -> Gpa {
        Gpa(SHADOW_GPA.0 + u64::from(vcpu) * self.shadow_bytes_per_vcpu)
    }

    /// vCPU `vcpu`'s parameter record.
    pub fn params_gpa(vcpu: u32) -> Gpa {
        Gpa(PARAMS_GPA.0 + u64::from(vcpu) * PARAMS_STRIDE)
    }

    /// vCPU `vcpu`'s progress record.
    pub fn progress_gpa(vcpu: u32) -> Gpa {
        Gpa(PROGRESS_GPA.0 + u64::from(vcpu) * PROGRESS_STRIDE)
    }
}

/// The stamp a vCPU writes into `page` of its region in pass `pass`.
/// Never 0, so a zero page is never mistaken for a written one.
#[inline]
pub fn stamp(vcpu: u32, page: u64, pass: u32) -> u64 {
    ((u64::from(vcpu) + 1) << 56) | ((page & 0xff_ffff) << 32) | u64::from(pass)
}

/// The guest's random generator: a 64-bit LCG (Knuth's MMIX constants); the
/// high 32 bits are the output. Two instructions in the kvm guest.
#[inline]
pub fn next_rand32(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 32
}

/// `rand32` scaled to `0..pages`, as the guest computes it (`(r * pages) >> 32`).
#[inline]
pub fn scale_rand(rand32: u64, pages: u64) -> u64 {
    (rand32 * pages) >> 32
}

/// Sets every vCPU's pass limit (see [`param::PASS_LIMIT`]); 0 lifts it.
pub fn set_pass_limit(ram: &GuestRam, vcpus: u32, limit: u64) -> Result<(), RamError> {
    for v in 0..vcpus {
        ram.store_u64(MemoryLayout::params_gpa(v).add(param::PASS_LIMIT), limit)?;
    }
    Ok(())
}

/// Changes every vCPU's write percentage while the guest runs (the guest
/// reads its threshold on every access).
pub fn set_write_percent(ram: &GuestRam, vcpus: u32, percent: u8) -> Result<(), RamError> {
    (0..vcpus).try_for_each(|v| set_vcpu_write_percent(ram, v, percent))
}

/// Changes one vCPU's write percentage while the guest runs: writers and
/// readers in one VM.
pub fn set_vcpu_write_percent(ram: &GuestRam, vcpu: u32, percent: u8) -> Result<(), RamError> {
    let threshold = (u64::from(percent.min(100)) << 32) / 100;
    ram.store_u64(
        MemoryLayout::params_gpa(vcpu).add(param::WRITE_THRESHOLD),
        threshold,
    )
}

/// A vCPU's published progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuProgress {
    /// Completed passes.
    pub passes: u64,
    /// Stamp mismatches seen.
    pub mismatches: u64,
    /// Page accesses.
    pub accesses: u64,
    /// Page writes.
    pub writes: u64,
}

/// Reads every vCPU's progress record without stopping the guest.
pub fn read_progress(ram: &GuestRam, vcpus: u32) -> Result<Vec<VcpuProgress>, RamError> {
    (0..vcpus)
        .map(|v| {
            let base = MemoryLayout::progress_gpa(v);
            Ok(VcpuProgress {
                passes: ram.load_u64(base.add(progress::PASS))?,
                mismatches: ram.load_u64(base.add(progress::MISMATCHES))?,
                accesses: ram.load_u64(base.add(progress::ACCESSES))?,
                writes: ram.load_u64(base.add(progress::WRITES))?,
            })
        })
        .collect()
}

/// Writes every vCPU's parameter record, and the data pages' fill. `tsc_khz`
/// converts the rate limit into TSC ticks; backends without a TSC pass their
/// own clock's rate in kHz.
pub fn write_params(ram: &GuestRam, w: &Workload, tsc_khz: u64) -> Result<(), RamError> {
    let layout = MemoryLayout::for_workload(w);
    if w.fill != Fill::Zero {
        write_fill(ram, &layout, w.fill)?;
    }
    for v in 0..w.vcpus {
        let tsc_per_page = match w.vcpu_rate_limit_mib_s(v) {
            // pages/s = rate * 256; ticks/page = tsc_hz / pages_per_s.
            Some(rate) => (tsc_khz * 1000) / rate.saturating_mul(256).max(1),
            None => 0,
        };
        let base = MemoryLayout::params_gpa(v);
        let fields = [
            (param::REGION, layout.region_gpa(v).0),
            (param::PAGES, w.hot_pages_per_vcpu()),
            (param::STRIDE, w.stride_pages),
            (
                param::WRITE_THRESHOLD,
                (u64::from(w.vcpu_write_percent(v)) << 32) / 100,
            ),
            (param::RANDOM, u64::from(w.order == AccessOrder::Random)),
            (param::SHADOW, layout.shadow_gpa(v).0),
            (param::TSC_PER_PAGE, tsc_per_page),
            (param::VCPU, u64::from(v)),
            (
                param::SEED,
                w.seed ^ (u64::from(v) << 32) ^ 0x9e37_79b9_7f4a_7c15,
            ),
            (param::PROGRESS, MemoryLayout::progress_gpa(v).0),
            (param::ACCESSES, w.accesses_per_pass()),
            // Sleep when a millisecond or more ahead of the rate limit.
            (
                param::SLEEP_MIN,
                if tsc_per_page == 0 { 0 } else { tsc_khz },
            ),
        ];
        for (off, value) in fields {
            ram.store_u64(base.add(off), value)?;
        }
    }
    Ok(())
}

/// Writes `fill` into every data page, 2 MiB at a time.
fn write_fill(ram: &GuestRam, layout: &MemoryLayout, fill: Fill) -> Result<(), RamError> {
    const CHUNK_PAGES: u64 = 512;
    let first = layout.data_gpa().0 / PAGE_SIZE as u64;
    let pages = layout.data_bytes / PAGE_SIZE as u64;
    let mut buf = vec![0u8; CHUNK_PAGES as usize * PAGE_SIZE];
    let mut done = 0;
    while done < pages {
        let n = CHUNK_PAGES.min(pages - done);
        let bytes = &mut buf[..n as usize * PAGE_SIZE];
        for (i, page) in bytes.chunks_exact_mut(PAGE_SIZE).enumerate() {
            fill.fill_page(first + done + i as u64, page);
        }
        ram.write_pages(ferry_vm::Gfn(first + done), bytes)?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_of_demo_guest() {
        let w = Workload::default();
        let l = MemoryLayout::for_workload(&w);
        assert_eq!(l.data_bytes, 1 << 30);
        assert_eq!(l.system_bytes % MIB2, 0);
        assert!(l.shadow_gpa(1).0 + l.shadow_bytes_per_vcpu <= l.system_bytes);
        assert_eq!(l.region_gpa(1).0, l.system_bytes + (512 << 20));
    }

    #[test]
    fn stamps_are_never_zero_and_distinct() {
        assert_ne!(stamp(0, 0, 0), 0);
        assert_ne!(stamp(0, 1, 1), stamp(1, 1, 1));
        assert_ne!(stamp(0, 1, 1), stamp(0, 1, 2));
    }

    #[test]
    fn readers_are_the_last_vcpus_and_never_write() {
        let w = Workload {
            vcpus: 4,
            readers: 1,
            write_percent: 60,
            ..Workload::default()
        };
        assert_eq!(w.validate(), Ok(()));
        let percents: Vec<u8> = (0..4).map(|v| w.vcpu_write_percent(v)).collect();
        assert_eq!(percents, vec![60, 60, 60, 0]);
        let too_many = Workload { readers: 5, ..w };
        assert_eq!(
            too_many.validate(),
            Err(WorkloadError::Readers {
                readers: 5,
                vcpus: 4
            })
        );
    }

    #[test]
    fn per_vcpu_lists_override_and_must_name_every_vcpu() {
        let w = Workload {
            vcpus: 3,
            readers: 1,
            rate_limit_mib_s: Some(64),
            vcpu_write_percents: vec![100, 10, 50],
            vcpu_rate_limits_mib_s: vec![0, 200, 50],
            ..Workload::default()
        };
        assert_eq!(w.validate(), Ok(()));
        let writes: Vec<u8> = (0..3).map(|v| w.vcpu_write_percent(v)).collect();
        assert_eq!(writes, vec![100, 10, 50], "the list wins over readers");
        let rates: Vec<Option<u64>> = (0..3).map(|v| w.vcpu_rate_limit_mib_s(v)).collect();
        assert_eq!(rates, vec![None, Some(200), Some(50)], "0 is no limit");
        assert!(w.has_rate_limit());
        let short = Workload {
            vcpu_rate_limits_mib_s: vec![1, 2],
            ..w.clone()
        };
        assert!(matches!(
            short.validate(),
            Err(WorkloadError::PerVcpu { given: 2, .. })
        ));
        let over = Workload {
            vcpu_write_percents: vec![100, 101, 0],
            ..w
        };
        assert_eq!(over.validate(), Err(WorkloadError::WritePercent(101)));
        assert!(!Workload::default().has_rate_limit());
    }

    #[test]
    fn write_threshold_bounds() {
        let mut w = Workload {
            write_percent: 100,
            ..Workload::default()
        };
        assert_eq!(w.write_threshold(), 1 << 32);
        w.write_percent = 0;
        assert_eq!(w.write_threshold(), 0);
    }

    #[test]
    fn validation_catches_nonsense() {
        let bad = [
            Workload {
                vcpus: 0,
                ..Workload::default()
            },
            Workload {
                bytes_per_vcpu: 4096,
                ..Workload::default()
            },
            Workload {
                write_percent: 101,
                ..Workload::default()
            },
            Workload {
                stride_pages: 0,
                ..Workload::default()
            },
            Workload {
                rate_limit_mib_s: Some(0),
                ..Workload::default()
            },
        ];
        for w in bad {
            assert!(w.validate().is_err(), "{w:?}");
        }
        assert!(Workload::default().validate().is_ok());
    }

    #[test]
    fn scaled_random_pages_stay_in_range() {
        let mut s = 1;
        for _ in 0..10_000 {
            assert!(scale_rand(next_rand32(&mut s), 777) < 777);
        }
    }
}
