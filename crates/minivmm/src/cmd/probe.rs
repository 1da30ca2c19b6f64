//! `minivmm probe-host`: what this host's KVM offers for serving devices
//! off the vCPU threads (an in-kernel irqchip, `ioeventfd`, `irqfd`), tried
//! on a fresh VM rather than only read from the capability list: a nested
//! or paravirtual KVM (this project's `kvm_pvm`) may list an ioctl and
//! still refuse it. Then what a queue notification costs a CPL3 guest's
//! vCPU either way it can reach an I/O thread ([`minivmm::notify_cost`]).

use clap::Args;
use kvm_ioctls::{Cap, IoEventAddress, Kvm, NoDatamatch};
use minivmm::blk::Notify;
use minivmm::irq_delivery::{self, IrqDelivery};
use minivmm::layout::MMIO_BASE;
use minivmm::notify_cost::{self, NotifyCost};
use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

/// Arguments of `minivmm probe-host`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Print the findings as one JSON object, the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Notifications the guest writes to measure each way's cost (0: do
    /// not measure).
    #[arg(long, default_value_t = 20_000)]
    notifications: u64,
    /// Measurements of each way, interleaved.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Interrupts to raise through an irqfd into a CPL3 guest, one at a
    /// time, to see whether and how fast they arrive (0: do not try).
    #[arg(long, default_value_t = 1000)]
    interrupts: u64,
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
    let costs = notify_costs(&a, found[2].works)?;
    let irqs = match (a.interrupts, irqchip && found[4].works) {
        (0, _) | (_, false) => None,
        (n, true) => Some(interrupts(n)?),
    };
    if a.json {
        let j = serde_json::json!({
            "findings": found,
            "notify_cost": costs,
            "interrupt_delivery": irqs,
        });
        println!("{j}");
    }
    Ok(())
}

/// Raises `n` interrupts into a CPL3 guest and prints what arrived.
fn interrupts(n: u64) -> Result<IrqDelivery, String> {
    let d = irq_delivery::probe(n).map_err(|e| e.to_string())?;
    println!(
        "\ninterrupts through KVM_IRQFD (IOAPIC pin {}) into a CPL3 guest: {} raised, {} taken by its handler",
        irq_delivery::PIN,
        d.raised,
        d.delivered
    );
    if let (Some(median), Some(max)) = (d.median_us, d.max_us) {
        println!(
            "from the irqfd write to the handler's count: median {median:.1} us, max {max:.1} us"
        );
    }
    if let Some(v) = d.other_vector {
        println!("the guest's IDT took vector {v} instead (an exception below 32)");
    }
    if let Some(how) = &d.vcpu_stopped {
        println!("the vCPU stopped: {how}");
    }
    Ok(d)
}

/// Each way measured `runs` times, interleaved, with the table printed;
/// the ioeventfd way only where this host registers one.
fn notify_costs(a: &ProbeArgs, ioeventfd: bool) -> Result<Vec<NotifyCost>, String> {
    let mut costs = Vec::new();
    if a.notifications == 0 {
        return Ok(costs);
    }
    for _ in 0..a.runs {
        for way in [Notify::Exit, Notify::Ioeventfd] {
            if way == Notify::Ioeventfd && !ioeventfd {
                continue;
            }
            costs.push(notify_cost::measure(way, a.notifications).map_err(|e| e.to_string())?);
        }
    }
    println!(
        "\nqueue notifications from a CPL3 guest, {} each run: the vCPU's time per notification",
        a.notifications
    );
    println!(
        "{:<10} {:>10} {:>10} {:>14}",
        "way", "exits", "delivered", "us/notify"
    );
    for c in &costs {
        println!(
            "{:<10} {:>10} {:>10} {:>14.2}",
            c.notify.to_string(),
            c.exits,
            c.delivered,
            c.us_per_notification
        );
    }
    let median = |way: Notify| {
        let mut v: Vec<f64> = costs
            .iter()
            .filter(|c| c.notify == way)
            .map(|c| c.us_per_notification)
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let exit = median(Notify::Exit);
    match ioeventfd {
        true => {
            let fd = median(Notify::Ioeventfd);
            println!(
                "median: exit {exit:.2} us, ioeventfd {fd:.2} us ({:.1}x cheaper)",
                exit / fd
            );
        }
        false => println!("median: exit {exit:.2} us; this host registers no ioeventfd"),
    }
    Ok(costs)
}
