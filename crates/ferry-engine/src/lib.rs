//! The ferry migration engine: the wire format, the connection set, and the
//! precopy source and destination, driving any VM through
//! [`ferry_vm::Vm`]. A VMM author starts at [`vmm`], which says what to
//! implement, with an example that migrates a VM of its own.
//!
//! ```text
//!   migrate(vm, dialer) ──► precopy::source ─┬─ main channel (transport::main_channel)
//!                                            └─ N data connections (precopy::senders)
//!   await_migration(listener, deadline), receive(…) ◄── precopy::destination, precopy::receivers
//!        both: wire (frames), digest (per-page xxh3), tunables (live knobs, cancel),
//!              progress (observer), summary (JSON), transport::health (failures, stalls)
//! ```
//!
//! * [`vmm`]: the contract a VMM implements to be migrated (start here).
//! * [`wire`]: preamble, frame codec, header, page batches, main-channel messages.
//! * [`transport`]: TCP, opening a migration's connections, the main
//!   channel's threads, failure and stall handling.
//! * [`precopy`]: rounds, switchover, commit-after-verify; senders and receivers.
//! * [`digest`]: the memory digest that proves both ends hold the same memory.
//! * [`tunables`]: parameters that change while a migration runs; bandwidth cap.
//! * [`progress`]: callbacks for progress bars.
//! * [`summary`]: what a migration reports (`--json`).
//! * [`converge`]: what slows a guest that dirties faster than the link, and
//!   what the engine does when precopy stalls.
//!
//! * `conformance` (feature `conformance`): checks a VMM runs against its
//!   own `Vm` in its tests (dirty tracking, sections, pause, vCPU state, a
//!   migration to itself).
//! * [`postcopy`]: switch over at once and fetch pages on demand, over a
//!   priority connection beside the data connections (also after precopy
//!   rounds: hybrid).
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
pub mod summary;
pub mod transport;
pub mod tunables;
pub mod vmm;
pub mod wire;

pub use choices::{ChoiceError, OnStall};
pub use error::{MigrationError, OptionsError};
pub use postcopy::{resume_postcopy, Mode, PostcopyReport, PostcopyResume};
pub use precopy::{
    await_migration, migrate, migrate_accounted, receive, receive_as, IncomingMigration,
    MigrationSettings, PrecopyOptions, ReceiveOptions,
};
pub use progress::{Both, NoProgress, Phase, Progress};
pub use session::device_cost;
pub use summary::{
    DeltaSummary, Escalation, EscalationKind, MigrationSummary, Outcome, ReceiveSummary, RoundKind,
    RoundStats, ThrottleStep, VcpuShare,
};
pub use transport::{
    accept, connect, listen, Dial, Listen, TcpDialer, TlsConfig, TlsError, TransportError,
};
pub use tunables::{TunableChange, Tunables};
pub use wire::{ExpectedVm, StreamError};
