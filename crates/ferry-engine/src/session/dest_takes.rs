//! What a destination took of its source's wishes (capabilities a source
//! asks for and does without where refused): each changes how the source
//! runs its switchover.

use crate::wire::capabilities::{self, Answer};

/// The wishes a destination may take, which change the switchover.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DestTakes {
    /// It holds its guest's outputs, so a strict switchover resumes there
    /// before the verdict (capability `held-outputs`).
    pub(crate) held_outputs: bool,
    /// Its VM loads the compact vCPU state (capability
    /// `compact-vcpu-state`).
    pub(crate) compact_vcpu_state: bool,
}

impl DestTakes {
    /// From the destination's answer (none from a wire-5 peer: no wish).
    pub(crate) fn from_answer(answer: Option<&Answer>) -> DestTakes {
        let takes = |cap: &str| answer.is_some_and(|a| a.takes.iter().any(|c| c == cap));
        DestTakes {
            held_outputs: takes(capabilities::HELD_OUTPUTS),
            compact_vcpu_state: takes(capabilities::COMPACT_VCPU_STATE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(takes: &[&str]) -> Answer {
        Answer {
            takes: takes.iter().map(|c| c.to_string()).collect(),
            ..Answer::default()
        }
    }

    #[test]
    fn a_wire_5_peer_takes_no_wish() {
        assert_eq!(DestTakes::from_answer(None), DestTakes::default());
    }

    #[test]
    fn each_wish_is_taken_by_its_own_name() {
        let held = DestTakes::from_answer(Some(&answer(&[capabilities::HELD_OUTPUTS])));
        assert!(held.held_outputs && !held.compact_vcpu_state);
        let compact = DestTakes::from_answer(Some(&answer(&[
            capabilities::LZ4,
            capabilities::COMPACT_VCPU_STATE,
        ])));
        assert!(!compact.held_outputs && compact.compact_vcpu_state);
        let refused = Answer {
            refuses: [(
                capabilities::COMPACT_VCPU_STATE.to_string(),
                "no".to_string(),
            )]
            .into(),
            ..Answer::default()
        };
        assert_eq!(DestTakes::from_answer(Some(&refused)), DestTakes::default());
    }
}
