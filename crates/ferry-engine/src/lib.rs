//! The ferry migration engine: the stream format, the TCP transport, and the
//! precopy source and destination, driving any backend through
//! [`ferry_backend::Vm`].
//!
//! ```text
//!   migrate(vm, stream) ──► precopy::source ──► stream (frames) ──► transport (TCP, any Read+Write)
//!   receive(stream, create_vm) ◄── precopy::destination ◄── stream ◄──┘
//!        both: digest (per-page xxh3), tunables (live knobs, cancel), progress (observer), summary (JSON)
//! ```
//!
//! * [`stream`]: preamble, frame codec, header, page batches, control messages.
//! * [`precopy`]: rounds, convergence, switchover, commit-after-verify.
//! * [`digest`]: the memory digest that proves both ends hold the same memory.
//! * [`tunables`]: parameters that change while a migration runs; bandwidth cap.
//! * [`progress`]: callbacks for progress bars.
//! * [`transport`]: TCP connect / listen with clear errors.
//! * [`summary`]: what a migration reports (`--json`).
//!
//! The engine never asks which backend it drives; both ends must run the
//! same one (the header says which, and the destination checks).

pub mod digest;
pub mod error;
pub mod precopy;
pub mod progress;
pub mod stream;
pub mod summary;
pub mod transport;
pub mod tunables;

pub use error::MigrationError;
pub use precopy::{migrate, receive, PrecopyOptions, ReceiveOptions};
pub use progress::{NoProgress, Phase, Progress};
pub use stream::{ExpectedVm, StreamError};
pub use summary::{MigrationSummary, ReceiveSummary, RoundKind, RoundStats, Status};
pub use transport::{accept, connect, listen, TransportError};
pub use tunables::Tunables;
