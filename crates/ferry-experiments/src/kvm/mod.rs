//! Experiments on `/dev/kvm`.

pub mod demand_paging;
pub mod dirty_log;
