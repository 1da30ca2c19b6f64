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
    /// The kvmclock, where the host's KVM can set it.
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
        true => Some(with_realtime(
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

/// `clock` with the host's wall-clock time at its reading, so that the
/// restore moves it on by the time between (`KVM_CLOCK_REALTIME`).
///
/// KVM pairs the two itself only where the host's clocksource is the TSC.
/// Where it is not (a host that found its CPUs' TSCs unsynchronized, such as
/// the SVM host with two outer vCPUs, which runs on HPET), the kvmclock came
/// back without the pair, and a guest restored from it lost the time from
/// the save to the restore: 6-20 ms a move there (docs/svm-host-runs.md,
/// 2026-12-07, midday). Stamped here, microseconds after the ioctl, it is
/// what KVM would have paired. `KVM_SET_CLOCK` honours the flag on any
/// host: it reads the wall clock, not the TSC.
fn with_realtime(mut clock: kvm_clock_data) -> kvm_clock_data {
    if clock.flags & KVM_CLOCK_REALTIME == 0 {
        clock.realtime = realtime_ns();
        clock.flags |= KVM_CLOCK_REALTIME;
    }
    clock
}

/// The host's wall-clock time (`CLOCK_REALTIME`) in nanoseconds, the clock
/// `KVM_CLOCK_REALTIME` pairs the kvmclock with.
fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
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
        // Only REALTIME means anything to KVM_SET_CLOCK: with it, KVM moves
        // the clock on by the wall-clock time since the save (the downtime).
        let clock = kvm_clock_data {
            flags: clock.flags & KVM_CLOCK_REALTIME,
            ..*clock
        };
        vm.set_clock(&clock)
            .map_err(|e| VmStateError::Ioctl("KVM_SET_CLOCK", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_clock_read_without_the_wall_clock_is_stamped_with_it_and_one_with_it_is_kept() {
        let before = realtime_ns();
        let bare = with_realtime(kvm_clock_data {
            clock: 5,
            ..Default::default()
        });
        assert_eq!(bare.flags & KVM_CLOCK_REALTIME, KVM_CLOCK_REALTIME);
        assert!((before..=realtime_ns()).contains(&bare.realtime));
        assert_eq!(bare.clock, 5);
        let paired = kvm_clock_data {
            clock: 5,
            flags: KVM_CLOCK_REALTIME,
            realtime: 7,
            ..Default::default()
        };
        assert_eq!(with_realtime(paired).realtime, 7);
    }

    /// A kvmclock saved, held 200 ms and restored into another VM has moved
    /// on by at least those 200 ms: the guest's clock keeps the host's
    /// time across a move, both as `save` read it (paired by this host's
    /// KVM, or stamped) and stamped anew from the bare kvmclock, as on a
    /// host whose KVM does not pair them.
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
            if !as_saved {
                let unpaired = kvm_clock_data {
                    clock: snap.clock.unwrap().clock,
                    ..Default::default()
                };
                snap.clock = Some(with_realtime(unpaired));
            }
            let saved = snap.clock.unwrap().clock;
            std::thread::sleep(held);
            let dest = kvm.create_vm().unwrap();
            restore(&dest, &snap).unwrap();
            let now = dest.get_clock().unwrap().clock;
            assert!(
                now >= saved + held.as_nanos() as u64,
                "as saved {as_saved}: saved {saved} ns, restored {now} ns, held {held:?}"
            );
        }
    }
}
