//! KVM's dirty log as a ready-made dirty source over a VMM's own `VmFd`:
//! a VM that is not ferry's (its own memory slot and vCPU, a real-mode loop
//! that writes fourteen pages) and the log reports exactly what it wrote,
//! in each of the three modes; and the same with the VMM's own slot numbers
//! and a read-only region, which stays read-only while the log runs.

use ferry_kvm::dirty::{enable_ring, KvmDirtySource, EXIT_DIRTY_RING_FULL};
use ferry_kvm::require_kvm;
use ferry_kvm::DirtyTracking;
use ferry_vm::{Backing, DirtyPages, DirtySource, Gfn, Gpa, GuestRam, Memslot};
use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_READONLY};
use kvm_ioctls::{Kvm, VcpuExit};
use std::sync::Arc;

/// `mov ax,0x200; l: mov es,ax; mov byte [es:0],1; add ax,0x100;
/// cmp ax,0x1000; jb l; hlt`: writes the first byte of pages 2 to 15.
const LOOP: [u8; 20] = [
    0xb8, 0x00, 0x02, 0x8e, 0xc0, 0x26, 0xc6, 0x06, 0x00, 0x00, 0x01, 0x05, 0x00, 0x01, 0x3d, 0x00,
    0x10, 0x72, 0xf0, 0xf4,
];

/// Where the read-only region starts: reachable in real mode as ffff:0010.
const READ_ONLY: u64 = 1 << 20;

/// [`LOOP`], then `mov ax,0xffff; mov es,ax; mov byte [es:0x10],1; hlt`:
/// a write into the read-only region.
fn loop_then_read_only_write() -> Vec<u8> {
    let mut code = LOOP[..LOOP.len() - 1].to_vec();
    code.extend([
        0xb8, 0xff, 0xff, 0x8e, 0xc0, 0x26, 0xc6, 0x06, 0x10, 0x00, 0x01, 0xf4,
    ]);
    code
}

/// Guest memory as a VMM lays it out: one region at 0 as memslot 7, and
/// 64 KiB at 1 MiB as memslot 3, read-only.
fn vmm_layout() -> GuestRam {
    use vm_memory::{bitmap::AtomicBitmap, GuestAddress, GuestMemoryMmap};
    let mem = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&[
        (GuestAddress(0), 1 << 20),
        (GuestAddress(READ_ONLY), 64 << 10),
    ])
    .unwrap();
    GuestRam::from_memory(mem, Backing::Anonymous)
        .unwrap()
        .with_memslots(&[
            Memslot { slot: 7, flags: 0 },
            Memslot {
                slot: 3,
                flags: KVM_MEM_READONLY,
            },
        ])
        .unwrap()
}

/// Runs the loop on its own VM and returns what the log reported; with
/// `vmm_slots`, on [`vmm_layout`], checking that the write into the
/// read-only region exits to userspace (KVM's MMIO exit) with the log on.
fn run_on(mode: DirtyTracking, vmm_slots: bool) -> Option<Vec<Gfn>> {
    if !require_kvm("kvm dirty source") {
        return None;
    }
    let kvm = Kvm::new().unwrap();
    let vm = Arc::new(kvm.create_vm().unwrap());
    let ram = Arc::new(match vmm_slots {
        true => vmm_layout(),
        false => GuestRam::with_regions(&[(Gpa(0), 2 << 20)], Backing::Anonymous).unwrap(),
    });
    for slot in ram.slots() {
        let region = kvm_userspace_memory_region {
            slot: slot.slot,
            flags: slot.flags,
            guest_phys_addr: slot.gpa.0,
            memory_size: slot.size,
            userspace_addr: ram.host_address(slot) as u64,
        };
        // SAFETY: the mapping belongs to `ram`, which outlives the VM here.
        unsafe { vm.set_user_memory_region(region) }.unwrap();
    }
    let code = match vmm_slots {
        true => loop_then_read_only_write(),
        false => LOOP.to_vec(),
    };
    ram.write_bytes(Gpa(0x1000), &code).unwrap();
    // The ring only before the first vCPU.
    let ring = match mode {
        DirtyTracking::Ring { entries } => Some(enable_ring(&vm, entries).unwrap()),
        _ => None,
    };
    let mut vcpu = vm.create_vcpu(0).unwrap();
    let mut sregs = vcpu.get_sregs().unwrap();
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).unwrap();
    let mut regs = vcpu.get_regs().unwrap();
    regs.rip = 0x1000;
    regs.rflags = 2;
    vcpu.set_regs(&regs).unwrap();

    let (vm2, ram2) = (Arc::clone(&vm), Arc::clone(&ram));
    let (mut source, full) = match ring {
        Some(ring) => {
            let (source, full) = KvmDirtySource::ring(vm2, ram2, &[&vcpu], ring).unwrap();
            (source, full.into_iter().next())
        }
        None => (KvmDirtySource::new(mode, vm2, ram2).unwrap(), None),
    };
    source.start().unwrap();
    // What logging found before the guest ran is not the guest's.
    source.collect(&mut DirtyPages::new(ram.pages())).unwrap();
    let mut read_only_writes = 0;
    loop {
        match vcpu.run() {
            Ok(VcpuExit::Hlt) => break,
            Ok(VcpuExit::MmioWrite(addr, data)) if vmm_slots => {
                assert_eq!((addr, data), (READ_ONLY, &[1u8][..]));
                read_only_writes += 1;
            }
            Ok(VcpuExit::Unsupported(EXIT_DIRTY_RING_FULL)) => {
                full.as_ref().expect("a ring").drain().unwrap()
            }
            // A signal interrupted KVM_RUN: run on.
            Err(e) if e.errno() == libc::EINTR => continue,
            Ok(other) => panic!("the guest stopped with {other:?}"),
            Err(e) => panic!("KVM_RUN failed: {e}"),
        }
    }
    let mut dirty = DirtyPages::new(ram.pages());
    source.collect(&mut dirty).unwrap();
    source.stop();
    if vmm_slots {
        assert_eq!(read_only_writes, 1, "the read-only region took a write");
        assert_eq!(ram.load_u64(Gpa(READ_ONLY)).unwrap(), 0);
    }
    for page in 2..16u64 {
        assert_eq!(
            ram.load_u64(Gpa(page * 4096)).unwrap() & 0xff,
            1,
            "page {page}"
        );
    }
    Some(dirty.iter().collect())
}

/// Runs the loop in each of the three modes and checks the log reported
/// pages 2 to 15 each time, and nothing else the guest did not touch.
///
/// The code page (1) may be reported too: with nested paging (the TDP MMU,
/// as on the SVM host) KVM maps a page writable on its first access, a
/// read or fetch, and so logs it dirty if that access came after logging
/// began (Linux 6.1); shadow paging (kvm_pvm) maps it read-only and does
/// not. Over-reporting a page the guest read costs a resend; missing one
/// it wrote would lose it.
fn every_mode_reports_the_loop(vmm_slots: bool) {
    let written: Vec<Gfn> = (2..16).map(Gfn).collect();
    let touched: Vec<Gfn> = (1..16).map(Gfn).collect();
    for mode in [
        DirtyTracking::Bitmap,
        DirtyTracking::Clear {
            chunk_pages: 64,
            pace_us: 0,
        },
        DirtyTracking::Ring { entries: 1024 },
    ] {
        let Some(dirty) = run_on(mode, vmm_slots) else {
            return;
        };
        assert!(
            dirty == written || dirty == touched,
            "{}: the log reported {dirty:?}, not the pages written ({written:?}), \
             nor those and the code page",
            mode.name()
        );
    }
}

#[test]
fn the_kvm_log_over_a_vmms_own_vm_reports_what_its_guest_wrote() {
    every_mode_reports_the_loop(false);
}

#[test]
fn the_vmms_slot_numbers_and_read_only_flag_hold_while_the_log_runs() {
    every_mode_reports_the_loop(true);
}

#[test]
fn memslots_that_do_not_fit_the_regions_are_refused() {
    let ram = || GuestRam::new(&[2 << 20, 2 << 20], Backing::Anonymous).unwrap();
    let one = [Memslot { slot: 1, flags: 0 }];
    let e = ram().with_memslots(&one).unwrap_err().to_string();
    assert!(e.contains("1 memslots for 2 regions"), "{e}");
    let twice = [Memslot { slot: 4, flags: 0 }; 2];
    let e = ram().with_memslots(&twice).unwrap_err().to_string();
    assert!(e.contains("memslot 4 is given to two regions"), "{e}");
}

#[test]
fn a_misused_ring_is_refused_with_the_reason() {
    if !require_kvm("kvm dirty source") {
        return;
    }
    let kvm = Kvm::new().unwrap();
    let vm = Arc::new(kvm.create_vm().unwrap());
    let ram = Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap());
    let ring = DirtyTracking::Ring { entries: 4096 };
    let Err(err) = KvmDirtySource::new(ring, Arc::clone(&vm), Arc::clone(&ram)) else {
        panic!("a ring without vCPUs was accepted");
    };
    assert!(err.to_string().contains("KvmDirtySource::ring"), "{err}");
    // KVM takes the ring only before the first vCPU.
    let vcpu = vm.create_vcpu(0).unwrap();
    let err = enable_ring(&vm, 4096).unwrap_err();
    assert!(err.to_string().contains("before its first vCPU"), "{err}");
    // A ring enabled on another VM is not this one's.
    let other = kvm.create_vm().unwrap();
    let enabled = enable_ring(&other, 4096).unwrap();
    let Err(err) = KvmDirtySource::ring(vm, ram, &[&vcpu], enabled) else {
        panic!("another VM's ring was accepted");
    };
    assert!(err.to_string().contains("another VM"), "{err}");
}
