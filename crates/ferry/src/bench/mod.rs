//! `ferry bench ...`: experiments that print seed-shaped tables and write JSON
//! plus an SVG plot. Timings always compare two variants measured in the same
//! run; an absolute time from a shared machine is not a result on its own.
//!
//! Everything `ferry bench` runs, below the subcommand (`cmd::bench`, which
//! only names them and parses their flags). The seeds' experiments live in
//! the `ferry-experiments` crate, and their modules here only feed them their
//! flags (`dirty_log`, `zap`, `write_protect`, `demand_paging`); the others
//! are whole here, since they drive `ferry` processes or this crate's
//! migrations end to end. Each ends the same way ([`output`]).
//!
//! A module is named for what it measures where the subcommand's word
//! means something else in this crate: `upgrade` is `ferry bench local`
//! (the same-host upgrade, not the engine's `local` module), and
//! `simulated_drain` is `ferry bench fleet` (simulated drains of generated
//! fleets, not `drain/`'s real one on this machine).

pub mod converge;
pub mod demand_paging;
pub mod device_state;
pub mod dirty_log;
pub mod link;
mod output;
pub mod simulated_drain;
pub mod snapshot;
pub mod soak;
pub mod upgrade;
pub mod write_protect;
pub mod zap;
