//! Experiments on the soft MMU, each next to its baseline.

pub mod demand_paging;
pub mod dirty_log;
pub mod write_protect;
pub mod zap;
