//! What both ends of a same-host live upgrade (`ferry migrate --local`,
//! `ferry receive --local`) share: the engine's options, with ferry's
//! guest probe, and how the upgrade is reported.

use ferry_engine::local::{LocalOptions, LocalSummary};
use ferry_memstress::MemstressProbe;
use std::sync::Arc;

/// The engine's options for a same-host upgrade of ferry's guest.
pub fn options() -> LocalOptions {
    {
        let mut o = LocalOptions::default();
        o.probe = Some(Arc::new(MemstressProbe));
        o
    }
}

/// Says how a same-host upgrade went (and, with `json`, its summary as
/// one line on stdout); both ends print it.
pub fn report(s: &LocalSummary, json: bool) {
    eprintln!(
        "ferry: same-host migration {:?}: {} of memory mapped, not copied; downtime {:.2} ms, total {:.1} ms, digest {}",
        s.status,
        ferry_vm::types::human_bytes(s.memory_bytes),
        s.downtime_ms,
        s.total_ms,
        if s.digest_match { "match" } else { "MISMATCH" }
    );
    if json {
        println!("{}", serde_json::to_string(s).expect("summary serializes"));
    }
}
