//! What a migration is asked to do: each side's options, their defaults,
//! and the mode. One home for both modes, so that precopy and postcopy read
//! the same settings and neither owns the other's.

use crate::choices::Compression;
use crate::choices::ConvergeMode;
pub use crate::choices::Mode;
use crate::error::OptionsError;
use crate::tunables::{Tunables, DOWNTIME_MS, MAX_ROUNDS};
use crate::wire::ExpectedVm;
use ferry_vm::{BlockScope, Blocker, GuestProbe, Vm};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

/// Pages asked for per fault by default: the faulting page and the missing
/// pages right after it.
pub const DEFAULT_PREFETCH: u32 = 8;

/// How long either side tries to recover a postcopy whose connections
/// broke before it gives up.
pub const DEFAULT_RECOVER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl Mode {
    /// This mode with its switch to postcopy set: after `after_rounds`
    /// precopy rounds, and on a stall if `on_stall`. Without `after_rounds`:
    /// after the full pass, or only on a stall (or at the round cap) if
    /// `on_stall`. Only the hybrid mode switches; asking another for a
    /// switch is refused, naming the setting.
    pub fn switching(
        self,
        after_rounds: Option<u32>,
        on_stall: bool,
    ) -> Result<Self, OptionsError> {
        let needs_hybrid = |what| OptionsError::SwitchNeedsHybrid {
            what,
            mode: self.name(),
        };
        match self {
            Mode::Hybrid { .. } => {
                if let Some(r) = after_rounds {
                    OptionsError::check("postcopy-after-rounds", r.into(), MAX_ROUNDS, "")?;
                }
                Ok(Mode::Hybrid {
                    after_rounds: after_rounds.unwrap_or(if on_stall { u32::MAX } else { 1 }),
                    on_stall,
                })
            }
            _ if on_stall => Err(needs_hybrid("on-stall postcopy")),
            _ if after_rounds.is_some() => Err(needs_hybrid("postcopy-after-rounds")),
            m => Ok(m),
        }
    }
}

/// How long a link may stand still before both sides give up.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The stall timeouts accepted, in whole seconds.
pub const STALL_TIMEOUT_SECS: RangeInclusive<u64> = 1..=3600;
/// The postcopy recovery timeouts accepted, in seconds (0: give up at once).
pub const RECOVER_TIMEOUT_SECS: RangeInclusive<u64> = 0..=86_400;
/// Most data connections one migration opens.
pub const MAX_CONNECTIONS: usize = 64;
/// The fault handler threads a destination may run.
pub const FAULT_HANDLERS: RangeInclusive<u64> = 1..=16;
/// The pages a postcopy fault may ask for at once (the faulting page and
/// the missing ones after it).
pub const PREFETCH_PAGES: RangeInclusive<u64> = 1..=crate::wire::messages::MAX_REQUEST_PAGES as u64;

/// Pages per batch by default (1 MiB).
pub const DEFAULT_BATCH_PAGES: usize = 256;

/// Options of the source side.
///
/// Non-exhaustive, so that a new option does not break an embedder: start
/// from `Default::default()` and set the fields you want.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct PrecopyOptions {
    /// Live-tunable parameters (downtime target, round cap, bandwidth, cancel).
    pub tunables: Arc<Tunables>,
    /// Have the destination verify the digest before it resumes the guest.
    pub verify_before_resume: bool,
    /// Pages per batch (clamped to 1..=[`crate::wire::MAX_BATCH_PAGES`]).
    pub batch_pages: usize,
    /// Data connections, 1 to [`MAX_CONNECTIONS`].
    pub connections: usize,
    /// How long the link may stand still before the migration fails.
    pub stall_timeout: Duration,
    /// Compression of page batches.
    pub compression: Compression,
    /// Bytes of last-sent pages kept to re-send pages as deltas (0: off).
    pub delta_cache_bytes: u64,
    /// Harvest the dirty log at each policy interval while a round runs, so
    /// a page dirtied ahead of the send cursor is sent once, not again in
    /// the next round (see `ahead`). Fewer bytes and shorter migrations;
    /// but each harvest write-protects what it finds, so a guest that
    /// rewrites its pages faults (and is metered by the quota) more often.
    pub harvest_within_rounds: bool,
    /// What slows the guest when precopy does not converge; `None`: the
    /// best the VM serves ([`crate::converge::choose`]).
    pub converge: Option<ConvergeMode>,
    /// Highest downtime target a stall may raise the target to (`None`:
    /// the target is never raised).
    pub max_downtime: Option<Duration>,
    /// Precopy, postcopy, or precopy then postcopy.
    pub mode: Mode,
    /// Postcopy: how long to keep trying to reconnect after the
    /// connections break (zero: give up at once, the source staying paused
    /// with its pages).
    pub recover_timeout: Duration,
    /// The guest's own checks, read once the vCPUs are paused for the
    /// switchover (`None`: the guest has none, or the VMM does not say).
    pub probe: Option<Arc<dyn GuestProbe>>,
    /// Cancel the migration if it has not switched over by then (the
    /// source runs on); the error says it gave up.
    pub give_up_after: Option<Duration>,
    /// The operator's own blockers, besides the VM's ([`Vm::blockers`]):
    /// checked before the source connects.
    pub blockers: Vec<Blocker>,
}

impl Default for PrecopyOptions {
    fn default() -> Self {
        PrecopyOptions {
            tunables: Tunables::shared(),
            verify_before_resume: false,
            batch_pages: DEFAULT_BATCH_PAGES,
            connections: 1,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            compression: Compression::None,
            delta_cache_bytes: 0,
            harvest_within_rounds: false,
            converge: None,
            max_downtime: None,
            mode: Mode::Precopy,
            recover_timeout: DEFAULT_RECOVER_TIMEOUT,
            probe: None,
            give_up_after: None,
            blockers: Vec::new(),
        }
    }
}

impl PrecopyOptions {
    /// The capabilities ([`crate::wire::capabilities`]) this migration may
    /// use, all of which its destination must take.
    pub(crate) fn capabilities(&self) -> Vec<String> {
        use crate::choices::Codec;
        use crate::wire::capabilities::{DELTA, LZ4, POSTCOPY, ZSTD};
        let mut caps = Vec::new();
        if self.mode.may_postcopy() {
            caps.push(POSTCOPY);
        }
        if self.delta_cache_bytes > 0 {
            caps.push(DELTA);
        }
        match self.compression {
            Compression::None => {}
            Compression::Fixed(Codec::Lz4) => caps.push(LZ4),
            Compression::Fixed(Codec::Zstd) => caps.push(ZSTD),
            Compression::Auto => caps.extend([LZ4, ZSTD]),
        }
        caps.into_iter().map(String::from).collect()
    }

    /// Refuses settings out of range or that cannot go together, before
    /// anything starts: the one check the CLI, the control socket and QMP
    /// all map onto, so each refuses with the same words.
    pub fn validate(&self) -> Result<(), OptionsError> {
        OptionsError::check(
            "connections",
            self.connections as u64,
            1..=MAX_CONNECTIONS as u64,
            "",
        )?;
        check_stall(self.stall_timeout)?;
        check_recover(self.recover_timeout)?;
        if let Some(max) = self.max_downtime {
            OptionsError::check("max downtime", max.as_millis() as u64, DOWNTIME_MS, " ms")?;
        }
        if self.mode.may_postcopy() && self.delta_cache_bytes > 0 {
            return Err(OptionsError::DeltaWithPostcopy {
                mode: self.mode.name(),
            });
        }
        Ok(())
    }
}

/// The stall timeout's rule, for both sides.
fn check_stall(stall: Duration) -> Result<(), OptionsError> {
    OptionsError::check("stall timeout", stall.as_secs(), STALL_TIMEOUT_SECS, " s")
}

/// The recovery timeout's rule, for both sides.
fn check_recover(recover: Duration) -> Result<(), OptionsError> {
    OptionsError::check(
        "recover timeout",
        recover.as_secs(),
        RECOVER_TIMEOUT_SECS,
        " s",
    )
}

/// Options of the destination side.
///
/// Non-exhaustive, so that a new option does not break an embedder: start
/// from `Default::default()` and set the fields you want.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct ReceiveOptions {
    /// What the stream must carry; checked before any VM is built.
    pub expect: Option<ExpectedVm>,
    /// Verify the digest before resuming the guest.
    pub verify_before_resume: bool,
    /// How long the link may stand still before the migration fails.
    pub stall_timeout: Duration,
    /// How received pages land in guest memory.
    pub placement: Placement,
    /// Postcopy: pages asked for per fault (the faulting page and the
    /// missing ones after it).
    pub prefetch: u32,
    /// Postcopy: how long to wait for the source to reconnect after the
    /// connections break, with the guest running on (zero: give up at
    /// once, pausing the guest).
    pub recover_timeout: Duration,
    /// Postcopy: let vCPUs ask for their missing pages themselves where
    /// the backend has annotated fault exits (else userfaultfd always).
    pub vcpu_fault_exits: bool,
    /// Postcopy: threads reading the userfaultfd's fault events.
    pub fault_handlers: usize,
    /// Postcopy: those threads spin instead of sleeping in `poll`.
    pub fault_busy_poll: bool,
    /// The guest's own checks, read just before the guest resumes here.
    pub probe: Option<Arc<dyn GuestProbe>>,
    /// The operator's own blockers, besides the destination VM's
    /// ([`Vm::blockers`]): `ferry receive --no-postcopy` is one.
    pub blockers: Vec<Blocker>,
    /// The most device state this destination takes in one migration, in
    /// bytes: the live chunks sent while the guest runs
    /// ([`ferry_vm::LiveState`]) and the sections at the switchover. A
    /// source whose sections declare more
    /// ([`ferry_vm::SectionSpec::max_bytes`]) is refused before any
    /// memory moves, naming the largest; more arriving (a device that
    /// outgrows its declaration, or sends its state live again and again)
    /// fails the migration before it is held in memory.
    pub max_device_bytes: u64,
}

/// How the destination puts a received page into guest memory that has
/// never been touched.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// `Write` where the kernel may back guest RAM with transparent huge
    /// pages ([`ferry_vm::thp`]), else `Uffd`: a page placed by copy is a
    /// 4 KiB page, and RAM registered with userfaultfd is never collapsed
    /// into huge pages, so the guest would run on 4 KiB pages (and 4 KiB
    /// second-level mappings) after the move.
    #[default]
    Auto,
    /// `UFFDIO_COPY`: the kernel allocates the page already filled (no
    /// zeroing first); falls back to `Write` where userfaultfd is missing
    /// and on hugetlb backing.
    Uffd,
    /// A plain copy into the mapping: the first touch faults and the kernel
    /// zeroes the page before the data overwrites it.
    Write,
}

impl Placement {
    /// Every placement, for parsers and their help.
    pub const ALL: [Placement; 3] = [Placement::Auto, Placement::Uffd, Placement::Write];

    /// Its name on a command line (`auto`, `uffd`, `write`), which `parse`
    /// takes.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Auto => "auto",
            Placement::Uffd => "uffd",
            Placement::Write => "write",
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Placement::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names = Placement::ALL.map(Placement::name).join(", ");
                format!("unknown placement {s:?} ({names})")
            })
    }
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            expect: None,
            verify_before_resume: false,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            placement: Placement::Auto,
            prefetch: DEFAULT_PREFETCH,
            recover_timeout: DEFAULT_RECOVER_TIMEOUT,
            vcpu_fault_exits: true,
            fault_handlers: 1,
            fault_busy_poll: false,
            probe: None,
            blockers: Vec::new(),
            max_device_bytes: DEFAULT_MAX_DEVICE_BYTES,
        }
    }
}

/// The device state a destination takes by default: 4 GiB.
pub const DEFAULT_MAX_DEVICE_BYTES: u64 = 4 << 30;

impl ReceiveOptions {
    /// Refuses settings out of range, before anything is accepted (see
    /// [`PrecopyOptions::validate`]).
    pub fn validate(&self) -> Result<(), OptionsError> {
        check_stall(self.stall_timeout)?;
        check_recover(self.recover_timeout)?;
        OptionsError::check("prefetch", self.prefetch.into(), PREFETCH_PAGES, " pages")?;
        OptionsError::check(
            "fault handlers",
            self.fault_handlers as u64,
            FAULT_HANDLERS,
            "",
        )
    }
}

/// What blocks a migration on one side: the VM's blockers and the
/// operator's, first reason of each scope.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Blocked {
    /// Why no migration may run.
    pub migration: Option<String>,
    /// Why postcopy may not.
    pub postcopy: Option<String>,
}

impl Blocked {
    /// `vm`'s blockers with `operator`'s.
    pub fn of(vm: &dyn Vm, operator: &[Blocker]) -> Blocked {
        let all: Vec<Blocker> = vm
            .blockers()
            .into_iter()
            .chain(operator.iter().cloned())
            .collect();
        let first = |scope| {
            all.iter()
                .find(|b| b.scope == scope)
                .map(|b| b.reason.clone())
        };
        Blocked {
            migration: first(BlockScope::Migration),
            postcopy: first(BlockScope::Postcopy),
        }
    }
}
