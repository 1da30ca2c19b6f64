//! Discarded memory (a balloon's pages, unplugged virtio-mem blocks, free
//! page hints): a VMM marks it with `GuestRam::discard_range`, and a
//! migration does not send it as data, while the digest still proves the
//! destination equals the source.

mod common;
use common::*;

use ferry_engine::{migrate, MigrationSummary, NoProgress, PrecopyOptions, ReceiveOptions};
use ferry_vm::{Backing, Gpa, RamError, Vm, PAGE_SIZE};

const DATA: u64 = 64 << 20;

/// A paused test VM whose every page holds noise, of which the upper half
/// of the data region is discarded if `discard`; then one page in that
/// half is written again (the guest took it back without telling).
/// Returns the source's summary, after checking the destination's memory.
fn move_vm(backing: Backing, discard: bool) -> MigrationSummary {
    let config = TestConfig {
        data_bytes: DATA,
        hole_bytes: 0,
        backing,
    };
    let mut src = TestVm::new(&config).unwrap();
    let ram = std::sync::Arc::clone(src.ram());
    for slot in ram.slots().iter().skip(1) {
        let chunk = 1 << 20;
        for off in (0..slot.size).step_by(chunk) {
            let data = noise(slot.gpa.0 + off, chunk);
            ram.write_bytes(slot.gpa.add(off), &data).unwrap();
        }
    }
    let data = ram.slots().last().unwrap().gpa;
    let half = data.add(DATA / 2);
    let written_back = half.add(5 * PAGE_SIZE as u64);
    if discard {
        ram.discard_range(half, DATA / 2).unwrap();
        assert_eq!(ram.discarded_pages(), DATA / 2 / PAGE_SIZE as u64);
        assert_eq!(
            ram.load_u64(half).unwrap(),
            0,
            "a discarded page reads zero"
        );
        ram.store_u64(written_back, 0x5eed).unwrap();
    }
    let (to, dest) = spawn_receiver_on(ReceiveOptions::default(), backing);
    let s = migrate(&mut src, &to, &PrecopyOptions::default(), &NoProgress).unwrap();
    let (moved, received) = dest.join().unwrap().unwrap();
    assert!(s.digest_match && received.digest_match, "{s:?}");
    // The digest covers it, but say it plainly: the data came, the
    // discarded half is zero, and the page written back came.
    let (mut here, mut there) = (vec![0u8; PAGE_SIZE], vec![0u8; PAGE_SIZE]);
    for gpa in [
        data,
        data.add(DATA / 2 - PAGE_SIZE as u64),
        half,
        written_back,
    ] {
        ram.read_pages(gpa.gfn(), &mut here).unwrap();
        moved.ram().read_pages(gpa.gfn(), &mut there).unwrap();
        assert!(here == there, "page at {gpa} differs");
    }
    if discard {
        assert_eq!(moved.ram().load_u64(written_back).unwrap(), 0x5eed);
        assert_eq!(moved.ram().load_u64(half).unwrap(), 0);
    }
    s
}

fn discarded_half_sends_about_half(backing: Backing) {
    let whole = move_vm(backing, false);
    let halved = move_vm(backing, true);
    assert_eq!(whole.memory.discarded_bytes, 0);
    // Less the page written back, which is data again.
    assert_eq!(halved.memory.discarded_bytes, DATA / 2 - PAGE_SIZE as u64);
    // 2 MiB of system slot + 64 MiB of data, against 2 + 32 (+ a page).
    let ratio = halved.link.bytes_sent as f64 / whole.link.bytes_sent as f64;
    println!(
        "{backing:?}: whole {} bytes, half discarded {} bytes ({ratio:.3})",
        whole.link.bytes_sent, halved.link.bytes_sent
    );
    assert!(
        (0.45..0.6).contains(&ratio),
        "{ratio}: {whole:?} / {halved:?}"
    );
}

#[test]
fn a_vm_with_half_its_memory_discarded_sends_about_half_the_bytes() {
    discarded_half_sends_about_half(Backing::Anonymous);
}

#[test]
fn discarding_shared_memory_sends_about_half_the_bytes_too() {
    discarded_half_sends_about_half(Backing::Memfd);
}

#[test]
fn a_discarded_range_outside_memory_or_not_whole_pages_is_refused() {
    let vm = TestVm::new(&config()).unwrap();
    let ram = vm.ram();
    let end = {
        let last = ram.slots().last().unwrap();
        last.gpa.add(last.size)
    };
    for (gpa, bytes) in [
        (end, PAGE_SIZE as u64),
        (Gpa(end.0 - PAGE_SIZE as u64), 2 * PAGE_SIZE as u64),
        (Gpa(100), PAGE_SIZE as u64),
        (Gpa(0), 100),
        (Gpa(0), 0),
        (Gpa(!0xfff), PAGE_SIZE as u64),
    ] {
        match ram.discard_range(gpa, bytes) {
            Err(e @ RamError::NotInRam { .. }) => {
                assert!(
                    e.to_string()
                        .contains("whole 4 KiB pages inside one region"),
                    "{e}"
                )
            }
            other => panic!("{gpa} + {bytes}: {other:?}"),
        }
    }
    assert_eq!(ram.discarded_pages(), 0);
    ram.discard_range(Gpa(0), PAGE_SIZE as u64).unwrap();
    ram.populate_range(Gpa(0), PAGE_SIZE as u64).unwrap();
    assert_eq!(ram.discarded_pages(), 0);
}
