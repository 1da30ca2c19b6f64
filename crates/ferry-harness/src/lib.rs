//! What ferry's programs and tests share to drive what they start and read
//! what it reports. Each was written more than once (in `ferry demo`, the
//! soak and link benches, the drain, minivmm's demo, and the test suites'
//! common modules), and the copies had begun to differ; here each is
//! written once.
//!
//! * [`child`]: a child process waited for with a deadline, and the
//!   `listening on ADDR` line a destination announces itself with.
//! * [`output`]: the JSON a command reports on its output's last line.
//! * [`stats`]: the median of repeated runs.
//! * [`guest`]: a guest's passes, waited for.
//!
//! A test that needs `/dev/kvm` asks [`ferry_kvm::require_kvm`], which
//! lives with the rest of what ferry knows about KVM.

#![warn(missing_docs)]

pub mod child;
pub mod guest;
pub mod output;
pub mod stats;
