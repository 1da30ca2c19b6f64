//! The complete vCPU state on real vCPUs: saved from a running guest, loaded
//! into a fresh VM, saved again, every piece equal; the restored guest runs
//! on; and a damaged or foreign blob is refused, each with its own message.
//!
//! Needs /dev/kvm; prints a skip line where it is absent.

mod common;
use common::wait_for_passes;
use ferry_vm::capability::VcpuState as _;

use ferry_kvm::cpu_state::msrs::{self, HV_TIME_REF_COUNT, HV_VP_RUNTIME, IA32_TSC};
use ferry_kvm::cpu_state::{blob, equal_but_clocks, Irqchip, Snapshot, VcpuSnapshot};
use ferry_kvm::require_kvm;
use ferry_kvm::DirtyTracking;
use ferry_kvm_memstress::{KvmVm, Role};
use ferry_memstress::read_progress;
use ferry_memstress::{VmConfig, Workload};
use ferry_vm::{Backing, Gfn, Vm, VmError, PAGE_SIZE};
use serde::Serialize;

fn config(vcpus: u32) -> VmConfig {
    VmConfig {
        workload: Workload {
            vcpus,
            bytes_per_vcpu: 4 << 20,
            write_percent: 50,
            readers: 0,
            ..Workload::default()
        },
        backing: Backing::Anonymous,
    }
}

fn copy_ram(from: &KvmVm, to: &KvmVm) {
    let mut buf = vec![0u8; PAGE_SIZE];
    for g in 0..from.ram().pages() {
        from.ram().read_pages(Gfn(g), &mut buf).unwrap();
        to.ram().write_pages(Gfn(g), &buf).unwrap();
    }
}

/// Asserts two pieces of state serialize to the same value (the kvm-bindings
/// structs have no `PartialEq`; their serde form is their bytes).
fn assert_same<T: Serialize>(what: &str, a: &T, b: &T) {
    let (a, b) = (
        serde_json::to_value(a).unwrap(),
        serde_json::to_value(b).unwrap(),
    );
    assert!(
        a == b,
        "{what} differs after the round trip:\n saved    {a}\n restored {b}"
    );
}

/// IA32_TSC keeps counting while the vCPUs are paused, on both sides (the
/// guest TSC is the host TSC plus an offset), so the restored vCPU reads its
/// saved TSC plus the ticks since the restore. It may also read a little
/// less: KVM matches host-initiated TSC writes made within a second of each
/// other onto one offset (its sync for vCPUs started together), and the two
/// vCPUs were saved microseconds apart. So: within 1 ms of ticks below, and
/// less than 30 s of ticks above.
fn assert_tsc_close(vcpu: usize, saved: u64, restored: u64, khz: u64) {
    let below = restored.saturating_add(khz) >= saved;
    let above = restored <= saved.saturating_add(30_000 * khz);
    assert!(
        below && above,
        "vCPU {vcpu}: IA32_TSC saved {saved}, restored {restored} ({} ticks, {khz} kHz)",
        restored as i128 - saved as i128
    );
}

fn assert_vcpu_same(i: usize, s: &VcpuSnapshot, d: &VcpuSnapshot) {
    let w = |piece: &str| format!("vCPU {i} {piece}");
    assert_same(&w("CPUID"), &s.cpuid, &d.cpuid);
    assert_same(&w("TSC kHz"), &s.tsc_khz, &d.tsc_khz);
    assert_same(&w("regs"), &s.regs, &d.regs);
    assert_same(&w("sregs"), &s.sregs, &d.sregs);
    assert_same(&w("XCRs"), &s.xcrs, &d.xcrs);
    assert_eq!(s.xsave.len(), d.xsave.len(), "{}", w("XSAVE size"));
    if let Some(at) = s.xsave.iter().zip(&d.xsave).position(|(a, b)| a != b) {
        panic!(
            "{}: byte {:#x} saved {:#010x}, restored {:#010x}",
            w("XSAVE"),
            at * 4,
            s.xsave[at],
            d.xsave[at]
        );
    }
    assert_same(&w("LAPIC"), &s.lapic, &d.lapic);
    assert_same(&w("MP state"), &s.mp_state, &d.mp_state);
    assert_same(&w("events"), &s.events, &d.events);
    assert_same(&w("debug registers"), &s.debugregs, &d.debugregs);
    let index = |m: &[kvm_bindings::kvm_msr_entry]| m.iter().map(|e| e.index).collect::<Vec<_>>();
    assert_eq!(index(&s.msrs), index(&d.msrs), "{}", w("MSR list"));
    let khz = u64::from(s.tsc_khz.unwrap_or(1_000_000));
    for (a, b) in s.msrs.iter().zip(&d.msrs) {
        if a.index == IA32_TSC {
            println!(
                "vCPU {i}: IA32_TSC restored {} ticks from saved",
                b.data as i128 - a.data as i128
            );
            assert_tsc_close(i, a.data, b.data, khz);
        } else if a.index == HV_TIME_REF_COUNT || a.index == HV_VP_RUNTIME {
            // Hyper-V's reference counter and the vCPU's run time (100 ns
            // units), which KVM lists where it offers Hyper-V (the SVM
            // host; not kvm_pvm): clocks that go on from where they were,
            // never back, and not by more than the test's own length.
            assert!(
                b.data >= a.data && b.data - a.data < 300_000_000,
                "vCPU {i}: Hyper-V clock MSR {:#x} went from {:#x} to {:#x}",
                a.index,
                a.data,
                b.data
            );
        } else {
            assert_eq!(
                a.data, b.data,
                "vCPU {i} MSR {:#x}: saved {:#x}, restored {:#x}",
                a.index, a.data, b.data
            );
        }
    }
}

#[test]
fn every_piece_of_state_round_trips_and_the_guest_runs_on() {
    if !require_kvm("kvm vCPU state") {
        return;
    }
    let cfg = config(2);
    let mut src = KvmVm::new(cfg.clone(), DirtyTracking::Bitmap, Role::Source).unwrap();
    src.start().unwrap();
    wait_for_passes(&src, 2);
    src.pause().unwrap();
    let blob = src.save_vcpus().unwrap();

    let mut dst = KvmVm::new(cfg, DirtyTracking::Bitmap, Role::Destination).unwrap();
    copy_ram(&src, &dst);
    dst.restore_vcpus(&blob).unwrap();
    let again = dst.save_vcpus().unwrap();

    let s = Snapshot::decode(&blob).unwrap();
    let d = Snapshot::decode(&again).unwrap();
    let probe = src.msr_probe();
    println!(
        "probe: {} MSRs listed ({} feature MSRs), {} saved, unreadable {:x?}, unwritable {:x?}; \
         XSAVE {} bytes; devices {:?}; blob {} bytes for {} vCPUs \
         (JSON: VM-level {} bytes, vCPU 0 {} bytes)",
        probe.listed,
        probe.feature_listed,
        probe.saveable.len(),
        probe.unreadable,
        probe.unwritable,
        s.vcpus[0].xsave.len() * 4,
        src.devices(),
        blob.len(),
        s.vcpus.len(),
        serde_json::to_vec(&s.vm).unwrap().len(),
        serde_json::to_vec(&s.vcpus[0]).unwrap().len(),
    );
    assert!(
        s.vcpus[0].msrs.iter().any(|m| m.index == IA32_TSC),
        "IA32_TSC is saved"
    );
    assert_eq!(s.vcpus.len(), 2);
    assert_eq!(d.vcpus.len(), 2);
    for (i, (sv, dv)) in s.vcpus.iter().zip(&d.vcpus).enumerate() {
        assert_vcpu_same(i, sv, dv);
    }

    // VM-level state.
    assert_eq!(
        matches!(s.vm.irqchip, Irqchip::InKernel(_)),
        src.devices().irqchip
    );
    assert_eq!(s.vcpus[0].lapic.is_some(), src.devices().irqchip);
    assert_same(
        "irqchips (PIC master, slave, IOAPIC)",
        &s.vm.irqchip,
        &d.vm.irqchip,
    );
    // A PIT channel's count_load_time is the host time its count was loaded;
    // KVM_SET_PIT2 reloads each count, so it is the restore's time.
    let no_load_time = |pit: &Option<kvm_bindings::kvm_pit_state2>| {
        pit.map(|mut p| {
            p.channels.iter_mut().for_each(|c| c.count_load_time = 0);
            p
        })
    };
    assert_same("PIT", &no_load_time(&s.vm.pit), &no_load_time(&d.vm.pit));
    // The kvmclock runs on, paused or not, like the TSC.
    if let (Some(sc), Some(dc)) = (s.vm.clock, d.vm.clock) {
        assert!(
            dc.clock >= sc.clock && dc.clock - sc.clock < 30_000_000_000,
            "kvmclock saved {} ns, restored {} ns",
            sc.clock,
            dc.clock
        );
    }
    assert_eq!(s.vm.clock.is_some(), src.devices().clock);

    // The restored guest carries on where it stopped, checking its stamps.
    let at_switch = read_progress(dst.ram(), 2).unwrap();
    dst.start().unwrap();
    wait_for_passes(&dst, at_switch.iter().map(|p| p.passes).max().unwrap() + 2);
    dst.pause().unwrap();
    let p = read_progress(dst.ram(), 2).unwrap();
    for (now, then) in p.iter().zip(&at_switch) {
        assert!(now.passes > then.passes, "{p:?}");
        assert!(now.writes > then.writes, "{p:?}");
        assert_eq!(now.mismatches, 0, "{p:?}");
    }
}

/// The compact form (for a destination that loads it) holds what the
/// JSON form does, and a guest restored from it runs on. It is smaller,
/// though not by much (zeros are short in JSON); what it saves is parsing.
#[test]
fn the_compact_form_holds_the_same_state_and_the_guest_runs_on() {
    if !require_kvm("kvm vCPU state") {
        return;
    }
    let cfg = config(2);
    let mut src = KvmVm::new(cfg.clone(), DirtyTracking::Bitmap, Role::Source).unwrap();
    src.start().unwrap();
    wait_for_passes(&src, 2);
    src.pause().unwrap();
    assert!(src.saves_compact());
    let full = src.save_vcpus().unwrap();
    let compact = src.save_vcpus_compact().unwrap();
    let format = |b: &[u8]| u32::from_le_bytes(b[8..12].try_into().unwrap());
    assert_eq!(
        (format(&full), format(&compact)),
        (blob::JSON, blob::COMPACT)
    );
    assert!(
        compact.len() < full.len(),
        "compact {} bytes, JSON {}",
        compact.len(),
        full.len()
    );
    assert!(equal_but_clocks(&full, &compact));

    let mut dst = KvmVm::new(cfg, DirtyTracking::Bitmap, Role::Destination).unwrap();
    copy_ram(&src, &dst);
    dst.restore_vcpus(&compact).unwrap();
    assert!(equal_but_clocks(&compact, &dst.save_vcpus().unwrap()));
    let at_switch = read_progress(dst.ram(), 2).unwrap();
    dst.start().unwrap();
    wait_for_passes(&dst, at_switch.iter().map(|p| p.passes).max().unwrap() + 2);
    dst.pause().unwrap();
    for p in read_progress(dst.ram(), 2).unwrap() {
        assert_eq!(p.mismatches, 0, "{p:?}");
    }
}

fn refused(vm: &mut KvmVm, blob: &[u8]) -> String {
    match vm.restore_vcpus(blob) {
        Err(VmError::BadVcpuState(msg)) => msg,
        Err(e) => panic!("refused as something other than bad vCPU state: {e}"),
        Ok(()) => panic!("a bad blob was loaded"),
    }
}

#[test]
fn a_foreign_or_damaged_blob_is_refused_with_its_own_message() {
    if !require_kvm("kvm vCPU state") {
        return;
    }
    let mut src = KvmVm::new(config(2), DirtyTracking::Bitmap, Role::Source).unwrap();
    let good = src.save_vcpus().unwrap();
    let mut dst = KvmVm::new(config(2), DirtyTracking::Bitmap, Role::Destination).unwrap();

    let mut bad = good.clone();
    bad[..8].copy_from_slice(b"NOTFERRY");
    let msg = refused(&mut dst, &bad);
    assert!(
        msg.contains("not ferry vCPU state") && msg.contains("NOTFERRY"),
        "{msg}"
    );

    let mut bad = good.clone();
    bad[8..12].copy_from_slice(&7u32.to_le_bytes());
    let msg = refused(&mut dst, &bad);
    assert!(
        msg.contains(&format!(
            "vCPU state version 7, this ferry loads {} to {}",
            blob::OLDEST_VERSION,
            blob::VERSION
        )),
        "{msg}"
    );

    let mut bad = good.clone();
    let middle = blob::HEADER_LEN + (good.len() - blob::HEADER_LEN) / 2;
    bad[middle] ^= 0x20;
    let msg = refused(&mut dst, &bad);
    assert!(msg.contains("CRC-32") && msg.contains("corrupted"), "{msg}");

    let msg = refused(&mut dst, &good[..good.len() - 1]);
    assert!(msg.contains("its header says"), "{msg}");

    // A compact body that is not a snapshot, its checksum right.
    let msg = refused(&mut dst, &blob::encode(blob::COMPACT, b"not bincode"));
    assert!(msg.contains("compact body is not ferry kvm state"), "{msg}");

    // Good header, another VM's shape.
    let mut one = KvmVm::new(config(1), DirtyTracking::Bitmap, Role::Destination).unwrap();
    let msg = refused(&mut one, &good);
    assert!(msg.contains("state for 2 vCPUs, this VM has 1"), "{msg}");

    // Nothing was written before a refusal: the good blob still loads.
    dst.restore_vcpus(&good).unwrap();
}

#[test]
fn every_msr_the_probe_keeps_reads_and_takes_its_value_back() {
    if !require_kvm("kvm vCPU state") {
        return;
    }
    // A bare VM without an in-kernel irqchip, where this host's KVM refuses
    // some listed MSRs (MSR_KVM_ASYNC_PF_INT needs an in-kernel LAPIC).
    let kvm = kvm_ioctls::Kvm::new().unwrap();
    let vm = kvm.create_vm().unwrap();
    let fd = vm.create_vcpu(0).unwrap();
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .unwrap();
    fd.set_cpuid2(&cpuid).unwrap();
    let probe = msrs::probe(&kvm, &fd).unwrap();
    println!(
        "no irqchip: {} listed, {} kept, unreadable {:x?}, unwritable {:x?}",
        probe.listed,
        probe.saveable.len(),
        probe.unreadable,
        probe.unwritable
    );
    assert!(probe.saveable.contains(&IA32_TSC));
    // Every listed MSR is kept or dropped with its reason.
    let accounted = probe.saveable.len() + probe.unreadable.len() + probe.unwritable.len();
    assert!(accounted >= probe.listed, "{probe:?}");
    let entries = msrs::read(&fd, &probe.saveable).unwrap();
    assert_eq!(entries.len(), probe.saveable.len());
    msrs::write(&fd, &entries).unwrap();
    // And the error names the MSR when one is refused.
    if let Some(&index) = probe.unwritable.first() {
        let mut with_refused = entries.clone();
        with_refused.push(kvm_bindings::kvm_msr_entry {
            index,
            ..Default::default()
        });
        let e = msrs::write(&fd, &with_refused).unwrap_err().to_string();
        assert!(e.contains(&format!("MSR {index:#x}")), "{e}");
    }
}
