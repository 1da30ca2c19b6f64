//! Same-host live upgrade between two test VMs in one process, over a
//! UNIX socket: the destination maps the source's memfd memory, so no page
//! is copied, and the guest (which checks every page it rewrites) runs on
//! there without a mismatch.

mod common;

use common::{check, config, wait_for_passes, TestConfig, TestProbe, TestVm};
use ferry_engine::local::{
    await_local, listen_local, migrate_local, receive_local_as, LocalOptions,
};
use ferry_engine::vmm::StreamHeader;
use ferry_engine::{MigrationError, Outcome};
use ferry_vm::{Backing, GuestRam, Vm};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

fn socket(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ferry-local-{name}-{}.sock", std::process::id()))
}

fn opts() -> LocalOptions {
    {
        let mut o = LocalOptions::default();
        o.probe = Some(Arc::new(TestProbe));
        o
    }
}

fn memfd_source() -> TestVm {
    let mut vm = TestVm::new(&TestConfig {
        backing: Backing::Memfd,
        ..config()
    })
    .unwrap();
    vm.start().unwrap();
    wait_for_passes(&vm, 1);
    vm
}

type Received = Result<(TestVm, ferry_engine::local::LocalSummary), MigrationError>;

/// A destination thread on `path`; `fail_restore` makes its VM refuse the
/// vCPU state (a destination that fails before it resumes).
fn destination(path: &Path, fail_restore: bool) -> JoinHandle<Received> {
    destination_with(path, move |vm| vm.fail_restore = fail_restore)
}

/// A destination thread on `path` whose VM `build` changes once made.
fn destination_with(
    path: &Path,
    build: impl Fn(&mut TestVm) + Send + 'static,
) -> JoinHandle<Received> {
    let listener = listen_local(path).unwrap();
    std::thread::spawn(move || {
        let incoming = await_local(&listener, &opts())?;
        let mut factory = |h: &StreamHeader, ram: GuestRam| {
            let config = TestVm::config_from(h, Backing::Memfd)?;
            let mut vm = TestVm::on_ram(&config, ram);
            build(&mut vm);
            Ok(vm)
        };
        receive_local_as(incoming, &mut factory, &opts())
    })
}

#[test]
fn a_memfd_vm_moves_to_another_process_without_copying_its_memory() {
    let path = socket("moves");
    let dest = destination(&path, false);
    let mut src = memfd_source();
    let summary = migrate_local(&mut src, &path, &opts()).unwrap();
    let (dvm, dsum) = dest.join().unwrap().unwrap();
    assert_eq!(summary.status, Outcome::Completed);
    assert!(summary.digest_match && dsum.digest_match, "{summary:?}");
    assert_eq!(summary.regions, 2);
    assert!(!src.is_running() && dvm.is_running());
    // The guest runs on here, on the same pages, checking what it rewrites.
    let at = check(&dvm);
    wait_for_passes(&dvm, at.progress + 2);
    assert_eq!(check(&dvm).errors, 0);
    assert!(summary.guest.is_some() && dsum.guest.is_some());
    let _ = std::fs::remove_file(path);
}

#[test]
fn anonymous_memory_is_refused_before_anything_starts_naming_memfd() {
    let mut src = TestVm::new(&config()).unwrap();
    src.start().unwrap();
    let err = migrate_local(&mut src, &socket("anon"), &opts()).unwrap_err();
    assert!(err.to_string().contains("--backing memfd"), "{err}");
    assert!(src.is_running());
}

#[test]
fn a_destination_that_fails_before_it_resumes_leaves_the_source_running() {
    let path = socket("fails");
    let dest = destination(&path, true);
    let mut src = memfd_source();
    let err = migrate_local(&mut src, &path, &opts()).unwrap_err();
    assert!(
        err.chain().contains("failed before it resumed"),
        "{}",
        err.chain()
    );
    assert!(dest.join().unwrap().is_err());
    // The guest is the source's again: it runs on, and lost nothing.
    assert!(src.is_running());
    let at = check(&src);
    wait_for_passes(&src, at.progress + 2);
    assert_eq!(check(&src).errors, 0);
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_section_over_its_declared_size_fails_the_pause_and_the_source_runs_on() {
    let path = socket("outgrew");
    let devices = common::Devices {
        specs: vec![ferry_vm::SectionSpec::new("gpu", 1, 1).with_max_bytes(1024)],
        payload_bytes: 4096,
        ..common::Devices::default()
    };
    let at_dest = devices.clone();
    let dest = destination_with(&path, move |vm| vm.devices = at_dest.clone());
    let mut src = memfd_source();
    src.devices = devices;
    let err = migrate_local(&mut src, &path, &opts()).unwrap_err().chain();
    assert!(
        err.contains("section 'gpu' instance 0 took 4.0 KiB at the pause, more than the 1.0 KiB"),
        "{err}"
    );
    assert!(src.is_running(), "the source runs on");
    let _ = dest.join();
    let _ = std::fs::remove_file(path);
}

/// A file a VMM would hand over as its disk: its path is removed once it
/// is open, so only the fd can reach it.
fn disk_file(name: &str, contents: &[u8]) -> std::fs::File {
    let path = std::env::temp_dir().join(format!("ferry-local-{name}-{}.img", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    file
}

fn read_all(fd: std::os::fd::OwnedFd) -> Vec<u8> {
    use std::io::{Read, Seek};
    let mut file = std::fs::File::from(fd);
    file.rewind().unwrap();
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).unwrap();
    bytes
}

#[test]
fn a_version_3_move_hands_the_vmms_fds_over_by_name_after_agreeing() {
    let path = socket("handed");
    let listener = listen_local(&path).unwrap();
    let dest = std::thread::spawn(move || {
        let mut incoming = await_local(&listener, &opts())?;
        let mut handed = incoming.take_handed_fds();
        let names: Vec<String> = handed.names().into_iter().map(String::from).collect();
        let disk = read_all(handed.take("disk").unwrap());
        let mut factory = |h: &StreamHeader, ram: GuestRam| {
            Ok(TestVm::on_ram(
                &TestVm::config_from(h, Backing::Memfd)?,
                ram,
            ))
        };
        let (vm, summary) = receive_local_as(incoming, &mut factory, &opts())?;
        Ok::<_, MigrationError>((vm, summary, names, disk))
    });
    let mut src = memfd_source();
    src.handed = vec![("disk".into(), disk_file("handed", b"the guest's disk"))];
    let summary = migrate_local(&mut src, &path, &opts()).unwrap();
    let (dvm, dsum, names, disk) = dest.join().unwrap().unwrap();
    assert_eq!(names, ["disk"]);
    assert_eq!(disk, b"the guest's disk");
    assert_eq!((summary.version, dsum.version), (3, 3));
    assert_eq!(summary.status, Outcome::Completed);
    assert!(summary.digest_match && dsum.digest_match, "{summary:?}");
    assert!(dvm.is_running());
    let _ = std::fs::remove_file(path);
}

/// What a destination of release 76c7980 saw of a move: it speaks version
/// 1 of the same-host protocol only and knows nothing of handed fds.
#[derive(Debug)]
struct Version1Saw {
    /// The fds that came with every message, the Offer's included.
    fds: usize,
    regions: usize,
    digest_match: bool,
}

/// A destination as release 76c7980's was, in-process: it reads only the
/// Offer's `version` (1, or it refuses), refuses an offer whose fds are
/// not exactly its regions, answers a plain Accepted, reads dirty sets as
/// bitmaps, and checks the digest on the memory it maps.
fn version_1_destination(path: &Path) -> JoinHandle<Result<Version1Saw, String>> {
    use ferry_engine::local::digest::LocalDigest;
    use ferry_engine::local::message::{self, Head};
    let listener = listen_local(path).unwrap();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().map_err(|e| e.to_string())?;
        message::set_timeouts(&stream, opts().timeout).map_err(|e| e.to_string())?;
        let refuse = |reason: String| {
            let _ = message::send(
                &stream,
                &Head::Refused {
                    reason: reason.clone(),
                },
                &[],
                &[],
            );
            reason
        };
        let offer = message::recv(&stream).map_err(|e| e.to_string())?;
        let mut fds = offer.fds.len();
        let Head::Offer {
            version,
            header,
            offsets,
            ..
        } = offer.head
        else {
            return Err(refuse(format!(
                "expected an offer, got {}",
                offer.head.name()
            )));
        };
        if version != 1 {
            return Err(refuse(format!(
                "the source speaks version {version}, this ferry 1"
            )));
        }
        let n = header.regions.len();
        if offer.fds.len() != n || offsets.len() != n {
            return Err(refuse(format!(
                "{n} regions, but {} files and {} offsets",
                offer.fds.len(),
                offsets.len()
            )));
        }
        let regions = header
            .regions
            .iter()
            .zip(offer.fds)
            .zip(offsets)
            .map(|((r, fd), offset)| ferry_vm::SharedRegion {
                gpa: ferry_vm::Gpa(r.gpa),
                size: r.bytes,
                file: std::fs::File::from(fd),
                offset,
            })
            .collect();
        let ram = GuestRam::from_files(regions, Backing::Memfd).map_err(|e| e.to_string())?;
        let mut digest = LocalDigest::scan(&ram).map_err(|e| e.to_string())?;
        let accepted = Head::Accepted { version: None };
        message::send(&stream, &accepted, &[], &[]).map_err(|e| e.to_string())?;
        let e = |e: ferry_engine::error::LocalError| e.to_string();
        let source_digest = loop {
            let m = message::recv(&stream).map_err(e)?;
            fds += m.fds.len();
            let dirty = m.blobs.last().ok_or("a message without its dirty bitmap")?;
            digest
                .refresh_runs(
                    &ram,
                    &message::dirty_from(dirty, ram.pages(), 1).map_err(e)?,
                )
                .map_err(e)?;
            match m.head {
                Head::Rehash => message::send(&stream, &Head::Rehashed, &[], &[]).map_err(e)?,
                Head::State { digest } => break digest,
                other => return Err(format!("expected rehash or state, got {}", other.name())),
            }
        };
        let digest_match = digest.value() == source_digest;
        let answer = if digest_match {
            Head::Ready
        } else {
            Head::Failed {
                reason: "digest mismatch".into(),
            }
        };
        message::send(&stream, &answer, &[], &[]).map_err(e)?;
        if digest_match {
            let go = message::recv(&stream).map_err(e)?;
            fds += go.fds.len();
            if !matches!(go.head, Head::Go) {
                return Err(format!("expected go, got {}", go.head.name()));
            }
            message::send(&stream, &Head::Resumed, &[], &[]).map_err(e)?;
        }
        Ok(Version1Saw {
            fds,
            regions: n,
            digest_match,
        })
    })
}

/// The rollback of a same-host upgrade: a VMM that hands its disk over
/// moves to a destination of the release before handed fds (76c7980),
/// which refuses an offer with more fds than regions. The source offers
/// the memory's fds alone and, as that destination never agrees a version
/// with a handover, hands it nothing.
#[test]
fn a_source_with_handed_fds_rolls_back_to_a_version_1_destination_handing_it_none() {
    let path = socket("rollback");
    let dest = version_1_destination(&path);
    let mut src = memfd_source();
    src.handed = vec![("disk".into(), disk_file("rollback", b"disk"))];
    let summary = migrate_local(&mut src, &path, &opts());
    let saw = dest.join().unwrap();
    let summary = summary.unwrap_or_else(|e| panic!("{}; the destination: {saw:?}", e.chain()));
    let saw = saw.unwrap();
    assert_eq!(saw.fds, saw.regions, "only the memory's fds: {saw:?}");
    assert!(saw.digest_match, "{saw:?}");
    assert_eq!(summary.status, Outcome::Completed);
    assert_eq!(summary.version, 1);
    assert!(summary.digest_match);
    let _ = std::fs::remove_file(path);
}

/// Sends, as a source of version 1 to `max_version` would, an Offer with
/// memory's fds and a disk (holding `contents`) named in it, to the
/// destination listening on `path`; its answer.
fn offer_naming_a_disk(
    path: &std::path::Path,
    name: &str,
    contents: &[u8],
    max_version: u32,
) -> ferry_engine::local::message::Head {
    use ferry_engine::local::message::{self, Head};
    use std::os::fd::AsRawFd;
    let mut vm = memfd_source();
    let disk = disk_file(name, contents);
    let header = Box::new(StreamHeader::for_vm(&mut vm));
    let ram = Arc::clone(vm.ram());
    let files = ram.region_files().unwrap();
    let mut fds: Vec<_> = files.iter().map(|(_, f, _)| f.as_raw_fd()).collect();
    fds.push(disk.as_raw_fd());
    let offer = Head::Offer {
        version: 1,
        max_version: Some(max_version),
        header,
        offsets: files.iter().map(|(_, _, o)| *o).collect(),
        handed: vec!["disk".into()],
    };
    let stream = std::os::unix::net::UnixStream::connect(path).unwrap();
    message::set_timeouts(&stream, opts().timeout).unwrap();
    message::send(&stream, &offer, &[], &fds).unwrap();
    message::recv(&stream).unwrap().head
}

/// A source of the release before version 3 (version 2 with handed fds)
/// sent its VMM's fds with the Offer, named in `handed`: this destination
/// still takes them from there, and answers as version 2 (Accepted at
/// once, no Agreed, which that source would not understand).
#[test]
fn a_version_2_sources_handed_fds_in_its_offer_are_still_taken() {
    use ferry_engine::local::message::Head;
    let path = socket("v2-source");
    let listener = listen_local(&path).unwrap();
    let dest = std::thread::spawn(move || {
        let mut incoming = await_local(&listener, &opts()).map_err(|e| e.chain())?;
        let mut handed = incoming.take_handed_fds();
        let disk = read_all(handed.take("disk").map_err(|e| e.to_string())?);
        let mut factory = |h: &StreamHeader, ram: GuestRam| {
            Ok(TestVm::on_ram(
                &TestVm::config_from(h, Backing::Memfd)?,
                ram,
            ))
        };
        // The fake source stops after the answer: the move goes no further.
        let _ = receive_local_as(incoming, &mut factory, &opts());
        Ok::<_, String>(disk)
    });
    let answer = offer_naming_a_disk(&path, "v2-source", b"a version-2 disk", 2);
    assert!(
        matches!(answer, Head::Accepted { version: Some(2) }),
        "{answer:?}"
    );
    assert_eq!(dest.join().unwrap().unwrap(), b"a version-2 disk");
    let _ = std::fs::remove_file(path);
}

/// From version 3 on the VMM's fds follow in the Handover: an Offer that
/// speaks 3 and still names handed fds is refused, saying where they go,
/// before anything is mapped or agreed.
#[test]
fn a_version_3_offer_that_names_handed_fds_is_refused() {
    use ferry_engine::local::message::Head;
    let path = socket("v3-named");
    let listener = listen_local(&path).unwrap();
    let dest = std::thread::spawn(move || await_local(&listener, &opts()).map(|_| ()));
    let answer = offer_naming_a_disk(&path, "v3-named", b"disk", 3);
    let Head::Refused { reason } = answer else {
        panic!("expected a refusal, got {answer:?}");
    };
    assert!(reason.contains("follow in the handover"), "{reason}");
    assert!(dest.join().unwrap().is_err());
    let _ = std::fs::remove_file(path);
}
