//! Named capabilities: optional features a source uses only where its
//! destination takes them, so that adding one needs no new wire version.
//!
//! ```text
//!   wire 6+   Header.capabilities ─► what this migration may use
//!             Accept (tail)       ◄─ which of them the destination takes,
//!                                    and why it refuses the others
//!   wire 5    nothing is exchanged: a wire-5 peer has every feature of
//!             wire 5 (WIRE_5), and a destination learns from Hello.priority
//!             whether postcopy may come
//! ```
//!
//! A source that needs a capability its destination refuses stops before
//! any memory moves, naming the capability and the destination's reason.
//! Names travel as strings, so a newer peer's names are refused by name
//! ("this ferry does not implement ...") rather than failing to parse.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The switch to postcopy: the guest resumes on the destination, which
/// fetches missing pages on demand over a priority connection.
pub const POSTCOPY: &str = "postcopy";
/// Pages re-sent as XOR deltas against the destination's copy.
pub const DELTA: &str = "delta";
/// Page batches compressed with lz4.
pub const LZ4: &str = "lz4";
/// Page batches compressed with zstd.
pub const ZSTD: &str = "zstd";

/// Device state at the switchover in parts (SectionsPart frames before
/// Sections), so that it may outgrow one frame: asked when the VM's
/// sections declare more than one frame holds.
pub const SECTION_PARTS: &str = "section-parts";

/// Device state sent while the guest runs (LiveSection frames during the
/// precopy rounds, see [`ferry_vm::LiveState`]): asked when the VM
/// has live sections.
pub const LIVE_SECTIONS: &str = "live-sections";

/// A strict switchover may resume the guest on the destination before
/// the digest's verdict, its outputs held until the Commit
/// ([`ferry_vm::OutputGate`]): the destination then says Resumed before
/// Verified. Asked by every source as a wish; taken by a destination whose
/// VM has an output gate.
pub const HELD_OUTPUTS: &str = "held-outputs";

/// The vCPU state in the VMM's compact form
/// ([`ferry_vm::VcpuState::saves_compact`]), quicker to write and parse
/// while the guest is paused. Asked as a wish by a source whose VM writes
/// it; taken by a destination whose VM loads it.
pub const COMPACT_VCPU_STATE: &str = "compact-vcpu-state";

/// The first wire version that exchanges capabilities.
pub const CAPABILITIES_SINCE: u32 = 6;

/// Every capability this ferry implements.
pub const IMPLEMENTED: [&str; 8] = [
    POSTCOPY,
    DELTA,
    LZ4,
    ZSTD,
    SECTION_PARTS,
    LIVE_SECTIONS,
    HELD_OUTPUTS,
    COMPACT_VCPU_STATE,
];
/// What a wire-5 peer has without saying so: every feature wire 5 had.
pub const WIRE_5: [&str; 4] = [POSTCOPY, DELTA, LZ4, ZSTD];

/// The destination's answer to the capabilities a source asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The ones it takes.
    #[serde(default)]
    pub takes: Vec<String>,
    /// The ones it refuses, each with its reason.
    #[serde(default)]
    pub refuses: BTreeMap<String, String>,
}

impl Answer {
    /// The answer of a destination to `asked`, refusing what this ferry
    /// does not implement and what `refused` names (with its reason).
    pub fn to(asked: &[String], refused: &BTreeMap<String, String>) -> Answer {
        let mut answer = Answer::default();
        for cap in asked {
            if let Some(reason) = refused.get(cap) {
                answer.refuses.insert(cap.clone(), reason.clone());
            } else if IMPLEMENTED.contains(&cap.as_str()) {
                answer.takes.push(cap.clone());
            } else {
                answer.refuses.insert(
                    cap.clone(),
                    format!(
                        "this ferry (wire {} to {}) does not implement it",
                        super::MIN_VERSION,
                        super::VERSION
                    ),
                );
            }
        }
        answer
    }

    /// The first of `needed` the destination does not take, with its
    /// reason.
    pub fn first_refused<'a>(&self, needed: &'a [String]) -> Option<(&'a str, String)> {
        needed.iter().find_map(|cap| {
            if self.takes.contains(cap) {
                return None;
            }
            let reason = self
                .refuses
                .get(cap)
                .cloned()
                .unwrap_or_else(|| "it did not say why".into());
            Some((cap.as_str(), reason))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_destination_takes_what_it_implements_and_names_the_rest() {
        let mut refused = BTreeMap::new();
        refused.insert(POSTCOPY.to_string(), "the operator said no".to_string());
        let a = Answer::to(&names(&[POSTCOPY, LZ4, "teleport"]), &refused);
        assert_eq!(a.takes, names(&[LZ4]));
        assert_eq!(a.refuses[POSTCOPY], "the operator said no");
        assert!(a.refuses["teleport"].contains("does not implement"));
        let needed = names(&[LZ4, POSTCOPY]);
        assert_eq!(
            a.first_refused(&needed),
            Some((POSTCOPY, "the operator said no".to_string()))
        );
        assert_eq!(a.first_refused(&names(&[LZ4])), None);
    }
}
