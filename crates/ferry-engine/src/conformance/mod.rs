//! A conformance kit for the VMM contract: checks any VMM runs against its
//! own [`Vm`] implementation, in its own tests, in the spirit of
//! vm-memory's shared bitmap tests. Built with the `conformance` feature.
//!
//! The engine trusts a VM on seven points that it cannot check while it
//! migrates one; each is a check here, run on VMs the VMM builds itself:
//!
//! | check | function | what it proves |
//! |---|---|---|
//! | [`Check::DirtyPages`] | [`dirty_pages_reported`] | every page the guest and devices write is reported by the dirty log, the dirty sources or `GuestRam`, collected as a migration does |
//! | [`Check::SectionsRoundTrip`] | [`sections_round_trip`] | device state saved, restored into a fresh VM and saved again is the same |
//! | [`Check::SectionVersions`] | [`section_versions_refused`] | a section stamped outside the versions the VMM loads is refused by the engine's own check, naming it, and the VM is unharmed |
//! | [`Check::PauseStopsMemory`] | [`pause_stops_memory`] | once `pause` returns, guest memory stops changing (read in memory, not from `is_running`) |
//! | [`Check::VcpuStateRoundTrip`] | [`vcpu_state_round_trips`] | vCPU state saved, restored into a fresh VM and saved again is the same |
//! | [`Check::LoopbackMigration`] | [`loopback_migration`] | a precopy migration to a VM of the same VMM over loopback ends with matching digests |
//! | [`Check::SnapshotRoundTrip`] | [`snapshot_round_trip`] | a live snapshot to a file proves itself at its pause, and restores (eagerly, lazily, lazily with the working set first) into VMs of the same VMM that run with the snapshot's digest |
//!
//! [`run_all`] runs them all and returns a [`Report`]. A check that does not
//! apply to a VM (no sections, no [`ferry_vm::VcpuState`]) says it was
//! skipped, and why; it never passes silently.
//!
//! A VMM takes part through one small trait, [`VmmUnderTest`]: how to build
//! a fresh source VM and a fresh destination VM, and how to make a running
//! VM's guest and devices write pages the kit chooses. The writes must take
//! the path the dirty tracking has to see (vCPU stores for a guest that
//! runs on vCPUs, a device's own DMA path for a device): a hook that marks
//! pages dirty itself proves nothing.
//!
//! The kit bounds its own waits (for a guest to write, for a migration);
//! a hook of the VMM's that never returns is the one thing it cannot
//! bound, so run it under your test harness's timeout.

mod dirty;
mod migration;
mod pages;
mod pause;
mod sections;
mod snapshot;
#[cfg(test)]
mod tests;
mod vcpu;

pub use dirty::{dirty_pages_reported, DirtyError};
pub use migration::{loopback_migration, MigrationCheckError, MIGRATION_DEADLINE};
pub use pages::{chosen_pages, describe_frame, PagesError};
pub use pause::{pause_stops_memory, PauseError, PAUSED_WAIT, WRITES_DEADLINE};
pub use sections::{section_versions_refused, sections_round_trip, SectionsError};
pub use snapshot::{snapshot_round_trip, SnapshotCheckError};
pub use vcpu::{vcpu_state_round_trips, VcpuError};

use ferry_vm::{error_chain, Gfn, Section, Vm, VmError};
use std::fmt;

/// What a VMM gives the kit: its VMs, and a way to make them write.
pub trait VmmUnderTest {
    /// The VMM's VM type.
    type Vm: Vm;

    /// What failure messages call this VMM: its `vmm_id`, and whatever of
    /// its configuration matters (`ferry-kvm (dirty ring)`).
    fn label(&self) -> String;

    /// A fresh source VM, built as your VMM builds one to run a guest, not
    /// yet started. Its guest must write memory while it runs (the pause
    /// and migration checks watch memory change).
    fn source(&mut self) -> Result<Self::Vm, VmError>;

    /// A fresh destination VM, built as your receiving factory builds one
    /// for a stream whose header carries `source_config` (a source's
    /// [`Vm::vmm_config`]): memory empty, not started.
    fn destination(&mut self, source_config: &serde_json::Value) -> Result<Self::Vm, VmError>;

    /// Has the guest and the devices of the running `vm` write each of
    /// `pages` (at least one byte each; the contents may stay the same),
    /// through the paths your dirty tracking must observe: vCPU stores for
    /// the guest, a device's own path for a device. Returns once every
    /// write has landed. The kit chooses pages in every region, its first
    /// and last page included.
    fn write_pages(&mut self, vm: &mut Self::Vm, pages: &[Gfn]) -> Result<(), VmError>;

    /// Whether state saved by one VM (`saved`) and saved again by a fresh
    /// VM that restored it (`resaved`) is the same state. Equal bytes by
    /// default, which is what to keep: override it only where your format
    /// legitimately differs between two saves of one state (a timestamp,
    /// a counter of saves), and compare everything else.
    fn same_state(&self, saved: Saved<'_>, resaved: Saved<'_>) -> bool {
        saved == resaved
    }
}

/// Saved state, as [`VmmUnderTest::same_state`] compares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved<'a> {
    /// One device section, its version stamped.
    Section(&'a Section),
    /// The vCPUs' state ([`ferry_vm::VcpuState::save_vcpus`]).
    Vcpus(&'a [u8]),
}

/// One check of the kit.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// [`dirty_pages_reported`].
    DirtyPages,
    /// [`sections_round_trip`].
    SectionsRoundTrip,
    /// [`section_versions_refused`].
    SectionVersions,
    /// [`pause_stops_memory`].
    PauseStopsMemory,
    /// [`vcpu_state_round_trips`].
    VcpuStateRoundTrip,
    /// [`loopback_migration`].
    LoopbackMigration,
    /// [`snapshot_round_trip`].
    SnapshotRoundTrip,
}

impl Check {
    /// Every check, in the order [`run_all`] runs them.
    pub const ALL: [Check; 7] = [
        Check::DirtyPages,
        Check::SectionsRoundTrip,
        Check::SectionVersions,
        Check::PauseStopsMemory,
        Check::VcpuStateRoundTrip,
        Check::LoopbackMigration,
        Check::SnapshotRoundTrip,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Check::DirtyPages => "dirty pages reported",
            Check::SectionsRoundTrip => "sections round trip",
            Check::SectionVersions => "section versions refused",
            Check::PauseStopsMemory => "pause stops memory",
            Check::VcpuStateRoundTrip => "vCPU state round trip",
            Check::LoopbackMigration => "loopback migration",
            Check::SnapshotRoundTrip => "snapshot round trip",
        }
    }

    /// Runs it on `vmm`.
    pub fn run<V: VmmUnderTest>(self, vmm: &mut V) -> Result<Verdict, Failure> {
        match self {
            Check::DirtyPages => dirty_pages_reported(vmm),
            Check::SectionsRoundTrip => sections_round_trip(vmm),
            Check::SectionVersions => section_versions_refused(vmm),
            Check::PauseStopsMemory => pause_stops_memory(vmm),
            Check::VcpuStateRoundTrip => vcpu_state_round_trips(vmm),
            Check::LoopbackMigration => loopback_migration(vmm),
            Check::SnapshotRoundTrip => snapshot_round_trip(vmm),
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a check that did not fail ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It ran and held; `what` says what it covered.
    Passed {
        /// What it covered ("64 pages in 2 regions").
        what: String,
    },
    /// It does not apply to this VM, for this reason.
    Skipped {
        /// Why ("the VM declares no VcpuState").
        why: String,
    },
}

impl Verdict {
    fn passed(what: impl Into<String>) -> Self {
        Verdict::Passed { what: what.into() }
    }

    fn skipped(why: impl Into<String>) -> Self {
        Verdict::Skipped { why: why.into() }
    }
}

/// A check that failed: which, on which VMM, and why.
#[derive(Debug, thiserror::Error)]
#[error(
    "conformance check '{check}' failed for VMM {vmm}: {}",
    error_chain(&**reason)
)]
pub struct Failure {
    /// The check.
    pub check: Check,
    /// The VMM, as [`VmmUnderTest::label`] calls it.
    pub vmm: String,
    /// What went wrong.
    pub reason: Box<CheckError>,
}

/// What went wrong in a check, by check.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// [`dirty_pages_reported`].
    #[error(transparent)]
    Dirty(#[from] DirtyError),
    /// [`sections_round_trip`] and [`section_versions_refused`].
    #[error(transparent)]
    Sections(#[from] SectionsError),
    /// [`pause_stops_memory`].
    #[error(transparent)]
    Pause(#[from] PauseError),
    /// [`vcpu_state_round_trips`].
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// [`loopback_migration`].
    #[error(transparent)]
    Migration(#[from] MigrationCheckError),
    /// [`snapshot_round_trip`].
    #[error(transparent)]
    Snapshot(#[from] SnapshotCheckError),
}

/// A call into the VM or the VMM's hook that failed during a check.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed: {}", error_chain(source))]
pub struct StepError {
    /// What the kit asked for ("the source VM's start").
    pub step: &'static str,
    /// The VM's or the hook's error.
    pub source: VmError,
}

/// `Err(e)` of a VM call as the [`StepError`] of `step`.
fn step<T>(step: &'static str, result: Result<T, VmError>) -> Result<T, StepError> {
    result.map_err(|source| StepError { step, source })
}

/// `reason` as `check`'s failure on `vmm`.
fn failure<V: VmmUnderTest>(check: Check, vmm: &V, reason: impl Into<CheckError>) -> Failure {
    Failure {
        check,
        vmm: vmm.label(),
        reason: Box::new(reason.into()),
    }
}

/// Every check's outcome on one VMM.
#[derive(Debug)]
pub struct Report {
    /// The VMM, as [`VmmUnderTest::label`] calls it.
    pub vmm: String,
    /// Each check and how it ended, in [`Check::ALL`]'s order.
    pub outcomes: Vec<(Check, Result<Verdict, Failure>)>,
}

impl Report {
    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Failure> {
        self.outcomes.iter().filter_map(|(_, r)| r.as_ref().err())
    }

    /// The checks that were skipped, with why.
    pub fn skipped(&self) -> impl Iterator<Item = (Check, &str)> {
        self.outcomes.iter().filter_map(|(c, r)| match r {
            Ok(Verdict::Skipped { why }) => Some((*c, why.as_str())),
            _ => None,
        })
    }

    /// `Ok` if no check failed (skipped ones included), or every failure.
    pub fn result(&self) -> Result<(), ConformanceError> {
        let failed: Vec<String> = self.failures().map(|f| f.to_string()).collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(ConformanceError::Failed {
                vmm: self.vmm.clone(),
                count: failed.len(),
                failures: failed.join("\n"),
            })
        }
    }
}

/// One line per check: `PASS`, `SKIP` or `FAIL`, the check, and what it
/// covered, why it was skipped, or why it failed.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (check, outcome) in &self.outcomes {
            match outcome {
                Ok(Verdict::Passed { what }) => writeln!(f, "PASS {check} ({}): {what}", self.vmm)?,
                Ok(Verdict::Skipped { why }) => writeln!(f, "SKIP {check} ({}): {why}", self.vmm)?,
                Err(e) => writeln!(f, "FAIL {e}")?,
            }
        }
        Ok(())
    }
}

/// A VMM that does not conform.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    /// Some checks failed; `failures` has one line each.
    #[error("VMM {vmm} failed {count} conformance check(s):\n{failures}")]
    Failed {
        /// The VMM.
        vmm: String,
        /// How many checks failed.
        count: usize,
        /// One line per failed check.
        failures: String,
    },
}

/// Runs every check on `vmm`, each on VMs of its own, and reports them all
/// (a failure does not stop the checks after it).
pub fn run_all<V: VmmUnderTest>(vmm: &mut V) -> Report {
    Report {
        vmm: vmm.label(),
        outcomes: Check::ALL.iter().map(|&c| (c, c.run(vmm))).collect(),
    }
}
