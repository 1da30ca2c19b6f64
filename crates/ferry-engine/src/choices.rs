//! The engine's named choices, as plain enums: the convergence policy, the
//! mode, what a stall does, and the compression of page batches. The
//! options take them and the summaries report them (serialised by name, as
//! the CLI spells them; the control socket's requests deserialise them by
//! the same names, through their one `FromStr`), so
//! they sit below every floor: the tunables carry a policy request, and the
//! summary a mode, without depending on the policies or the modes
//! themselves. What each does is [`crate::converge`]'s, `crate::session`'s
//! and [`crate::wire::compress`]'s business.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A name that is none of a choice's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    /// `got` names none of `expected`.
    #[error("{what} {got:?}: expected one of {}", expected.join(", "))]
    Unknown {
        /// The setting, as the control socket names it (`converge`).
        what: &'static str,
        /// The name given.
        got: String,
        /// Every name the setting takes.
        expected: &'static [&'static str],
    },
}

impl ChoiceError {
    fn unknown(what: &'static str, got: &str, expected: &'static [&'static str]) -> Self {
        ChoiceError::Unknown {
            what,
            got: got.to_string(),
            expected,
        }
    }
}

/// Serialises a choice by its name (its `Display`), and deserialises it
/// from a name through its `FromStr`, whose error names the accepted ones.
macro_rules! serde_by_name {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
                name.parse().map_err(serde::de::Error::custom)
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

    /// Every mode's name, in the order of [`Self::ALL`].
    pub const NAMES: &'static [&'static str] = &["none", "auto", "quota", "dirty-limit"];

    /// The mode whose `as u8` is `i`.
    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(usize::from(i)).copied()
    }
}

impl std::str::FromStr for ConvergeMode {
    type Err = ChoiceError;
    fn from_str(s: &str) -> Result<Self, ChoiceError> {
        match s {
            "none" => Ok(ConvergeMode::None),
            "auto" => Ok(ConvergeMode::Auto),
            "quota" => Ok(ConvergeMode::Quota),
            "dirty-limit" => Ok(ConvergeMode::DirtyLimit),
            _ => Err(ChoiceError::unknown("converge", s, Self::NAMES)),
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
#[non_exhaustive]
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
    /// Every mode's name.
    pub const NAMES: &'static [&'static str] = &["precopy", "postcopy", "hybrid"];

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
    type Err = ChoiceError;
    /// `precopy`, `postcopy`, or `hybrid` (switching after the full pass;
    /// set `after_rounds` for more).
    fn from_str(s: &str) -> Result<Self, ChoiceError> {
        match s {
            "precopy" => Ok(Mode::Precopy),
            "postcopy" => Ok(Mode::Postcopy),
            "hybrid" => Ok(Mode::Hybrid {
                after_rounds: 1,
                on_stall: false,
            }),
            _ => Err(ChoiceError::unknown("mode", s, Self::NAMES)),
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
#[non_exhaustive]
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

impl Compression {
    /// Every choice's name.
    pub const NAMES: &'static [&'static str] = &["none", "lz4", "zstd", "auto"];
}

impl FromStr for Compression {
    type Err = ChoiceError;
    fn from_str(s: &str) -> Result<Self, ChoiceError> {
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Fixed(Codec::Lz4)),
            "zstd" => Ok(Compression::Fixed(Codec::Zstd)),
            "auto" => Ok(Compression::Auto),
            _ => Err(ChoiceError::unknown("compress", s, Self::NAMES)),
        }
    }
}

/// What a precopy stall (the bytes left stopped shrinking) does.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum OnStall {
    /// Engage the convergence policy, then raise the downtime target up to
    /// its highest.
    #[default]
    Escalate,
    /// Switch to postcopy at once (hybrid only), since precopy will not
    /// finish.
    Postcopy,
}

impl OnStall {
    /// Every choice, in the order of [`Self::NAMES`].
    pub const ALL: [OnStall; 2] = [OnStall::Escalate, OnStall::Postcopy];
    /// Every choice's name.
    pub const NAMES: &'static [&'static str] = &["escalate", "postcopy"];
}

impl fmt::Display for OnStall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnStall::Escalate => "escalate",
            OnStall::Postcopy => "postcopy",
        })
    }
}

impl FromStr for OnStall {
    type Err = ChoiceError;
    fn from_str(s: &str) -> Result<Self, ChoiceError> {
        match s {
            "escalate" => Ok(OnStall::Escalate),
            "postcopy" => Ok(OnStall::Postcopy),
            _ => Err(ChoiceError::unknown("on_stall", s, Self::NAMES)),
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

serde_by_name!(ConvergeMode, Mode, Compression, OnStall);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name parses, to a value whose `Display` (and JSON) is that
    /// name; an unknown name is refused, naming every accepted one.
    fn round_trip<T>(names: &[&str], what: &str)
    where
        T: FromStr<Err = ChoiceError> + fmt::Display + Serialize + for<'de> Deserialize<'de>,
    {
        for &name in names {
            let v: T = name.parse().unwrap();
            assert_eq!(v.to_string(), name);
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("{name:?}"));
            let back: T = serde_json::from_str(&json).unwrap();
            assert_eq!(back.to_string(), name);
        }
        let err = "teleport".parse::<T>().err().unwrap().to_string();
        assert_eq!(
            err,
            format!(r#"{what} "teleport": expected one of {}"#, names.join(", "))
        );
        let err = serde_json::from_str::<T>(r#""teleport""#).err().unwrap();
        assert!(err.to_string().contains(&names.join(", ")), "{err}");
    }

    #[test]
    fn every_choice_parses_its_names_and_refuses_others_naming_them() {
        round_trip::<ConvergeMode>(ConvergeMode::NAMES, "converge");
        round_trip::<Mode>(Mode::NAMES, "mode");
        round_trip::<Compression>(Compression::NAMES, "compress");
        round_trip::<OnStall>(OnStall::NAMES, "on_stall");
    }

    #[test]
    fn the_names_are_every_value_in_order() {
        let names = |v: &[String]| v.to_vec();
        assert_eq!(
            names(&ConvergeMode::ALL.map(|m| m.to_string())),
            ConvergeMode::NAMES
        );
        assert_eq!(names(&OnStall::ALL.map(|m| m.to_string())), OnStall::NAMES);
        let modes = [
            Mode::Precopy,
            Mode::Postcopy,
            Mode::Hybrid {
                after_rounds: 1,
                on_stall: false,
            },
        ];
        assert_eq!(names(&modes.map(|m| m.to_string())), Mode::NAMES);
        let compressions = [
            Compression::None,
            Compression::Fixed(Codec::Lz4),
            Compression::Fixed(Codec::Zstd),
            Compression::Auto,
        ];
        assert_eq!(
            names(&compressions.map(|c| c.to_string())),
            Compression::NAMES
        );
    }
}
