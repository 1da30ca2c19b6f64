//! What the guest checker writes, in the forms the host reads back:
//!
//! - [`line`]: its numbered, checksummed console lines;
//! - [`record`]: its numbered, checksummed disk records;
//! - [`warnings`]: which kernel log lines count as warnings.
//!
//! The checker itself is `src/main.rs`, a static binary that runs as a
//! Linux guest's init; VMMs that move that guest (minivmm) use this library
//! to check what it printed and wrote.

pub mod line;
pub mod record;
pub mod warnings;
