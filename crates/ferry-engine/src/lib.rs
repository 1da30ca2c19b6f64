//! The ferry migration engine: the wire format, the connection set, and the
//! precopy source and destination, driving any VM through
//! [`ferry_vm::Vm`]. A VMM author starts at [`vmm`], which says what to
//! implement, with an example that migrates a VM of its own.
//!
//! ```text
//!   migrate(vm, dialer) ──► precopy's round loop over session::source ─┬─ main channel (transport::main_channel)
//!                                                                      └─ N data connections (session::senders)
//!   await_migration(listener, deadline), receive(…) ◄── precopy's destination over session::dest, session::receivers
//!        both: wire (frames), digest (per-page xxh3), tunables (live knobs, cancel),
//!              progress (observer), summary (JSON), transport::health (failures, stalls)
//! ```
//!
//! * [`vmm`]: the contract a VMM implements to be migrated (start here).
//! * `wire` (public with feature `internals`, for the fuzzers and the
//!   engine's tests): preamble, frame codec, header, page batches,
//!   main-channel messages. A VMM sees only the header
//!   ([`vmm::StreamHeader`]), [`ExpectedVm`], [`StreamError`] and the
//!   versions this build speaks ([`WIRE_VERSION`], [`MIN_WIRE_VERSION`]).
//! * [`transport`]: TCP, TLS and UNIX sockets, opening a migration's
//!   connections, the main channel's threads, failure and stall handling.
//! * [`precopy`]: the round loop, the switchover, commit-after-verify.
//! * [`postcopy`]: switch over at once and fetch pages on demand, over a
//!   priority connection beside the data connections (also after precopy
//!   rounds: hybrid).
//! * `session` (private): what both modes share: each side's state, the
//!   options and settings, the senders and receivers (one thread per data
//!   connection), the destination's memory image.
//! * [`local`]: same-host live upgrade: the memory's files change hands,
//!   only the vCPU and device state travel.
//! * [`choices`]: the named choices (policy, mode, on-stall, compression),
//!   parsed and serialised by the names the CLI and the control socket use.
//! * [`converge`]: what slows a guest that dirties faster than the link, and
//!   what the engine does when precopy stalls; the prediction.
//! * [`digest`]: the memory digest that proves both ends hold the same memory.
//! * `page_xxh3` (private): the per-page hash, with the widest vectors the CPU has.
//! * `dirty_logs` (private): a VM's dirty logs (its own, its dirty sources,
//!   the VMM's writes) read as one.
//! * [`tunables`]: parameters that change while a migration runs; bandwidth cap.
//! * [`progress`]: callbacks for progress bars.
//! * [`monitor`]: a migration's live state and events in QEMU's terms
//!   (`query-migrate`, QMP events), for a VMM's monitor.
//! * [`summary`]: what a migration reports (`--json`).
//! * [`custody`]: who may run a VM's copy once a migration has ended, and
//!   what an operator may do with it next (`cont`, `migrate`, `resume`).
//! * [`seccomp`]: the threads and syscalls a VMM under seccomp must allow
//!   the engine, by kind of migration.
//! * [`snapshot`]: a running VM saved to a file while it runs, and
//!   restored from it, through the same contract.
//! * [`error`]: a migration's and a snapshot's errors.
//! * `conformance` (feature `conformance`): checks a VMM runs against its
//!   own `Vm` in its tests (dirty tracking, sections, pause, vCPU state, a
//!   migration to itself).
//!
//! **Paths.** Each public item has one home, the module that defines it
//! ([`choices`] for the named choices, [`summary`] for what is reported,
//! [`error`] for the errors); no module re-exports another's items. The
//! crate root re-exports what a first caller needs, and [`vmm`] gathers
//! the contract a VMM implements, with the `ferry_vm` types it names.
//!
//! The engine never asks which VMM or guest it drives; both ends must run
//! the same VMM (the header names it, and the destination checks).

#![warn(missing_docs)]

pub mod choices;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod converge;
pub mod custody;
pub mod digest;
mod dirty_logs;
pub mod error;
pub mod local;
pub mod monitor;
mod page_xxh3;
pub mod postcopy;
pub mod precopy;
pub mod progress;
pub mod seccomp;
mod session;
pub mod snapshot;
pub mod summary;
pub mod transport;
pub mod tunables;
pub mod vmm;
#[cfg(feature = "internals")]
pub mod wire;
// Without the `internals` feature the codec's pieces that only the fuzzers
// and the engine's tests call are unreachable, so they would read as dead.
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod wire;

pub use choices::{ChoiceError, Mode, OnStall};
pub use error::{MigrationError, OptionsError, PostcopyResume, TransportError};
pub use postcopy::resume_postcopy;
pub use precopy::{
    await_migration, migrate, migrate_accounted, receive, receive_as, IncomingMigration,
    MigrationSettings, PrecopyOptions, ReceiveOptions,
};
pub use progress::{Both, NoProgress, Phase, Progress};
pub use session::device_cost;
pub use summary::{
    DeltaSummary, Escalation, EscalationKind, MigrationSummary, Outcome, PostcopyReport,
    ReceiveSummary, ResumeSteps, RoundKind, RoundStats, ThrottleStep, VcpuShare,
};
pub use transport::{accept, connect, listen, Dial, Listen, TcpDialer, TlsConfig, TlsError};
pub use tunables::{TunableChange, Tunables};
pub use wire::{ExpectedVm, StreamError, MIN_VERSION as MIN_WIRE_VERSION, VERSION as WIRE_VERSION};
