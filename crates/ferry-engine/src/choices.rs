//! The engine's named choices, as plain enums: the convergence policy, the
//! mode, and the compression of page batches. The options take them and the
//! summaries report them (serialised by name, as the CLI spells them), so
//! they sit below every floor: the tunables carry a policy request, and the
//! summary a mode, without depending on the policies or the modes
//! themselves. What each does is [`crate::converge`]'s, `crate::session`'s
//! and [`crate::wire::compress`]'s business.

use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Serialises a choice by its name (its `Display`).
macro_rules! serialize_by_name {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    )*};
}

/// Which convergence policy the source runs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum ConvergeMode {
    /// Never slow the guest; a stall can still raise the downtime target.
    None,
    /// QEMU's auto-converge: every vCPU sleeps a growing share of its time.
    #[default]
    Auto,
    /// The seed's per-vCPU dirty quota: only writers are slowed.
    Quota,
    /// QEMU 8.1's dirty-limit: each writer's throttle follows its rate.
    DirtyLimit,
}

impl ConvergeMode {
    /// Every mode, in the order of their `as u8` values.
    pub const ALL: [ConvergeMode; 4] = [
        ConvergeMode::None,
        ConvergeMode::Auto,
        ConvergeMode::Quota,
        ConvergeMode::DirtyLimit,
    ];

    /// The mode whose `as u8` is `i`.
    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(usize::from(i)).copied()
    }
}

impl std::str::FromStr for ConvergeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(ConvergeMode::None),
            "auto" => Ok(ConvergeMode::Auto),
            "quota" => Ok(ConvergeMode::Quota),
            "dirty-limit" => Ok(ConvergeMode::DirtyLimit),
            _ => Err(format!(
                "unknown convergence policy {s:?} (none, auto, quota, dirty-limit)"
            )),
        }
    }
}

impl fmt::Display for ConvergeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConvergeMode::None => "none",
            ConvergeMode::Auto => "auto",
            ConvergeMode::Quota => "quota",
            ConvergeMode::DirtyLimit => "dirty-limit",
        })
    }
}

/// How a migration moves memory.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Rounds while the guest runs, then stop-and-copy.
    #[default]
    Precopy,
    /// Switch over at once; every page is fetched on demand or pushed.
    Postcopy,
    /// Precopy for `after_rounds` rounds (the full pass is the first),
    /// or until precopy stalls if `on_stall`, then postcopy, unless
    /// precopy converged first.
    Hybrid {
        /// Precopy rounds before the switch, at least 1.
        after_rounds: u32,
        /// Switch as soon as the stall detector says precopy will not
        /// finish (the remaining bytes stopped shrinking), instead of
        /// escalating.
        on_stall: bool,
    },
}

impl Mode {
    /// The name used in summaries and on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Precopy => "precopy",
            Mode::Postcopy => "postcopy",
            Mode::Hybrid { .. } => "hybrid",
        }
    }

    /// Whether the migration may switch to postcopy (and so opens the
    /// priority connection).
    pub fn may_postcopy(&self) -> bool {
        *self != Mode::Precopy
    }

    /// Whether precopy hands over to postcopy after `rounds` rounds.
    pub fn switch_after(&self, rounds: u32) -> bool {
        match self {
            Mode::Precopy => false,
            Mode::Postcopy => true,
            Mode::Hybrid { after_rounds, .. } => rounds >= (*after_rounds).max(1),
        }
    }

    /// Whether a precopy stall switches to postcopy.
    pub fn switch_on_stall(&self) -> bool {
        matches!(self, Mode::Hybrid { on_stall: true, .. })
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    /// `precopy`, `postcopy`, or `hybrid` (switching after the full pass;
    /// set `after_rounds` for more).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "precopy" => Ok(Mode::Precopy),
            "postcopy" => Ok(Mode::Postcopy),
            "hybrid" => Ok(Mode::Hybrid {
                after_rounds: 1,
                on_stall: false,
            }),
            _ => Err(format!(
                "unknown mode '{s}': expected precopy, postcopy or hybrid"
            )),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the user asked for.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Never compress.
    #[default]
    None,
    /// Always try this codec (a batch that does not shrink goes raw).
    Fixed(Codec),
    /// Compress while it pays (see the module docs).
    Auto,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Fixed(c) => c.name(),
            Compression::Auto => "auto",
        })
    }
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Fixed(Codec::Lz4)),
            "zstd" => Ok(Compression::Fixed(Codec::Zstd)),
            "auto" => Ok(Compression::Auto),
            _ => Err(format!("unknown compression {s:?} (none, lz4, zstd, auto)")),
        }
    }
}

/// A compression method for page batches.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Codec {
    /// lz4: fast, about half the ratio of zstd.
    Lz4,
    /// zstd at level 1.
    Zstd,
}

impl Codec {
    /// Its name, as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

serialize_by_name!(ConvergeMode, Mode, Compression);
