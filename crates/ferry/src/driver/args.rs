//! The flags of a migration this process runs (`ferry migrate`, `ferry
//! demo`), and the engine's options they ask for.

use crate::error::CmdError;
use clap::Args;
use ferry_engine::choices::Compression;
use ferry_engine::choices::ConvergeMode;
use ferry_engine::postcopy::DEFAULT_RECOVER_TIMEOUT;
use ferry_engine::precopy::{DEFAULT_STALL_TIMEOUT, RECOVER_TIMEOUT_SECS, STALL_TIMEOUT_SECS};
use ferry_engine::tunables::{
    DEFAULT_DOWNTIME, DEFAULT_MAX_ROUNDS, DOWNTIME_MS, MAX_ROUNDS, QUOTA_INTERVAL_MS,
};
use ferry_engine::{
    MigrationSettings, Mode, OnStall, PrecopyOptions, TlsConfig, TunableChange, Tunables,
};
use ferry_memstress::MemstressProbe;
use std::sync::Arc;

/// Knobs of a precopy migration.
#[derive(Args, Debug, Clone)]
pub struct MigrationArgs {
    /// Downtime target in ms: precopy switches over once its predicted
    /// final round (queued bytes, dirty set, harvest and resume) fits well
    /// under it: at once under a quarter of it, after at most 3 more
    /// shrinking rounds under it, never over it.
    #[arg(long = "downtime-ms", default_value_t = DEFAULT_DOWNTIME.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(DOWNTIME_MS))]
    pub downtime_ms: u64,
    /// Most dirty rounds before stop-and-copy regardless.
    #[arg(long = "max-rounds", default_value_t = DEFAULT_MAX_ROUNDS,
          value_parser = crate::args::ranged_u32(MAX_ROUNDS))]
    pub max_rounds: u32,
    /// Bandwidth cap in MiB/s (0 = unlimited).
    #[arg(long = "bandwidth", default_value_t = 0)]
    pub bandwidth_mib_s: u64,
    /// Verify the memory digest before the destination resumes (longer downtime).
    #[arg(long = "verify-before-resume")]
    pub verify_before_resume: bool,
    /// Data connections for guest pages, each with its own sender and
    /// receiver thread: 1 to 64, or `auto` (one per core, at most 8). A
    /// main channel is always opened besides them.
    #[arg(long, default_value = "1", value_parser = crate::args::parse_connections)]
    pub connections: usize,
    /// Seconds the link may stand still before both ends give up (the source
    /// VM keeps running, the destination starts no guest).
    #[arg(long = "stall-timeout", default_value_t = DEFAULT_STALL_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(STALL_TIMEOUT_SECS))]
    pub stall_timeout_s: u64,
    /// Compress page batches: none, lz4, zstd, or auto (compress only while
    /// the link, not the CPU, is the bottleneck; the summary says what it
    /// chose). Pair with --fill text or random for honest figures.
    #[arg(long, default_value = "none", value_parser = clap::value_parser!(Compression))]
    pub compress: Compression,
    /// What slows the guest when it dirties memory faster than the link
    /// sends it. auto: QEMU's auto-converge (once dirtying exceeds half the
    /// transfer twice, every vCPU, readers too, runs 10 ms and sleeps
    /// p/(1-p) x 10 ms, p from 20% up to 99%). quota: the seed's per-vCPU
    /// dirty quota (each vCPU may dirty a share of the link per 100 ms; only
    /// a vCPU that uses it up sleeps; soft, and kvm with --dirty-tracking ring).
    /// dirty-limit: QEMU 8.1's (each vCPU's dirty rate is limited to a share
    /// of the link; each writer's own throttle follows its rate). none.
    /// Default: quota where the backend meters each vCPU's writes, else auto.
    #[arg(long, value_parser = clap::value_parser!(ConvergeMode))]
    pub converge: Option<ConvergeMode>,
    /// The policy interval in ms: how often the convergence policy reads
    /// each vCPU's dirtying and the link while a round is sent, and the
    /// quota's refill interval (each vCPU may dirty its share of the link
    /// per interval; one that used it up sleeps until the next). Shorter:
    /// quicker reaction, smoother, more wake-ups. Changeable live with the
    /// control socket's `set`.
    #[arg(long = "quota-interval-ms", default_value_t = ferry_vm::QUOTA_INTERVAL.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(QUOTA_INTERVAL_MS))]
    pub quota_interval_ms: u64,
    /// When precopy stops converging (the bytes left stop shrinking for 3
    /// rounds), the engine first engages --converge, then raises the
    /// downtime target by half at a time up to this many ms. Default: never
    /// above --downtime-ms.
    #[arg(long = "max-downtime-ms", value_parser = clap::value_parser!(u64).range(DOWNTIME_MS))]
    pub max_downtime_ms: Option<u64>,
    /// Give up if the migration has not switched over after this many
    /// seconds: it is cancelled and the source VM keeps running (as a
    /// progress timeout in an orchestrator would). Default: never.
    #[arg(long = "give-up-after", value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub give_up_after_s: Option<u64>,
    /// How memory moves. precopy: rounds while the guest runs, then a
    /// short stop-and-copy. postcopy: switch over at once; the destination
    /// runs the guest and fetches each page it touches before it arrives
    /// (the rest are pushed behind). hybrid: precopy for
    /// --postcopy-after-rounds rounds, then postcopy (unless precopy
    /// converged first). Postcopy needs userfaultfd on the destination and
    /// cannot be combined with --delta, --verify-before-resume or hugetlb.
    #[arg(long, default_value = "precopy", value_parser = clap::value_parser!(Mode))]
    pub mode: Mode,
    /// hybrid: precopy rounds before postcopy (the full pass counts as one).
    /// Default: 1, or with --on-stall postcopy only when precopy stalls (or
    /// reaches --max-rounds).
    #[arg(long = "postcopy-after-rounds", value_parser = crate::args::ranged_u32(MAX_ROUNDS))]
    pub postcopy_after_rounds: Option<u32>,
    /// What a stall does (the bytes left stopped shrinking for 3 rounds).
    /// escalate: engage --converge, then raise the downtime target up to
    /// --max-downtime-ms. postcopy (with --mode hybrid): switch to postcopy
    /// at once, since precopy will not finish.
    #[arg(long = "on-stall", default_value = "escalate", value_parser = clap::value_parser!(OnStall))]
    pub on_stall: OnStall,
    /// Postcopy: when the connections break after the switchover, keep
    /// reconnecting for this many seconds; the destination's guest runs on
    /// meanwhile and the paused source keeps every page. 0: give up at once
    /// (the source stays paused with its pages either way). Pass the same
    /// to `ferry receive`.
    #[arg(long = "recover-timeout", value_name = "SECS", default_value_t = DEFAULT_RECOVER_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(RECOVER_TIMEOUT_SECS))]
    pub recover_timeout_s: u64,
    /// Re-send pages dirtied again as the bytes that changed since their
    /// last copy (like QEMU's XBZRLE), from a cache of last-sent pages.
    #[arg(long)]
    pub delta: bool,
    /// Harvest the dirty log at every policy interval while a round is
    /// sent, so that a page the guest dirties ahead of the send cursor goes
    /// out once, in that round, and not again in the next. Measured on a
    /// nested kvm host (docs/results.md, "Harvesting within rounds"): fewer
    /// bytes and shorter migrations for busy writers, but a writer faults
    /// more often (each harvest write-protects its pages again), so under the
    /// quota it runs a smaller share of the (shorter) migration. Off by
    /// default.
    #[arg(long = "harvest-within-rounds")]
    pub harvest_within_rounds: bool,
    /// Size of --delta's cache of last-sent pages (at most the guest's
    /// memory is used). A page evicted from it is sent whole.
    #[arg(long = "delta-cache", default_value = "256M", value_parser = crate::args::parse_size, requires = "delta")]
    pub delta_cache: u64,
    /// Mutual TLS on every connection, with `ca.pem`, `cert.pem` and `key.pem`
    /// from this directory (`ferry certs DIR` writes a throwaway set). The
    /// destination's certificate must name the host in --to.
    #[arg(long = "tls-dir", value_name = "DIR")]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Seconds the guest runs before migration starts (at least until every
    /// vCPU has finished one pass).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Before migrating, sample each vCPU's dirty rate for --predict-secs
    /// with dirty tracking on, and predict whether precopy converges and how
    /// long, how much downtime and how much guest slowdown each policy gives
    /// (`ferry demo` always does). The summary keeps it as `predicted`.
    #[arg(long)]
    pub predict: bool,
    /// Seconds --predict samples the guest.
    #[arg(long = "predict-secs", default_value_t = 1.0)]
    pub predict_secs: f64,
    /// Idle guest: after the warm-up pass has written every page, stop writing
    /// (the guest keeps reading and checking its stamps).
    #[arg(long)]
    pub idle: bool,
    /// Print the summary as one JSON object on the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// The link's rate when the caller knows it (the demo's shaped --netns
    /// link), for the prediction.
    #[arg(skip)]
    pub link_bytes_per_sec: Option<u64>,
}

impl MigrationArgs {
    /// The engine's options these flags ask for (with tunables of their
    /// own), mapped and checked by the engine as every face's are
    /// ([`MigrationSettings::options`]), and the TLS material, loaded so that a
    /// bad --tls-dir is refused before any VM boots.
    pub fn options(&self) -> Result<(PrecopyOptions, Option<TlsConfig>), CmdError> {
        let opts = self
            .settings()
            .options(Tunables::shared(), Some(Arc::new(MemstressProbe)))
            .map_err(|e| CmdError::Usage(e.to_string()))?;
        Ok((opts, crate::tls::load_tls(self.tls_dir.as_deref())?))
    }

    /// The engine's settings these flags ask for.
    pub fn settings(&self) -> MigrationSettings {
        MigrationSettings {
            tunables: TunableChange {
                downtime_ms: Some(self.downtime_ms),
                max_rounds: Some(self.max_rounds),
                bandwidth_bytes_per_sec: Some(self.bandwidth_mib_s.saturating_mul(1 << 20)),
                quota_interval_ms: Some(self.quota_interval_ms),
            },
            verify_before_resume: self.verify_before_resume,
            connections: Some(self.connections),
            stall_timeout_s: Some(self.stall_timeout_s),
            compression: self.compress,
            delta_cache_bytes: if self.delta { self.delta_cache } else { 0 },
            harvest_within_rounds: self.harvest_within_rounds,
            converge: self.converge,
            max_downtime_ms: self.max_downtime_ms,
            give_up_after_s: self.give_up_after_s,
            mode: Some(self.mode),
            postcopy_after_rounds: self.postcopy_after_rounds,
            on_stall: self.on_stall,
            postcopy_ram: false,
            recover_timeout_s: Some(self.recover_timeout_s),
        }
    }
}
