//! Settings that cannot be: the one message for each rule of the options
//! ([`crate::precopy::PrecopyOptions::validate`],
//! [`crate::precopy::ReceiveOptions::validate`], [`crate::Mode::switching`])
//! and of the live tunables ([`crate::tunables::TunableChange`]). The CLI's
//! flags, the control socket's requests and QMP's parameters all map onto
//! those options, so they all refuse a bad value with these words.

use std::ops::RangeInclusive;
use thiserror::Error;

/// A setting out of its range, or two that cannot go together.
#[non_exhaustive]
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum OptionsError {
    /// A number outside what the engine accepts.
    #[error("{name} must be {} to {}{unit}, not {value}", .range.start(), .range.end())]
    OutOfRange {
        /// The setting, as the engine names it (`connections`, `stall timeout`).
        name: &'static str,
        /// What was asked for.
        value: u64,
        /// What is accepted.
        range: RangeInclusive<u64>,
        /// The unit after the range (` s`, ` ms`, or nothing).
        unit: &'static str,
    },
    /// A switch to postcopy was asked of a mode that never switches.
    #[error("{what} needs the hybrid mode (precopy that may switch to postcopy), not {mode}")]
    SwitchNeedsHybrid {
        /// The setting (`on-stall postcopy`, `postcopy-after-rounds`).
        what: &'static str,
        /// The mode asked for.
        mode: &'static str,
    },
    /// Delta re-sends with a mode that may switch to postcopy.
    #[error(
        "delta re-sends cannot be used with a {mode} migration: a delta re-sends a page \
         against a copy that postcopy drops"
    )]
    DeltaWithPostcopy {
        /// The mode asked for.
        mode: &'static str,
    },
}

impl OptionsError {
    /// Checks `value` against `range`.
    pub(crate) fn check(
        name: &'static str,
        value: u64,
        range: RangeInclusive<u64>,
        unit: &'static str,
    ) -> Result<(), OptionsError> {
        if range.contains(&value) {
            Ok(())
        } else {
            Err(OptionsError::OutOfRange {
                name,
                value,
                range,
                unit,
            })
        }
    }
}
