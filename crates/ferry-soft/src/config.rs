//! Mechanism switches: each seed mechanism next to its baseline.
//!
//! Every field parses from a short string (`eager`, `chunked:512:100`,
//! `on-fault`, `present`, `full`, `gen`, `walk`, `4k`, `2m`, `1g`) so the CLI
//! can expose them one flag each, and serializes into reports.

use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// When huge leaves are broken into 4 KiB leaves for dirty logging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum SplitMode {
    /// Eager splitting: all huge leaves are split when dirty logging starts.
    Eager,
    /// Eager splitting during clear-dirty-log: `chunk_pages` frames' worth of
    /// huge leaves per harvest step, sleeping `pace_us` between chunks.
    Chunked {
        /// Frames per chunk (a multiple of 512 splits whole 2 MiB leaves).
        chunk_pages: u64,
        /// Pause between chunks.
        pace_us: u64,
    },
    /// Baseline (arm64 before the series): a write fault breaks the huge leaf
    /// and maps only the faulting 4 KiB page; the other 511 stay unmapped.
    OnFault,
}

/// How zap, write-protect and split walk the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Iteration {
    /// Skip runs of non-present entries (the iterator seed).
    PresentOnly,
    /// Baseline: visit every entry of every table at every level.
    FullScan,
}

/// How all memory is write-protected for the next dirty-log round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteProtect {
    /// O(1): bump a generation; stale tables are protected lazily on next use.
    Generation,
    /// Baseline: walk every leaf and protect it.
    Walk,
}

/// Largest leaf the MMU maps when not dirty logging (the host backing's page size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeafSize {
    /// 4 KiB.
    #[serde(rename = "4k")]
    K4,
    /// 2 MiB.
    #[serde(rename = "2m")]
    M2,
    /// 1 GiB.
    #[serde(rename = "1g")]
    G1,
}

impl LeafSize {
    /// Page-table level of a leaf of this size.
    pub fn level(self) -> u8 {
        match self {
            LeafSize::K4 => 1,
            LeafSize::M2 => 2,
            LeafSize::G1 => 3,
        }
    }
}

/// The switch of every MMU mechanism.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mechanisms {
    /// Huge-page splitting for dirty logging.
    pub split: SplitMode,
    /// Table iteration.
    pub iteration: Iteration,
    /// Write-protect-all.
    pub write_protect: WriteProtect,
    /// Largest leaf size.
    pub leaf: LeafSize,
}

impl Default for Mechanisms {
    /// Every seed mechanism on, 2 MiB leaves.
    fn default() -> Self {
        Mechanisms {
            split: SplitMode::Eager,
            iteration: Iteration::PresentOnly,
            write_protect: WriteProtect::Generation,
            leaf: LeafSize::M2,
        }
    }
}

impl Mechanisms {
    /// Every mechanism replaced by its baseline.
    pub fn baseline() -> Self {
        Mechanisms {
            split: SplitMode::OnFault,
            iteration: Iteration::FullScan,
            write_protect: WriteProtect::Walk,
            leaf: LeafSize::M2,
        }
    }
}

/// A switch value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown {what} '{value}': expected {expected}")]
pub struct ParseError {
    what: &'static str,
    value: String,
    expected: &'static str,
}

fn err(what: &'static str, value: &str, expected: &'static str) -> ParseError {
    ParseError {
        what,
        value: value.to_string(),
        expected,
    }
}

impl FromStr for SplitMode {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        const EXPECTED: &str = "eager, on-fault or chunked:<pages>:<pace_us>";
        match s {
            "eager" => Ok(SplitMode::Eager),
            "on-fault" | "fault" => Ok(SplitMode::OnFault),
            _ => {
                let mut parts = s.split(':');
                match (parts.next(), parts.next(), parts.next(), parts.next()) {
                    (Some("chunked"), Some(c), Some(p), None) => Ok(SplitMode::Chunked {
                        chunk_pages: c.parse().map_err(|_| err("split mode", s, EXPECTED))?,
                        pace_us: p.parse().map_err(|_| err("split mode", s, EXPECTED))?,
                    }),
                    _ => Err(err("split mode", s, EXPECTED)),
                }
            }
        }
    }
}

impl FromStr for Iteration {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s {
            "present" | "present-only" => Ok(Iteration::PresentOnly),
            "full" | "full-scan" => Ok(Iteration::FullScan),
            _ => Err(err("iteration", s, "present or full")),
        }
    }
}

impl FromStr for WriteProtect {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s {
            "gen" | "generation" => Ok(WriteProtect::Generation),
            "walk" => Ok(WriteProtect::Walk),
            _ => Err(err("write-protect mode", s, "gen or walk")),
        }
    }
}

impl FromStr for LeafSize {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.to_ascii_lowercase().as_str() {
            "4k" => Ok(LeafSize::K4),
            "2m" => Ok(LeafSize::M2),
            "1g" => Ok(LeafSize::G1),
            _ => Err(err("leaf size", s, "4k, 2m or 1g")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_parse() {
        assert_eq!("eager".parse(), Ok(SplitMode::Eager));
        assert_eq!(
            "chunked:1024:50".parse(),
            Ok(SplitMode::Chunked {
                chunk_pages: 1024,
                pace_us: 50
            })
        );
        assert!("chunked:x:1".parse::<SplitMode>().is_err());
        assert_eq!("full".parse(), Ok(Iteration::FullScan));
        assert_eq!("walk".parse(), Ok(WriteProtect::Walk));
        assert_eq!("1G".parse(), Ok(LeafSize::G1));
        assert!("3m".parse::<LeafSize>().is_err());
    }

    #[test]
    fn mechanisms_round_trip_json() {
        let m = Mechanisms::baseline();
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Mechanisms>(&s).unwrap(), m);
    }
}
