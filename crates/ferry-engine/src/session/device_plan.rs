//! The source's plan for the VM's device state, fixed by the handshake:
//! which sections go live during the rounds, which wait for the pause and
//! what those declare they take, whether the destination takes them in
//! parts, and the sections saved at the pause until they are sent.
//!
//! A section saved at the pause is held to what the header announced (its
//! version and declared size), and one frame's limit applies unless the
//! destination agreed to parts: both rules are checked here, once, before
//! anything of the pause is sent.

use crate::error::MigrationError;
use crate::wire::sections::{check_saved, declared_total, encoded_len, PART_BYTES};
use crate::wire::{SectionError, MAX_FRAME_LEN};
use ferry_vm::{Section, SectionId};
use std::collections::BTreeMap;

/// What the source does with the VM's device state.
#[derive(Debug, Default)]
pub(crate) struct DevicePlan {
    /// The sections the header announced, with the versions their specs
    /// state: a section saved at the pause takes its version from here.
    announced: Vec<SectionId>,
    /// What each section declares it takes, as the header said.
    declared: BTreeMap<String, u64>,
    /// The VM's live sections ([`ferry_vm::LiveState`]), sent during the
    /// rounds; empty where the destination cannot take them.
    pub(crate) live: Vec<SectionId>,
    /// What the sections sent at the pause declare, for the downtime
    /// prediction (live sections count by what they have pending).
    pub(crate) declared_at_pause: u64,
    /// The destination takes the sections in parts (`section-parts`).
    in_parts: bool,
    /// The sections saved at the pause, until they are sent.
    saved: Option<Vec<Section>>,
}

impl DevicePlan {
    /// The plan the handshake agreed: the `announced` sections with the
    /// sizes they `declared`, `live` of them sent during the rounds, in
    /// parts when `in_parts`.
    pub(crate) fn agreed(
        announced: Vec<SectionId>,
        declared: BTreeMap<String, u64>,
        live: Vec<SectionId>,
        in_parts: bool,
    ) -> Self {
        let at_pause: Vec<_> = announced
            .iter()
            .filter(|id| !live.contains(id))
            .cloned()
            .collect();
        DevicePlan {
            declared_at_pause: declared_total(&at_pause, &declared),
            announced,
            declared,
            live,
            in_parts,
            saved: None,
        }
    }

    /// Holds the sections saved at the pause after checking them against
    /// the header and the frame limit. Returns their encoded size.
    pub(crate) fn hold_saved(&mut self, mut sections: Vec<Section>) -> Result<u64, MigrationError> {
        check_saved(&mut sections, &self.announced, &self.declared)?;
        let encoded = encoded_len(&sections);
        if encoded > MAX_FRAME_LEN as usize && !self.in_parts {
            return Err(SectionError::TooLargeForOneFrame {
                bytes: encoded as u64,
                declared: !self.declared.is_empty(),
            }
            .into());
        }
        self.saved = Some(sections);
        Ok(encoded as u64)
    }

    /// The sections saved at the pause (none if none were), and the most
    /// bytes a frame of them may carry.
    pub(crate) fn take_saved(&mut self) -> (Vec<Section>, usize) {
        let part = match self.in_parts {
            true => PART_BYTES,
            false => usize::MAX,
        };
        (self.saved.take().unwrap_or_default(), part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> SectionId {
        SectionId {
            name: name.into(),
            instance: 0,
            version: 2,
        }
    }

    fn plan(declared: &[(&str, u64)], live: &[&str], in_parts: bool) -> DevicePlan {
        let announced = declared.iter().map(|(name, _)| id(name)).collect();
        let sizes = declared.iter().map(|(n, b)| (n.to_string(), *b)).collect();
        let live = live.iter().map(|name| id(name)).collect();
        DevicePlan::agreed(announced, sizes, live, in_parts)
    }

    fn section(name: &str, bytes: usize) -> Section {
        Section {
            id: SectionId {
                version: 0,
                ..id(name)
            },
            data: vec![7; bytes],
            subsections: Vec::new(),
        }
    }

    #[test]
    fn live_sections_do_not_count_toward_the_pause() {
        let plan = plan(&[("serial", 100), ("ram-log", 5_000)], &["ram-log"], false);
        assert_eq!(plan.declared_at_pause, 100);
    }

    #[test]
    fn a_saved_section_takes_its_announced_version() {
        let mut plan = plan(&[("serial", 100)], &[], false);
        plan.hold_saved(vec![section("serial", 10)]).unwrap();
        let (saved, part) = plan.take_saved();
        assert_eq!(saved[0].id.version, 2);
        assert_eq!(part, usize::MAX);
        assert!(plan.take_saved().0.is_empty(), "sent once");
    }

    #[test]
    fn more_than_a_frame_is_refused_unless_the_destination_takes_parts() {
        let big = MAX_FRAME_LEN as u64 + 1;
        let mut one_frame = plan(&[("blob", big)], &[], false);
        let err = one_frame
            .hold_saved(vec![section("blob", big as usize)])
            .unwrap_err();
        assert!(matches!(
            err,
            MigrationError::Section(SectionError::TooLargeForOneFrame { .. })
        ));
        let mut parts = plan(&[("blob", big)], &[], true);
        parts
            .hold_saved(vec![section("blob", big as usize)])
            .unwrap();
        assert_eq!(parts.take_saved().1, PART_BYTES);
    }

    #[test]
    fn a_section_larger_than_it_declared_is_refused() {
        let mut plan = plan(&[("serial", 16)], &[], false);
        let err = plan.hold_saved(vec![section("serial", 4096)]).unwrap_err();
        assert!(matches!(
            err,
            MigrationError::Section(SectionError::Outgrew { .. })
        ));
    }
}
