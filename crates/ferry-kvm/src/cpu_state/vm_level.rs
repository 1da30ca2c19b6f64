//! The state that belongs to the VM rather than to one vCPU: the kvmclock,
//! and the in-kernel interrupt controllers (PIC master and slave, IOAPIC) and
//! PIT where the VM has them. Saved and restored once per VM.
//!
//! Whether the VM has an in-kernel irqchip is part of the state: a VM without
//! one records `"none"`, and a destination built differently refuses the state
//! rather than run a guest whose interrupt controllers changed under it.

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_state2, KVM_CAP_ADJUST_CLOCK, KVM_CLOCK_REALTIME,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};
use vmm_sys_util::errno;

/// What went wrong with VM-level state.
#[derive(Debug, thiserror::Error)]
pub enum VmStateError {
    /// A VM ioctl failed.
    #[error("{0} failed")]
    Ioctl(&'static str, #[source] errno::Error),
    /// The state and this VM disagree on a device.
    #[error("the source VM {source_has}, this VM {this_has}")]
    Devices {
        /// What the source had.
        source_has: &'static str,
        /// What this VM has.
        this_has: &'static str,
    },
}

/// The devices a VM was built with.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct VmDevices {
    /// An in-kernel PIC, IOAPIC and LAPICs (`KVM_CREATE_IRQCHIP`).
    pub irqchip: bool,
    /// An in-kernel PIT (`KVM_CREATE_PIT2`).
    pub pit: bool,
    /// `KVM_GET_CLOCK`/`KVM_SET_CLOCK` work (`KVM_CAP_ADJUST_CLOCK`).
    pub clock: bool,
}

impl VmDevices {
    /// Whether `vm`'s KVM has a settable kvmclock, given what was created.
    pub fn new(vm: &VmFd, irqchip: bool, pit: bool) -> Self {
        VmDevices {
            irqchip,
            pit,
            clock: vm.check_extension_raw(u64::from(KVM_CAP_ADJUST_CLOCK)) > 0,
        }
    }
}

/// The in-kernel interrupt controllers, or their absence.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Irqchip {
    /// The VM had no in-kernel irqchip, so no LAPIC, PIC, IOAPIC or PIT state.
    None,
    /// The VM had one.
    InKernel(Box<Chips>),
}

/// `KVM_GET_IRQCHIP` for each in-kernel chip.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Chips {
    /// PIC master.
    pub pic_master: kvm_irqchip,
    /// PIC slave.
    pub pic_slave: kvm_irqchip,
    /// IOAPIC.
    pub ioapic: kvm_irqchip,
}

/// The VM-level state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmSnapshot {
    /// The interrupt controllers.
    pub irqchip: Irqchip,
    /// The PIT, where the VM had one.
    pub pit: Option<kvm_pit_state2>,
    /// The kvmclock, where the host's KVM can set it. Its `realtime` is
    /// the host's wall-clock time at the reading: KVM's, with
    /// `KVM_CLOCK_REALTIME` in its flags, or else the save's own stamp
    /// ([`stamped`]), or 0 where neither is known.
    pub clock: Option<kvm_clock_data>,
}

/// Reads the VM-level state of a paused VM.
pub fn save(vm: &VmFd, devices: VmDevices) -> Result<VmSnapshot, VmStateError> {
    let chip = |chip_id, name| {
        let mut chip = kvm_irqchip {
            chip_id,
            ..Default::default()
        };
        vm.get_irqchip(&mut chip)
            .map(|()| chip)
            .map_err(|e| VmStateError::Ioctl(name, e))
    };
    let irqchip = if devices.irqchip {
        Irqchip::InKernel(Box::new(Chips {
            pic_master: chip(KVM_IRQCHIP_PIC_MASTER, "KVM_GET_IRQCHIP(PIC master)")?,
            pic_slave: chip(KVM_IRQCHIP_PIC_SLAVE, "KVM_GET_IRQCHIP(PIC slave)")?,
            ioapic: chip(KVM_IRQCHIP_IOAPIC, "KVM_GET_IRQCHIP(IOAPIC)")?,
        }))
    } else {
        Irqchip::None
    };
    let pit = match devices.pit {
        true => Some(
            vm.get_pit2()
                .map_err(|e| VmStateError::Ioctl("KVM_GET_PIT2", e))?,
        ),
        false => None,
    };
    let clock = match devices.clock {
        true => Some(stamped(
            vm.get_clock()
                .map_err(|e| VmStateError::Ioctl("KVM_GET_CLOCK", e))?,
        )),
        false => None,
    };
    Ok(VmSnapshot {
        irqchip,
        pit,
        clock,
    })
}

/// `clock` with the host's wall-clock time at its reading in `realtime`,
/// where KVM did not pair the two (`KVM_CLOCK_REALTIME`), so that the
/// restore can move the clock on by the time between.
///
/// KVM pairs them only where the host's clocksource is the TSC. Where it is
/// not (a host that found its CPUs' TSCs unsynchronized, such as the SVM
/// host with two outer vCPUs, which runs on HPET), a guest restored from
/// the bare kvmclock lost the time from the save to the restore: 6-20 ms a
/// move there (docs/svm-host-runs.md, 2026-12-07, midday). Taken
/// microseconds after the ioctl, the stamp is what KVM would have paired.
/// The flag stays clear: a KVM before 5.16 refuses any flag in
/// `KVM_SET_CLOCK`, and older ferry destinations pass the flag on. KVM
/// leaves `realtime` 0 where it does not pair, so a stamp is told apart by
/// the flag clear and `realtime` set; older destinations ignore it, and
/// the state's layout (JSON or bincode) is unchanged.
fn stamped(clock: kvm_clock_data) -> kvm_clock_data {
    match clock.flags & KVM_CLOCK_REALTIME {
        0 => kvm_clock_data {
            realtime: realtime_ns().unwrap_or(0),
            ..clock
        },
        _ => clock,
    }
}

/// The host's wall-clock time (`CLOCK_REALTIME`) in nanoseconds, the clock
/// `KVM_CLOCK_REALTIME` pairs the kvmclock with; none before the epoch.
fn realtime_ns() -> Option<u64> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_nanos() as u64)
}

/// What to give `KVM_SET_CLOCK` for `saved`: the kvmclock moved on by the
/// wall-clock time since its reading, where that is known ([`stamped`]),
/// never back. A KVM that `takes_realtime` (5.16 on) moves it itself; an
/// older one is given it moved on at `now`.
fn clock_to_set(saved: &kvm_clock_data, takes_realtime: bool, now: Option<u64>) -> kvm_clock_data {
    let read_at = match (saved.flags & KVM_CLOCK_REALTIME, saved.realtime) {
        (0, 0) => None,
        (_, at) => Some(at),
    };
    let bare = kvm_clock_data {
        clock: saved.clock,
        ..Default::default()
    };
    match (read_at, now) {
        (Some(at), _) if takes_realtime => kvm_clock_data {
            flags: KVM_CLOCK_REALTIME,
            realtime: at,
            ..bare
        },
        (Some(at), Some(now)) => kvm_clock_data {
            clock: saved.clock + now.saturating_sub(at),
            ..bare
        },
        _ => bare,
    }
}

/// Checks that `snap` was saved from a VM with the same devices as this one.
pub fn check_fits(snap: &VmSnapshot, devices: VmDevices) -> Result<(), VmStateError> {
    let has = |yes: bool, what: [&'static str; 2]| if yes { what[0] } else { what[1] };
    let irqchip = ["had an in-kernel irqchip", "had no in-kernel irqchip"];
    let src_irqchip = matches!(snap.irqchip, Irqchip::InKernel(_));
    if src_irqchip != devices.irqchip {
        return Err(VmStateError::Devices {
            source_has: has(src_irqchip, irqchip),
            this_has: has(devices.irqchip, ["has one", "has none"]),
        });
    }
    if snap.pit.is_some() != devices.pit {
        return Err(VmStateError::Devices {
            source_has: has(
                snap.pit.is_some(),
                ["had an in-kernel PIT", "had no in-kernel PIT"],
            ),
            this_has: has(devices.pit, ["has one", "has none"]),
        });
    }
    if snap.clock.is_some() && !devices.clock {
        return Err(VmStateError::Devices {
            source_has: "saved its kvmclock",
            this_has: "cannot set one (no KVM_CAP_ADJUST_CLOCK)",
        });
    }
    Ok(())
}

/// Loads `snap` into a paused VM (checked with [`check_fits`]).
pub fn restore(vm: &VmFd, snap: &VmSnapshot) -> Result<(), VmStateError> {
    if let Irqchip::InKernel(chips) = &snap.irqchip {
        let set = [
            (&chips.pic_master, "KVM_SET_IRQCHIP(PIC master)"),
            (&chips.pic_slave, "KVM_SET_IRQCHIP(PIC slave)"),
            (&chips.ioapic, "KVM_SET_IRQCHIP(IOAPIC)"),
        ];
        for (chip, name) in set {
            vm.set_irqchip(chip)
                .map_err(|e| VmStateError::Ioctl(name, e))?;
        }
    }
    if let Some(pit) = &snap.pit {
        vm.set_pit2(pit)
            .map_err(|e| VmStateError::Ioctl("KVM_SET_PIT2", e))?;
    }
    if let Some(clock) = &snap.clock {
        // The capability names the flags KVM_SET_CLOCK takes (5.16 on).
        let flags = vm.check_extension_raw(u64::from(KVM_CAP_ADJUST_CLOCK));
        let takes_realtime = flags > 0 && flags as u32 & KVM_CLOCK_REALTIME != 0;
        let clock = clock_to_set(clock, takes_realtime, realtime_ns());
        vm.set_clock(&clock)
            .map_err(|e| VmStateError::Ioctl("KVM_SET_CLOCK", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn reading(clock: u64, paired_at: Option<u64>) -> kvm_clock_data {
        kvm_clock_data {
            clock,
            flags: paired_at.map_or(0, |_| KVM_CLOCK_REALTIME),
            realtime: paired_at.unwrap_or(0),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_clock_kvm_did_not_pair_is_stamped_and_its_flag_stays_clear() {
        let before = realtime_ns().unwrap();
        let bare = stamped(reading(5, None));
        assert!((before..=realtime_ns().unwrap()).contains(&bare.realtime));
        assert_eq!((bare.clock, bare.flags), (5, 0));
        let paired = stamped(reading(5, Some(7)));
        assert_eq!((paired.realtime, paired.flags), (7, KVM_CLOCK_REALTIME));
    }

    #[test]
    fn the_clock_set_moves_on_by_the_wall_clock_since_its_reading() {
        let ms = 1_000_000;
        let stamp_only = kvm_clock_data {
            realtime: 100,
            ..reading(5, None)
        };
        // A KVM from 5.16 on is given the pair, KVM's or the stamp.
        for saved in [reading(5, Some(100)), stamp_only] {
            let set = clock_to_set(&saved, true, Some(100 + 30 * ms));
            assert_eq!(
                (set.clock, set.flags, set.realtime),
                (5, KVM_CLOCK_REALTIME, 100)
            );
            // An older one takes no flag: it is given the clock moved on.
            let set = clock_to_set(&saved, false, Some(100 + 30 * ms));
            assert_eq!((set.clock, set.flags), (5 + 30 * ms, 0));
        }
        // Never back, and as saved where the reading's time is unknown.
        let set = clock_to_set(&stamp_only, false, Some(50));
        assert_eq!((set.clock, set.flags), (5, 0));
        let set = clock_to_set(&reading(5, None), true, Some(50));
        assert_eq!((set.clock, set.flags), (5, 0));
    }

    /// A kvmclock saved, held 200 ms and restored into another VM has moved
    /// on by those 200 ms (and not by years): the guest's clock keeps the
    /// host's time across a move, both as `save` read it (paired by this
    /// host's KVM, or stamped) and from the bare kvmclock stamped anew, as
    /// on a host whose KVM does not pair them.
    #[test]
    fn a_restored_kvmclock_moves_on_by_the_time_since_its_save() {
        if !crate::host::require_kvm("a_restored_kvmclock_moves_on_by_the_time_since_its_save") {
            return;
        }
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let source = kvm.create_vm().unwrap();
        let devices = VmDevices::new(&source, false, false);
        if !devices.clock {
            ferry_vm::skip!("SKIP a_restored_kvmclock_moves_on: no KVM_CAP_ADJUST_CLOCK here");
            return;
        }
        let held = Duration::from_millis(200);
        for as_saved in [true, false] {
            let mut snap = save(&source, devices).unwrap();
            let saved = snap.clock.unwrap().clock;
            if !as_saved {
                snap.clock = Some(stamped(reading(saved, None)));
            }
            std::thread::sleep(held);
            let dest = kvm.create_vm().unwrap();
            restore(&dest, &snap).unwrap();
            let now = dest.get_clock().unwrap().clock;
            let moved = Duration::from_nanos(now.saturating_sub(saved));
            assert!(
                moved >= held && moved < held + Duration::from_secs(10),
                "as saved {as_saved}: saved {saved} ns, restored {now} ns, held {held:?}"
            );
        }
    }
}
