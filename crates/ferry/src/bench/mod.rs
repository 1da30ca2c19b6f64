//! `ferry bench ...`: experiments that print seed-shaped tables and write JSON
//! plus an SVG plot. Timings always compare two variants measured in the same
//! run; an absolute time from a shared machine is not a result on its own.

//! The experiments themselves live in the `ferry-bench` crate; this is the
//! one for the benches that drive `ferry` processes end to end.

pub mod converge;
pub mod demand_paging;
pub mod device_state;
pub mod dirty_log;
pub mod fleet;
pub mod link;
pub mod local;
mod output;
pub mod soak;
pub mod write_protect;
pub mod zap;
