//! The destination's intake of device state: live chunks during the rounds
//! (only where `live-sections` was agreed), and the sections at the pause,
//! in one frame or in parts. Everything that arrives counts toward one
//! limit ([`crate::ReceiveOptions::max_device_bytes`]), so a source cannot
//! grow the destination's memory past it by splitting its state across
//! frame kinds.

use crate::error::MigrationError;
use crate::wire::{FrameKind, SectionError};

/// The device state a destination has taken so far.
#[derive(Debug)]
pub(crate) struct DeviceIntake {
    /// The most device state this destination takes.
    limit: u64,
    /// Whether live device state was agreed (capability `live-sections`):
    /// a LiveSection frame without it is a protocol error.
    live_agreed: bool,
    /// Live device state taken so far.
    live_bytes: u64,
    /// The sections' parts so far (capability `section-parts`).
    parts: Vec<u8>,
    /// The whole Sections payload, until the switchover loads it.
    sections: Option<Vec<u8>>,
}

impl DeviceIntake {
    /// An intake that takes at most `limit` bytes, with no live state
    /// agreed yet.
    pub(crate) fn new(limit: u64) -> Self {
        DeviceIntake {
            limit,
            live_agreed: false,
            live_bytes: 0,
            parts: Vec::new(),
            sections: None,
        }
    }

    /// Records whether the handshake agreed live device state.
    pub(crate) fn agree_live(&mut self, agreed: bool) {
        self.live_agreed = agreed;
    }

    /// Counts a LiveSection frame of `len` bytes (at `offset` in the
    /// stream) before it is loaded.
    pub(crate) fn take_live(&mut self, len: usize, offset: u64) -> Result<(), MigrationError> {
        if !self.live_agreed {
            return Err(MigrationError::Protocol {
                expected: "no live device state (live-sections was not agreed)",
                got: FrameKind::LiveSection,
                offset,
            });
        }
        self.live_bytes += len as u64;
        self.within_limit(0)
    }

    /// Takes a Sections frame (`last`) or a SectionsPart. The first part
    /// reserves `expected()` bytes (at most the limit): growing would copy
    /// large state again at every doubling.
    pub(crate) fn take_sections(
        &mut self,
        payload: Vec<u8>,
        last: bool,
        expected: impl FnOnce() -> u64,
    ) -> Result<(), MigrationError> {
        self.within_limit(payload.len() as u64)?;
        if self.parts.is_empty() && last {
            self.sections = Some(payload);
            return Ok(());
        }
        if self.parts.is_empty() {
            let want = expected().min(self.limit) as usize;
            self.parts.reserve(want.max(payload.len()));
        }
        self.parts.extend_from_slice(&payload);
        if last {
            self.sections = Some(std::mem::take(&mut self.parts));
        }
        Ok(())
    }

    /// The whole Sections payload, once its last frame came.
    pub(crate) fn sections(&mut self) -> Option<Vec<u8>> {
        self.sections.take()
    }

    /// Whether `more` bytes still fit with what came before.
    fn within_limit(&self, more: u64) -> Result<(), MigrationError> {
        if self.live_bytes + self.parts.len() as u64 + more > self.limit {
            return Err(SectionError::ArrivedOverLimit { limit: self.limit }.into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn over_limit(r: Result<(), MigrationError>) -> bool {
        matches!(
            r,
            Err(MigrationError::Section(
                SectionError::ArrivedOverLimit { .. }
            ))
        )
    }

    #[test]
    fn live_state_that_was_not_agreed_is_a_protocol_error() {
        let mut d = DeviceIntake::new(1 << 20);
        let err = d.take_live(10, 77).unwrap_err();
        assert!(matches!(err, MigrationError::Protocol { offset: 77, .. }));
        d.agree_live(true);
        d.take_live(10, 78).unwrap();
    }

    #[test]
    fn one_sections_frame_is_taken_whole() {
        let mut d = DeviceIntake::new(100);
        d.take_sections(vec![1; 100], true, || unreachable!())
            .unwrap();
        assert_eq!(d.sections(), Some(vec![1; 100]));
        assert_eq!(d.sections(), None, "loaded once");
    }

    #[test]
    fn parts_are_joined_in_order() {
        let mut d = DeviceIntake::new(100);
        d.take_sections(vec![1; 10], false, || 30).unwrap();
        assert_eq!(d.sections(), None, "not whole yet");
        d.take_sections(vec![2; 10], false, || unreachable!())
            .unwrap();
        d.take_sections(vec![3; 5], true, || unreachable!())
            .unwrap();
        let whole = d.sections().unwrap();
        assert_eq!(whole.len(), 25);
        assert_eq!((whole[0], whole[10], whole[24]), (1, 2, 3));
    }

    #[test]
    fn live_state_and_parts_count_toward_one_limit() {
        let mut d = DeviceIntake::new(100);
        d.agree_live(true);
        d.take_live(60, 0).unwrap();
        d.take_sections(vec![0; 30], false, || 1 << 40).unwrap();
        // 60 live + 30 in parts + 11 more is past 100.
        assert!(over_limit(d.take_sections(vec![0; 11], true, || 0)));
        assert!(over_limit(d.take_live(11, 0)));
    }

    #[test]
    fn a_single_frame_past_the_limit_is_refused() {
        let mut d = DeviceIntake::new(100);
        assert!(over_limit(d.take_sections(vec![0; 101], true, || 0)));
    }
}
