//! Experiments on `/dev/kvm`.

pub mod dirty_log;
