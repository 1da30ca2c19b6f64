//! Command-line arguments shared by several subcommands: the guest workload and
//! the backend that runs it.

use crate::backend::BackendKind;
use clap::{Args, ValueEnum};
use ferry_engine::precopy::Placement;
use ferry_kvm::DirtyTracking;
use ferry_memstress::Fill;
use ferry_memstress::{AccessOrder, VmConfig, Workload};
use ferry_soft::{Iteration, LeafSize, Mechanisms, SplitMode, WriteProtect};
use ferry_vm::Backing;

/// The values of every `--backend` flag; `auto` is kvm where /dev/kvm can
/// run a VM, soft otherwise ([`BackendKind::detect`]).
pub const BACKENDS: [&str; 3] = ["auto", "kvm", "soft"];

/// `name` with `auto` resolved to the backend it means here
/// ([`BackendKind::detect`]), for commands that pass it on or report it.
pub fn resolve_backend(name: &str) -> String {
    name.parse::<BackendKind>()
        .map_or_else(|_| name.to_string(), |k| k.to_string())
}

/// Sizes like `512M`, `1G`, `2048K` or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix in '{s}': use K, M, G or T")),
            };
            (&s[..i], mult)
        }
        _ => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 512M, 1G, 4096)"))?;
    n.checked_mul(mult)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("size '{s}' is zero or too large"))
}

/// A list given on the command line as per-vCPU values (one value applies
/// to every vCPU: no list).
fn per_vcpu<T: Copy>(values: &[T]) -> Vec<T> {
    if values.len() > 1 {
        values.to_vec()
    } else {
        Vec::new()
    }
}

/// A rate limit in MiB/s, or `max` (0: none).
fn parse_rate(s: &str) -> Result<u64, String> {
    match s {
        "max" => Ok(0),
        _ => s.parse::<u64>().ok().filter(|&r| r > 0).ok_or_else(|| {
            format!("rate limit '{s}' must be a number of MiB/s (1 or more) or max")
        }),
    }
}

/// The guest workload (memstress).
#[derive(Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// Number of vCPUs, each running memstress over its own region.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub vcpus: u32,
    /// Guest memory per vCPU (multiple of 2M), e.g. 512M or 1G.
    #[arg(long = "mem-per-vcpu", default_value = "512M", value_parser = parse_size)]
    pub mem_per_vcpu: u64,
    /// Percentage of page accesses that write (0-100), for every vCPU, or
    /// one per vCPU: `--write-percent 100,100,10,0` makes a VM of writers
    /// and readers.
    #[arg(long = "write-percent", default_value = "100", value_delimiter = ',', value_parser = clap::value_parser!(u8).range(0..=100))]
    pub write_percent: Vec<u8>,
    /// How many vCPUs, counted from the last, only read (the rest write at
    /// --write-percent): writers and readers in one VM.
    #[arg(long, default_value_t = 0)]
    pub readers: u32,
    /// Page visiting order.
    #[arg(long, default_value = "sequential", value_parser = ["sequential", "random"])]
    pub order: String,
    /// Page stride for sequential order (512 = one page per 2 MiB).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub stride: u64,
    /// Cap each vCPU at this many MiB/s of pages visited (default:
    /// unlimited), or one cap per vCPU, `max` for none: `--rate-limit 200,50,max`.
    #[arg(long = "rate-limit", value_delimiter = ',', value_parser = parse_rate)]
    pub rate_limit_mib_s: Vec<u64>,
    /// Seed of the guest's random generator.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
    /// What data pages hold besides the guest's 8-byte stamp: zero, random
    /// (incompressible) or text (compresses about 2.5x with zstd, like ordinary
    /// memory). Written once at boot; use random or text to measure compression.
    #[arg(long, default_value = "zero", value_parser = ["zero", "random", "text"])]
    pub fill: String,
    /// Percentage of each vCPU's memory the guest keeps visiting, from its
    /// start (its hot set); the rest keeps the --fill written at boot and
    /// is never touched again, as most of a real guest's memory is.
    #[arg(long = "hot-percent", default_value_t = 100, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub hot_percent: u8,
}

impl WorkloadArgs {
    /// The workload, validated.
    pub fn workload(&self) -> Result<Workload, String> {
        let w = Workload {
            vcpus: self.vcpus,
            bytes_per_vcpu: self.mem_per_vcpu,
            // One value is for every vCPU; a list is one per vCPU.
            write_percent: self.write_percent.iter().copied().max().unwrap_or(100),
            vcpu_write_percents: per_vcpu(&self.write_percent),
            readers: self.readers,
            order: self.order.parse::<AccessOrder>()?,
            stride_pages: self.stride,
            rate_limit_mib_s: match self.rate_limit_mib_s[..] {
                [r] => Some(r).filter(|&r| r > 0),
                _ => None,
            },
            vcpu_rate_limits_mib_s: per_vcpu(&self.rate_limit_mib_s),
            seed: self.seed,
            fill: self.fill.parse::<Fill>()?,
            hot_percent: self.hot_percent,
        };
        w.validate().map_err(|e| e.to_string())?;
        Ok(w)
    }
}

/// KVM dirty-tracking modes, as named on the command line.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrackingMode {
    /// KVM_GET_DIRTY_LOG (get and re-protect in one ioctl).
    Bitmap,
    /// MANUAL_PROTECT2 + KVM_CLEAR_DIRTY_LOG in paced chunks.
    Clear,
    /// The per-vCPU dirty ring.
    Ring,
}

/// How a destination places received pages and serves postcopy faults:
/// `ferry receive`'s flags, which `ferry demo` passes on to the destination
/// it starts.
#[derive(Args, Debug, Clone)]
pub struct PagingArgs {
    /// How received pages land in untouched guest memory: uffd (UFFDIO_COPY,
    /// no zeroing first, but always 4 KiB pages; falls back to write where
    /// unavailable and on hugetlb), write (a plain copy, after the kernel
    /// zeroes the page; transparent huge pages stay huge), or auto (write
    /// where the kernel may put guest RAM on transparent huge pages, else
    /// uffd).
    #[arg(long, default_value = "auto", value_parser = placement_parser())]
    pub placement: Placement,
    /// Postcopy: pages asked for per fault, the faulting page and the
    /// missing ones right after it (1 = no prefetch).
    #[arg(long, default_value_t = ferry_engine::postcopy::DEFAULT_PREFETCH,
          value_parser = ranged_u32(ferry_engine::precopy::PREFETCH_PAGES))]
    pub prefetch: u32,
    /// Postcopy: how a vCPU's touch of a missing page reaches the pager.
    /// auto: the vCPU asks for the page itself where the backend has
    /// annotated memory-fault exits (soft), else userfaultfd (kvm here).
    /// userfaultfd: always through the kernel and one handler thread (the
    /// seed's baseline, to compare).
    #[arg(long = "fault-path", default_value = "auto", value_parser = ["auto", "userfaultfd"])]
    pub fault_path: String,
    /// Postcopy over userfaultfd: handler threads reading its fault events.
    /// More serve a burst of faults from several vCPUs in parallel; on a
    /// host with few cores they compete with the vCPUs for CPU.
    #[arg(long = "fault-handlers", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(ranged(ferry_engine::precopy::FAULT_HANDLERS)))]
    pub fault_handlers: u16,
    /// Postcopy over userfaultfd: the handler threads spin on it instead
    /// of sleeping in poll. Waking an idle CPU dominates a fault's latency
    /// on nested hosts; spinning removes it but takes a core per handler,
    /// which on a 2-core host the vCPUs miss.
    #[arg(long = "busy-poll")]
    pub busy_poll: bool,
}

/// `--placement`'s values, listed in `--help` and in the error for a bad one.
fn placement_parser() -> impl clap::builder::TypedValueParser<Value = Placement> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Placement::ALL.map(Placement::name))
        .map(|s| s.parse::<Placement>().expect("a listed placement parses"))
}

impl PagingArgs {
    /// The same flags, for a `ferry receive` this process starts.
    pub fn receive_args(&self) -> Vec<String> {
        let mut args = vec![
            "--placement".to_string(),
            self.placement.name().to_string(),
            "--prefetch".to_string(),
            self.prefetch.to_string(),
            "--fault-path".to_string(),
            self.fault_path.clone(),
            "--fault-handlers".to_string(),
            self.fault_handlers.to_string(),
        ];
        if self.busy_poll {
            args.push("--busy-poll".to_string());
        }
        args
    }
}

/// Which backend runs the VM and how.
#[derive(Args, Debug, Clone)]
pub struct BackendArgs {
    /// Backend: kvm (real vCPUs on /dev/kvm), soft (software MMU, no
    /// /dev/kvm needed), or auto: kvm where /dev/kvm can run a VM, soft
    /// otherwise (said in one line). A destination on auto takes the
    /// backend the stream names.
    #[arg(long, default_value = "auto", value_parser = BACKENDS)]
    pub backend: String,
    /// Host backing of guest RAM: thp (transparent huge pages: one host fault per
    /// 2 MiB, so the destination takes pages in fastest), anon (4 KiB pages),
    /// hugetlb (reserved 2 MiB pages) or memfd (shared).
    #[arg(long, default_value = "thp", value_parser = ["anon", "thp", "hugetlb", "memfd"])]
    pub backing: String,
    /// KVM dirty tracking: bitmap, clear or ring. The default, ring, is the
    /// per-vCPU meter that the quota and dirty-limit policies need (so the
    /// quota is the default policy on kvm); with bitmap or clear, the
    /// default policy is auto.
    #[arg(long = "dirty-tracking", value_enum, default_value_t = TrackingMode::Ring)]
    pub dirty_tracking: TrackingMode,
    /// Pages per KVM_CLEAR_DIRTY_LOG call in clear mode (a multiple of 64).
    #[arg(long = "clear-chunk", default_value_t = 32768)]
    pub clear_chunk: u32,
    /// Microseconds to pause between clear chunks (eager-split pacing).
    #[arg(long = "clear-pace-us", default_value_t = 0)]
    pub clear_pace_us: u32,
    /// Entries per vCPU dirty ring in ring mode (power of two, 1024-65536).
    #[arg(long = "ring-entries", default_value_t = 65536)]
    pub ring_entries: u32,
    /// Soft backend: huge-page splitting: eager, on-fault, or `chunked:PAGES:PACE_US`.
    #[arg(long = "soft-split", default_value = "eager", value_parser = parse_soft::<SplitMode>)]
    pub soft_split: SplitMode,
    /// Soft backend: write-protect-all: gen (O(1) generation) or walk.
    #[arg(long = "soft-write-protect", default_value = "gen", value_parser = parse_soft::<WriteProtect>)]
    pub soft_write_protect: WriteProtect,
    /// Soft backend: table iteration: present (skip non-present runs) or full.
    #[arg(long = "soft-iteration", default_value = "present", value_parser = parse_soft::<Iteration>)]
    pub soft_iteration: Iteration,
    /// Soft backend: largest leaf: 4k, 2m or 1g.
    #[arg(long = "soft-leaf", default_value = "2m", value_parser = parse_soft::<LeafSize>)]
    pub soft_leaf: LeafSize,
}

fn parse_soft<T: std::str::FromStr>(s: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| e.to_string())
}

impl BackendArgs {
    /// The backend kind, `auto` resolved ([`BackendKind::detect`]).
    pub fn kind(&self) -> BackendKind {
        self.backend.parse().expect("clap restricts the values")
    }

    /// The RAM backing.
    pub fn backing(&self) -> Backing {
        self.backing.parse().expect("clap restricts the values")
    }

    /// The KVM dirty-tracking mode with its parameters.
    pub fn tracking(&self) -> Result<DirtyTracking, String> {
        Ok(match self.dirty_tracking {
            TrackingMode::Bitmap => DirtyTracking::Bitmap,
            TrackingMode::Clear => {
                if self.clear_chunk == 0 || !self.clear_chunk.is_multiple_of(64) {
                    return Err(format!(
                        "--clear-chunk {} must be a positive multiple of 64",
                        self.clear_chunk
                    ));
                }
                DirtyTracking::Clear {
                    chunk_pages: self.clear_chunk,
                    pace_us: self.clear_pace_us,
                }
            }
            TrackingMode::Ring => {
                if !self.ring_entries.is_power_of_two()
                    || !(1024..=65536).contains(&self.ring_entries)
                {
                    return Err(format!(
                        "--ring-entries {} must be a power of two from 1024 to 65536",
                        self.ring_entries
                    ));
                }
                DirtyTracking::Ring {
                    entries: self.ring_entries,
                }
            }
        })
    }

    /// The soft backend's mechanism switches.
    pub fn mechanisms(&self) -> Mechanisms {
        Mechanisms {
            split: self.soft_split,
            iteration: self.soft_iteration,
            write_protect: self.soft_write_protect,
            leaf: self.soft_leaf,
        }
    }

    /// The VM configuration for `workload`.
    pub fn config(&self, workload: Workload) -> VmConfig {
        VmConfig {
            workload,
            backing: self.backing(),
        }
    }
}

/// `--connections`: a count, or `auto` for one per core (at most 8).
pub fn parse_connections(s: &str) -> Result<usize, String> {
    let max = ferry_engine::precopy::MAX_CONNECTIONS;
    if s == "auto" {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        return Ok(cores.clamp(1, 8));
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected 1 to {max}, or auto")),
    }
}

/// An engine's range (`RangeInclusive<u64>`) as clap's signed bounds.
pub fn ranged(range: std::ops::RangeInclusive<u64>) -> std::ops::RangeInclusive<i64> {
    *range.start() as i64..=*range.end() as i64
}

/// A `u32` flag parsed within an engine's range.
pub fn ranged_u32(
    range: std::ops::RangeInclusive<u64>,
) -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(ranged(range))
}

/// A restore mode's flag (`--restore`, `--mode`): the names of
/// [`RestoreMode::ALL`](ferry_engine::snapshot::RestoreMode::ALL), listed
/// in `--help` and in the refusal of any other.
pub fn restore_mode(
) -> impl clap::builder::TypedValueParser<Value = ferry_engine::snapshot::RestoreMode> {
    use clap::builder::TypedValueParser;
    use ferry_engine::snapshot::RestoreMode;
    clap::builder::PossibleValuesParser::new(RestoreMode::ALL.map(RestoreMode::name))
        // The parser admits only the names above.
        .map(|name: String| RestoreMode::from_name(&name).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `ferry demo` hands its destination parses back to the same
    /// settings.
    #[test]
    fn paging_flags_pass_on_unchanged() {
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            paging: PagingArgs,
        }
        use clap::Parser;
        for given in [
            &["x"][..],
            &[
                "x",
                "--placement",
                "write",
                "--prefetch",
                "16",
                "--fault-path",
                "userfaultfd",
            ],
            &["x", "--fault-handlers", "3", "--busy-poll"],
        ] {
            let first = Cli::try_parse_from(given).unwrap().paging;
            let passed = std::iter::once("x".to_string()).chain(first.receive_args());
            let again = Cli::try_parse_from(passed).unwrap().paging;
            assert_eq!(format!("{first:?}"), format!("{again:?}"), "{given:?}");
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
    }
}
