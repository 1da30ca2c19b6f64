//! A migration's settings as the faces that start one take them, and the
//! one mapping from them to [`PrecopyOptions`]. The CLI's flags, the
//! control socket's and QMP's `migrate`, minivmm's flags and the
//! experiments each fill a [`MigrationSettings`] with what they take, and
//! [`MigrationSettings::options`] builds the options: every field is set
//! the same way for every face, so a face cannot forget one (as all but the
//! CLI once forgot `harvest_within_rounds`), and every refusal comes from
//! the same checks ([`Mode::switching`], [`TunableChange::validate`],
//! [`PrecopyOptions::validate`]) in the same words.

use super::options::{Mode, PrecopyOptions};
use crate::choices::Compression;
use crate::choices::ConvergeMode;
use crate::choices::OnStall;
use crate::error::OptionsError;
use crate::tunables::{TunableChange, Tunables};
use ferry_vm::GuestProbe;
use std::sync::Arc;
use std::time::Duration;

/// What a face asks of a migration; a field it does not take keeps its
/// default, which is the engine's.
#[derive(Clone, Debug, Default)]
pub struct MigrationSettings {
    /// Changes to the live tunables (downtime target, round cap, bandwidth
    /// cap, policy interval), applied to the tunables the migration runs on.
    pub tunables: TunableChange,
    /// Have the destination verify the digest before it resumes the guest.
    pub verify_before_resume: bool,
    /// Data connections (default 1).
    pub connections: Option<usize>,
    /// Seconds the link may stand still (default
    /// [`super::DEFAULT_STALL_TIMEOUT`]).
    pub stall_timeout_s: Option<u64>,
    /// Compression of page batches (default none).
    pub compression: Compression,
    /// Bytes of last-sent pages kept to re-send pages as deltas (0: off).
    pub delta_cache_bytes: u64,
    /// Harvest the dirty log within rounds
    /// ([`PrecopyOptions::harvest_within_rounds`]).
    pub harvest_within_rounds: bool,
    /// What slows the guest when precopy does not converge (default: the
    /// best the VM serves).
    pub converge: Option<ConvergeMode>,
    /// Highest downtime target a stall may raise the target to, in ms.
    pub max_downtime_ms: Option<u64>,
    /// Cancel the migration if it has not switched over after this many
    /// seconds.
    pub give_up_after_s: Option<u64>,
    /// The mode named (default precopy; see `postcopy_ram`).
    pub mode: Option<Mode>,
    /// Hybrid: precopy rounds before postcopy.
    pub postcopy_after_rounds: Option<u32>,
    /// What a stall does; [`OnStall::Postcopy`] (hybrid only) switches to
    /// postcopy.
    pub on_stall: OnStall,
    /// QMP's `postcopy-ram` capability: a mode not named is a hybrid that
    /// switches when asked (`migrate-start-postcopy`), after
    /// `postcopy_after_rounds` if given, or on a stall with
    /// [`OnStall::Postcopy`], as QEMU's precopy with postcopy-ram does.
    pub postcopy_ram: bool,
    /// Postcopy: seconds to keep reconnecting after the connections break
    /// (default [`super::DEFAULT_RECOVER_TIMEOUT`]).
    pub recover_timeout_s: Option<u64>,
}

impl MigrationSettings {
    /// The engine's options these settings ask for, on `tunables` (with
    /// the settings' changes applied: a control socket passes the VM's own,
    /// so that its `set` reaches the migration) and with the guest's own
    /// checks from `probe`, checked before anything starts.
    pub fn options(
        &self,
        tunables: Arc<Tunables>,
        probe: Option<Arc<dyn GuestProbe>>,
    ) -> Result<PrecopyOptions, OptionsError> {
        let on_stall_postcopy = self.on_stall == OnStall::Postcopy;
        let mode = match self.mode {
            None if self.postcopy_ram => Mode::Hybrid {
                after_rounds: self.postcopy_after_rounds.unwrap_or(u32::MAX).max(1),
                on_stall: on_stall_postcopy,
            },
            mode => mode
                .unwrap_or(Mode::Precopy)
                .switching(self.postcopy_after_rounds, on_stall_postcopy)?,
        };
        tunables.apply(&self.tunables)?;
        let mut o = PrecopyOptions::default();
        o.tunables = tunables;
        o.verify_before_resume = self.verify_before_resume;
        o.connections = self.connections.unwrap_or(o.connections);
        o.stall_timeout = self
            .stall_timeout_s
            .map_or(o.stall_timeout, Duration::from_secs);
        o.compression = self.compression;
        o.delta_cache_bytes = self.delta_cache_bytes;
        o.harvest_within_rounds = self.harvest_within_rounds;
        o.converge = self.converge;
        o.max_downtime = self.max_downtime_ms.map(Duration::from_millis);
        o.give_up_after = self.give_up_after_s.map(Duration::from_secs);
        o.mode = mode;
        o.recover_timeout = self
            .recover_timeout_s
            .map_or(o.recover_timeout, Duration::from_secs);
        o.probe = probe;
        o.validate()?;
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(s: &MigrationSettings) -> Result<PrecopyOptions, OptionsError> {
        s.options(Tunables::shared(), None)
    }

    #[test]
    fn no_settings_are_the_engine_defaults() {
        let o = options(&MigrationSettings::default()).unwrap();
        let d = PrecopyOptions::default();
        assert_eq!(format!("{o:?}"), format!("{d:?}"));
    }

    #[test]
    fn every_setting_reaches_its_option() {
        let s = MigrationSettings {
            tunables: TunableChange {
                downtime_ms: Some(50),
                ..TunableChange::default()
            },
            verify_before_resume: true,
            connections: Some(4),
            stall_timeout_s: Some(7),
            compression: Compression::Auto,
            delta_cache_bytes: 1 << 20,
            harvest_within_rounds: true,
            converge: Some(ConvergeMode::Auto),
            max_downtime_ms: Some(900),
            give_up_after_s: Some(30),
            mode: None,
            postcopy_after_rounds: None,
            on_stall: OnStall::Escalate,
            postcopy_ram: false,
            recover_timeout_s: Some(5),
        };
        let o = options(&s).unwrap();
        assert_eq!(o.tunables.downtime_target(), Duration::from_millis(50));
        assert!(o.verify_before_resume && o.harvest_within_rounds);
        assert_eq!(o.connections, 4);
        assert_eq!(o.stall_timeout, Duration::from_secs(7));
        assert_eq!(o.compression, Compression::Auto);
        assert_eq!(o.delta_cache_bytes, 1 << 20);
        assert_eq!(o.converge, Some(ConvergeMode::Auto));
        assert_eq!(o.max_downtime, Some(Duration::from_millis(900)));
        assert_eq!(o.give_up_after, Some(Duration::from_secs(30)));
        assert_eq!(o.mode, Mode::Precopy);
        assert_eq!(o.recover_timeout, Duration::from_secs(5));
    }

    #[test]
    fn the_mode_switches_as_asked_and_postcopy_ram_waits_to_be_asked() {
        let hybrid = |s: MigrationSettings| options(&s).map(|o| o.mode);
        let named = MigrationSettings {
            mode: Some(Mode::Hybrid {
                after_rounds: 1,
                on_stall: false,
            }),
            on_stall: OnStall::Postcopy,
            ..MigrationSettings::default()
        };
        assert_eq!(
            hybrid(named).unwrap(),
            Mode::Hybrid {
                after_rounds: u32::MAX,
                on_stall: true
            }
        );
        let ram = MigrationSettings {
            postcopy_ram: true,
            ..MigrationSettings::default()
        };
        assert_eq!(
            hybrid(ram).unwrap(),
            Mode::Hybrid {
                after_rounds: u32::MAX,
                on_stall: false
            }
        );
        // A switch asked of a mode that never switches is refused.
        let precopy = MigrationSettings {
            mode: Some(Mode::Precopy),
            postcopy_after_rounds: Some(2),
            ..MigrationSettings::default()
        };
        assert!(hybrid(precopy).is_err());
    }

    #[test]
    fn bad_settings_are_refused_by_the_engines_checks() {
        let too_many = MigrationSettings {
            connections: Some(super::super::MAX_CONNECTIONS + 1),
            ..MigrationSettings::default()
        };
        assert!(options(&too_many).is_err());
        let no_downtime = MigrationSettings {
            tunables: TunableChange {
                downtime_ms: Some(0),
                ..TunableChange::default()
            },
            ..MigrationSettings::default()
        };
        assert!(options(&no_downtime).is_err());
    }
}
