//! Snapshots: a running VM saved to a file while it runs, and restored
//! from it, through the same contract a migration uses ([`crate::vmm`]).
//!
//! Why pages at fixed places, as QEMU's `mapped-ram` does: precopy's rounds
//! then overwrite a page in place when the guest dirties it again, the
//! file never grows with the rounds, a page of zeros is a hole that takes
//! no space, and a restore can read any page without an index.
//!
//! ```text
//!  offset 0           superblock (4 KiB): "FERRYSNP", format u32, the
//!                     manifest's offset, length and CRC32, its own CRC32;
//!                     written last, so a file without one was never finished
//!  4 KiB + gfn*4 KiB  guest frame gfn (holes between regions and zero pages
//!                     are holes in the file)
//!  after the pages    vCPU state │ sections │ page hashes (xxh3 per frame)
//!                     │ working set (runs of frames, newest first)
//!                     │ manifest (JSON: the VM's stream header, the digest,
//!                     where each part is and its CRC32)
//! ```
//!
//! **What proves a snapshot.** At the pause, the guest's memory is hashed
//! on its own and compared with the hashes of what the file holds
//! ([`SnapshotOptions::verify`]): a write the dirty logs missed fails the
//! snapshot there, while the guest can still run on. A restore checks every
//! part's CRC32 before it builds the VM, each page against its hash as it
//! reads it, and the restored memory's digest before a vCPU runs.
//!
//! **What a VMM implements for it: nothing new.** The header, vCPU state,
//! sections and dirty logs are the migration's; the restore's factory is
//! a destination's.

mod accesses;
mod chain;
mod checked;
mod converge;
mod format;
mod lazy;
mod live_proof;
mod pages;
mod restore;
mod save;
mod working_set;

pub use chain::{merge, MergeSummary, MAX_CHAIN};
pub use format::{FORMAT, FULL_FORMAT, OLDEST_FORMAT};
pub use live_proof::ProofAt;
pub use restore::{inspect, restore, restore_as, Restoring};
pub use save::{save, save_steered};
pub use working_set::WINDOW as WORKING_SET_WINDOW;

use crate::choices::ConvergeMode;
use crate::progress::Progress;
use crate::summary::ConvergenceReport;
use crate::Tunables;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// Who watches a snapshot while it runs, and may steer it: a control
/// socket's monitor and the VM's tunables, as a migration has them.
pub struct Steering<'a> {
    /// Told of each round, of the bytes written and of the pause (QMP's
    /// `query-migrate` and its events read the monitor this is).
    pub progress: &'a dyn Progress,
    /// Read while the live rounds write: a cancel ends the snapshot (the
    /// guest runs on, the file is not kept), and the bandwidth cap paces
    /// the writes, so a snapshot need not take all of the disk. The pause
    /// is never paced.
    pub tunables: Arc<Tunables>,
}

/// How a snapshot is taken.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct SnapshotOptions {
    /// The longest pause: rounds go on while writing what the guest
    /// dirtied would take longer, up to `max_rounds`.
    pub max_downtime: Duration,
    /// The most live rounds before the pause, however much is dirty.
    pub max_rounds: u32,
    /// Leave the guest stopped after the snapshot (its state is then the
    /// file's, as for a host reboot).
    pub stop: bool,
    /// Hash the guest's memory as it was at the pause and compare it with
    /// the file's pages: the proof that no write escaped the dirty logs.
    /// The snapshot fails if they differ.
    pub verify: bool,
    /// Where the guest runs on, make the proof after the pause, its memory
    /// frozen meanwhile (`live_proof`), so that the pause does not last a
    /// pass over memory. Off, or where memory cannot be frozen, the proof
    /// is made inside the pause.
    pub proof_after_pause: bool,
    /// Frames a lazy restore of this VM saw its guest touch first, in
    /// order ([`RestoreSummary::first_touches`]): the working set starts
    /// with them, before the pages the dirty logs saw written last.
    pub first_touches: Vec<u64>,
    /// Read the VM's access log, where it has one ([`ferry_vm::AccessLog`]):
    /// the working set then holds the pages the guest read in its last
    /// seconds too, not only those the dirty logs saw written.
    pub access_log: bool,
    /// Write a diff against this snapshot of the same VM: only the frames
    /// whose content differs from it ([`merge`] flattens a chain). The
    /// diff names it by path (as given: a relative path is taken from the
    /// diff's directory when restored) and by digest.
    pub parent: Option<std::path::PathBuf>,
    /// The convergence policy while the live rounds write, as a
    /// migration's `--converge` (`None`: the best the VM serves). It acts
    /// where the guest dirties memory faster than the file takes it.
    pub converge: Option<ConvergeMode>,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            max_downtime: crate::tunables::DEFAULT_DOWNTIME,
            max_rounds: 30,
            stop: false,
            verify: true,
            proof_after_pause: true,
            first_touches: Vec::new(),
            access_log: true,
            parent: None,
            converge: None,
        }
    }
}

/// When the guest's pages come in, against when its vCPUs start.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub enum RestoreMode {
    /// Every page is read and checked before a vCPU runs.
    #[default]
    Eager,
    /// The vCPUs start at once; a page they touch before it is in is read
    /// from the file on demand (userfaultfd, or the VM's own fault exits),
    /// while a background fill brings in the rest in address order.
    Lazy,
    /// [`RestoreMode::Lazy`], with the background fill taking the pages the
    /// guest wrote in its last seconds before the snapshot first, newest
    /// first (the snapshot's working set), then the rest.
    LazyWorkingSet,
}

impl RestoreMode {
    /// Every mode, for a caller that lists them.
    pub const ALL: [RestoreMode; 3] = [
        RestoreMode::Eager,
        RestoreMode::Lazy,
        RestoreMode::LazyWorkingSet,
    ];

    /// The name reports and the CLI use.
    pub fn name(self) -> &'static str {
        match self {
            RestoreMode::Eager => "eager",
            RestoreMode::Lazy => "lazy",
            RestoreMode::LazyWorkingSet => "lazy-working-set",
        }
    }

    /// The mode called `name` ([`RestoreMode::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// A mode by its name ([`RestoreMode::name`]); any other is refused,
/// naming the modes.
impl std::str::FromStr for RestoreMode {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        RestoreMode::from_name(name).ok_or_else(|| {
            let names: Vec<_> = RestoreMode::ALL.iter().map(|m| m.name()).collect();
            format!("no restore mode '{name}' (modes: {})", names.join(", "))
        })
    }
}

/// How a snapshot is restored.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// When the pages come in ([`RestoreMode`]).
    pub mode: RestoreMode,
    /// Leave the restored guest paused: the caller starts it.
    pub paused: bool,
    /// Eager: hash the restored memory before a vCPU runs, and compare it
    /// with the snapshot's digest (each page is checked as it is read,
    /// either way). Lazy: the pages' hashes, as placed, are compared with
    /// the digest once all are in.
    pub verify: bool,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            mode: RestoreMode::Eager,
            paused: false,
            verify: true,
        }
    }
}

/// One pass of a snapshot over guest memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotRound {
    /// 0 for the first pass over all memory; the last one ran paused.
    pub round: u32,
    /// RAM frames visited.
    pub pages: u64,
    /// Of those, written as data (the rest were zeros).
    pub data_pages: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Wall time.
    pub ms: f64,
}

/// What a snapshot did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotSummary {
    /// From the call to the file in place.
    pub total_ms: f64,
    /// The guest's pause, from stopping it to running it again (to the
    /// end of the work, where it stays stopped).
    pub pause_ms: f64,
    /// Hashing the memory of the pause for the proof
    /// ([`SnapshotOptions::verify`]): inside the pause, or after it ([`Self::proof`]).
    pub digest_ms: f64,
    /// Where the proof was made: in the pause, or after it with memory
    /// frozen while the guest ran on (`live_proof`).
    pub proof: ProofAt,
    /// Every pass, the paused one last.
    pub rounds: Vec<SnapshotRound>,
    /// Bytes the file takes on disk.
    pub bytes: u64,
    /// The file's size, holes included.
    pub file_bytes: u64,
    /// RAM frames stored as data.
    pub data_pages: u64,
    /// The memory digest the file holds.
    pub digest: u64,
    /// Pages the guest touched in its last seconds before the pause,
    /// recorded for a lazy restore to bring in first.
    pub working_set_pages: u64,
    /// Whether the VM's access log was read ([`SnapshotOptions::access_log`]).
    pub access_log: bool,
    /// Of the working set, the pages only the access log saw: read, not
    /// written, in those seconds.
    pub working_set_read_pages: u64,
    /// Whether the guest was left stopped.
    pub stopped: bool,
    /// Whether the live rounds converged: what was left for the pause was
    /// predicted to fit `max_downtime` (else the round cap ended them).
    /// A VM saved paused converged at once.
    pub converged: bool,
    /// The convergence policy the live rounds ran, and what it did (the
    /// file was their link).
    pub convergence: ConvergenceReport,
    /// How long a guest the policy held ran free before the pause, in ms
    /// (0: nothing held it; `converge::settle`).
    pub settle_ms: f64,
    /// Pages it dirtied meanwhile (they joined the paused round).
    pub settle_pages: u64,
}

/// What a snapshot file holds ([`inspect`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotInfo {
    /// The ferry release that wrote it.
    pub ferry: String,
    /// The VMM whose VM it holds.
    pub vmm: String,
    /// The VM's vCPUs.
    pub vcpus: u32,
    /// The VM's memory, holes excluded.
    pub memory_bytes: u64,
    /// Its device sections (`name` instance vVERSION).
    pub sections: Vec<String>,
    /// The memory digest at the pause.
    pub digest: u64,
    /// Frames of RAM stored as data.
    pub data_pages: u64,
    /// Whether the guest was left stopped after the snapshot.
    pub stopped: bool,
    /// When the pause ended, in seconds since the epoch.
    pub created_unix_s: u64,
    /// A diff snapshot's parent, its path as recorded.
    pub parent: Option<String>,
    /// Of a diff, the frames it holds (the rest are its parent's); of a
    /// full snapshot, every frame.
    pub frames_held: u64,
    /// Pages in its working set.
    pub working_set_pages: u64,
    /// Its working set as runs of frames, in the order a lazy restore
    /// brings them in first.
    #[serde(skip)]
    pub working_set: Vec<(u64, u64)>,
}

/// What a restore did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RestoreSummary {
    /// "eager", "lazy" or "lazy-working-set" ([`RestoreMode::name`]).
    pub mode: &'static str,
    /// From the call to the guest running (to the end, when left paused).
    pub first_instruction_ms: f64,
    /// From the call until every page of the snapshot's working set was
    /// in guest memory (eager: before the first instruction).
    pub working_set_ms: f64,
    /// From the call until every page was in guest memory.
    pub resident_ms: f64,
    /// Pages in the snapshot's working set.
    pub working_set_pages: u64,
    /// Touches of a page not in yet, each of which held a vCPU (or the
    /// VMM) until the page was read from the file. 0 for eager.
    pub blocking_faults: u64,
    /// Of the pages read, those read for a touch (the rest by the fill).
    pub fault_pages: u64,
    /// Of the blocking faults, those of devices in other processes that
    /// map guest memory (a vhost-user backend), served as a postcopy
    /// destination serves them.
    pub device_faults: u64,
    /// How a touch of a missing page reached the reader: "userfaultfd",
    /// "vcpu exit" (the VM's annotated fault exits), or "none" (eager).
    pub fault_path: &'static str,
    /// Eager: reading and checking the pages before the start.
    pub read_ms: f64,
    /// Hashing the restored memory ([`RestoreOptions::verify`]).
    pub verify_ms: f64,
    /// RAM frames read.
    pub pages_read: u64,
    /// Bytes read for them.
    pub bytes_read: u64,
    /// The restored memory's digest was compared with the snapshot's and
    /// matched (false: not compared). Lazily, the guest has written its
    /// memory by then: what is compared is the digest of the hashes of the
    /// pages as placed, each checked against its recorded hash before it
    /// was placed, so a match says every frame was placed once from the
    /// file.
    pub digest_match: bool,
    /// Whether the guest was started.
    pub started: bool,
    /// Lazily: frames the guest touched before they were in
    /// ([`RestoreSummary::first_touches`]).
    pub first_touch_pages: u64,
    /// Lazily: the frames the guest touched before they were in, in the
    /// order it touched them: what it asks for first when it starts from
    /// this state. Give them to the next snapshot of this VM
    /// ([`SnapshotOptions::first_touches`]), whose working set then starts
    /// with them. Reads included, which the dirty logs do not see.
    #[serde(skip)]
    pub first_touches: Vec<u64>,
}
