//! The names of the convergence policies: what an operator, the stream of
//! live requests ([`crate::Tunables::request_policy`]) and the summary call
//! them. Apart from [`crate::converge`], so that the tunables can carry a
//! request without depending on the policies themselves.

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

impl std::fmt::Display for ConvergeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConvergeMode::None => "none",
            ConvergeMode::Auto => "auto",
            ConvergeMode::Quota => "quota",
            ConvergeMode::DirtyLimit => "dirty-limit",
        })
    }
}
