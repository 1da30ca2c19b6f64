//! `minivmm probe-host`: what this host's KVM offers for serving devices
//! off the vCPU threads (an in-kernel irqchip, `ioeventfd`, `irqfd`), tried
//! on a fresh VM rather than only read from the capability list: a nested
//! or paravirtual KVM (this project's `kvm_pvm`) may list an ioctl and
//! still refuse it.

use clap::Args;
use kvm_ioctls::{Cap, IoEventAddress, Kvm, NoDatamatch};
use minivmm::layout::MMIO_BASE;
use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

/// Arguments of `minivmm probe-host`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Print the findings as one JSON object, the last line of stdout.
    #[arg(long)]
    json: bool,
}

/// One thing tried.
#[derive(Debug, Serialize)]
struct Finding {
    /// What (the ioctl, and what it was asked).
    what: &'static str,
    /// Whether `KVM_CHECK_EXTENSION` lists its capability.
    listed: bool,
    /// Whether the ioctl itself succeeded on a fresh VM.
    works: bool,
    /// Its error, where it failed.
    error: Option<String>,
}

fn tried(what: &'static str, listed: bool, r: Result<(), String>) -> Finding {
    Finding {
        what,
        listed,
        works: r.is_ok(),
        error: r.err(),
    }
}

/// Runs the probe.
pub fn probe(a: ProbeArgs) -> Result<(), String> {
    let kvm = Kvm::new().map_err(|e| format!("cannot open /dev/kvm: {e}"))?;
    let vm = kvm.create_vm().map_err(|e| format!("KVM_CREATE_VM: {e}"))?;
    let eventfd = || EventFd::new(libc::EFD_NONBLOCK).map_err(|e| format!("eventfd: {e}"));
    let mut found = vec![tried(
        "KVM_CREATE_IRQCHIP",
        kvm.check_extension(Cap::Irqchip),
        vm.create_irq_chip().map_err(|e| e.to_string()),
    )];
    let irqchip = found[0].works;
    found.push(tried(
        "KVM_CREATE_PIT2",
        kvm.check_extension(Cap::Pit2),
        vm.create_pit2(Default::default())
            .map_err(|e| e.to_string()),
    ));
    // The virtio-mmio queue-notify register minivmm's device uses.
    let notify = IoEventAddress::Mmio(MMIO_BASE + 0x50);
    found.push(tried(
        "KVM_IOEVENTFD (MMIO, the virtio-blk queue notify)",
        kvm.check_extension(Cap::Ioeventfd),
        eventfd().and_then(|fd| {
            vm.register_ioevent(&fd, &notify, NoDatamatch)
                .map_err(|e| e.to_string())
        }),
    ));
    found.push(tried(
        "KVM_IOEVENTFD (port I/O)",
        kvm.check_extension(Cap::Ioeventfd),
        eventfd().and_then(|fd| {
            vm.register_ioevent(&fd, &IoEventAddress::Pio(0x510), NoDatamatch)
                .map_err(|e| e.to_string())
        }),
    ));
    found.push(tried(
        "KVM_IRQFD (GSI 5, on the in-kernel irqchip)",
        kvm.check_extension(Cap::Irqfd),
        match irqchip {
            true => eventfd().and_then(|fd| vm.register_irqfd(&fd, 5).map_err(|e| e.to_string())),
            false => Err("needs the in-kernel irqchip, which this host refused".into()),
        },
    ));
    println!(
        "{:<52} {:>7} {:>6}  error",
        "tried on a fresh VM", "listed", "works"
    );
    for f in &found {
        println!(
            "{:<52} {:>7} {:>6}  {}",
            f.what,
            f.listed,
            f.works,
            f.error.as_deref().unwrap_or("-")
        );
    }
    if a.json {
        let j = serde_json::json!({ "findings": found });
        println!("{j}");
    }
    Ok(())
}
