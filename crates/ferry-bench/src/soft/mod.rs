//! Experiments on the soft MMU, each next to its baseline.

pub mod dirty_log;
pub mod write_protect;
pub mod zap;
