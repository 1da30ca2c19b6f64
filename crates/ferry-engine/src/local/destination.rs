//! The destination of a same-host migration.

use super::digest::LocalDigest;
use super::message::{self, Head};
use super::{LocalError, LocalOptions, LocalSummary};
use crate::error::MigrationError;
use crate::summary::{ms, Outcome};
use crate::wire::{self, StreamHeader};
use ferry_vm::{Backing, GuestRam, Lifecycle, SharedRegion, Vm, VmError};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Instant;

/// hugetlbfs's magic number in `statfs`.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// Listens on the UNIX socket `path`, replacing a stale socket there (but
/// never another kind of file).
pub fn listen_local(path: &Path) -> Result<UnixListener, MigrationError> {
    let bind = |source| LocalError::Path {
        what: "listen on",
        path: path.into(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(bind(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is there",
            ))
            .into());
        }
        std::fs::remove_file(path).map_err(bind)?;
    }
    Ok(UnixListener::bind(path).map_err(bind)?)
}

/// A same-host migration that has arrived: the VM it offers and its
/// memory's files.
pub struct LocalIncoming {
    stream: UnixStream,
    header: StreamHeader,
    regions: Vec<SharedRegion>,
    backing: Backing,
    start: Instant,
    handed: HandedFds,
    /// The protocol version both ends speak.
    version: u32,
    /// Whether the source named its newest version (and so expects to
    /// hear the chosen one).
    ranged: bool,
}

impl LocalIncoming {
    /// The VM on offer: its VMM, configuration, regions and sections.
    pub fn header(&self) -> &StreamHeader {
        &self.header
    }

    /// The fds the source's VMM handed over by name (its disk, tap,
    /// eventfds...), for the factory to adopt: take them before
    /// `receive_local`, and move them into the factory.
    pub fn take_handed_fds(&mut self) -> HandedFds {
        std::mem::take(&mut self.handed)
    }
}

/// Fds a same-host source handed over by name
/// ([`ferry_vm::Vm::handover_fds`]). Those not taken are closed.
#[derive(Debug, Default)]
pub struct HandedFds(Vec<(String, OwnedFd)>);

impl HandedFds {
    /// The names handed, in order.
    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Takes the fd handed as `name`; one the source did not hand over is
    /// refused, naming what it did hand.
    pub fn take(&mut self, name: &str) -> Result<OwnedFd, LocalError> {
        match self.0.iter().position(|(n, _)| n == name) {
            Some(i) => Ok(self.0.remove(i).1),
            None => Err(LocalError::NoHandedFd {
                name: name.to_string(),
                handed: match self.names() {
                    names if names.is_empty() => "none".into(),
                    names => names.join(", "),
                },
            }),
        }
    }
}

/// Waits on `listener` for a source, and reads its offer and files. From
/// version 3 on it answers an offer it can take with Agreed and reads the
/// source VMM's handed fds from the Handover that follows, so that a
/// source hands them only to a destination that expects them.
pub fn await_local(
    listener: &UnixListener,
    opts: &LocalOptions,
) -> Result<LocalIncoming, MigrationError> {
    let (stream, _) = listener.accept().map_err(|source| LocalError::Socket {
        what: "accept",
        message: "a source",
        source,
    })?;
    let start = Instant::now();
    message::set_timeouts(&stream, opts.timeout)?;
    let offer = message::recv(&stream)?;
    let refuse = |stream: &UnixStream, why: String| {
        let _ = message::send(
            stream,
            &Head::Refused {
                reason: why.clone(),
            },
            &[],
            &[],
        );
        MigrationError::from(LocalError::Protocol(why))
    };
    let Head::Offer {
        version,
        max_version,
        header,
        offsets,
        handed,
    } = offer.head
    else {
        return Err(refuse(
            &stream,
            format!("expected an offer, got {}", offer.head.name()),
        ));
    };
    let version = match message::negotiate(version, max_version) {
        Ok(v) => v,
        Err(why) => return Err(refuse(&stream, why)),
    };
    let n = header.regions.len();
    let after_agreeing = message::hands_over_after_agreeing(version);
    if after_agreeing && !handed.is_empty() {
        return Err(refuse(
            &stream,
            format!(
                "a version-{version} offer names {} handed fds: from version {} on they \
                 follow in the handover",
                handed.len(),
                message::HANDOVER_VERSION
            ),
        ));
    }
    if offer.fds.len() != n + handed.len() || offsets.len() != n {
        return Err(refuse(
            &stream,
            format!(
                "{n} regions and {} named fds, but {} files and {} offsets",
                handed.len(),
                offer.fds.len(),
                offsets.len()
            ),
        ));
    }
    let mut fds = offer.fds;
    // A version-2 source's fds came with its offer; from version 3 on they
    // follow once the version is agreed, so that a source never sends an
    // older destination fds it does not expect.
    let named = if after_agreeing {
        message::send(&stream, &Head::Agreed { version }, &[], &[])?;
        let handover = message::recv(&stream)?;
        let Head::Handover { handed } = handover.head else {
            return Err(refuse(
                &stream,
                format!("expected the handover, got {}", handover.head.name()),
            ));
        };
        if handover.fds.len() != handed.len() {
            return Err(refuse(
                &stream,
                format!(
                    "a handover of {} named fds with {} fds",
                    handed.len(),
                    handover.fds.len()
                ),
            ));
        }
        handed.into_iter().zip(handover.fds).collect()
    } else {
        handed.into_iter().zip(fds.split_off(n)).collect()
    };
    let mut regions = Vec::with_capacity(n);
    for ((region, fd), offset) in header.regions.iter().zip(fds).zip(offsets) {
        regions.push(SharedRegion {
            gpa: ferry_vm::Gpa(region.gpa),
            size: region.bytes,
            file: File::from(fd),
            offset,
        });
    }
    let backing = match regions.first() {
        Some(r) if on_hugetlbfs(&r.file) => Backing::Hugetlb,
        _ => Backing::Memfd,
    };
    Ok(LocalIncoming {
        stream,
        header: *header,
        regions,
        backing,
        start,
        handed: HandedFds(named),
        version,
        ranged: max_version.is_some(),
    })
}

fn on_hugetlbfs(file: &File) -> bool {
    // SAFETY: statfs is plain data; fstatfs fills it for a valid fd.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    rc == 0 && st.f_type as i64 == HUGETLBFS_MAGIC
}

/// Builds the destination VM on the source's memory: the header says what
/// VM, the `GuestRam` is made from the source's files (build the VM's
/// memory slots and devices on it).
pub type CreateLocalVm<'a> =
    dyn FnMut(&StreamHeader, GuestRam) -> Result<Box<dyn Vm>, VmError> + 'a;

/// [`receive_local`] for a VMM with one VM type `V`, which it gets back.
pub fn receive_local_as<V: Vm>(
    incoming: LocalIncoming,
    create_vm: &mut dyn FnMut(&StreamHeader, GuestRam) -> Result<V, VmError>,
    opts: &LocalOptions,
) -> Result<(V, LocalSummary), MigrationError> {
    let mut boxed =
        |h: &StreamHeader, ram: GuestRam| create_vm(h, ram).map(|vm| Box::new(vm) as Box<dyn Vm>);
    let (vm, summary) = receive_local(incoming, &mut boxed, opts)?;
    let vm: Box<dyn std::any::Any> = vm;
    match vm.downcast::<V>() {
        Ok(vm) => Ok((*vm, summary)),
        // receive_local returns the VM its factory built, and nothing else.
        Err(_) => unreachable!("receive_local returned a VM its factory did not build"),
    }
}

/// Takes the VM `incoming` offers: maps its memory, has `create_vm` build
/// the VM on it, loads the state, checks the digest, resumes the guest,
/// and returns the running VM.
pub fn receive_local(
    incoming: LocalIncoming,
    create_vm: &mut CreateLocalVm<'_>,
    opts: &LocalOptions,
) -> Result<(Box<dyn Vm>, LocalSummary), MigrationError> {
    // Fds the caller did not take are closed here.
    let LocalIncoming {
        stream,
        header,
        regions,
        backing,
        start,
        handed: _,
        version,
        ranged,
    } = incoming;
    let fail = |stream: &UnixStream, head: Head, e: MigrationError| {
        let _ = message::send(stream, &head, &[], &[]);
        e
    };
    let built = GuestRam::from_files(regions, backing)
        .map_err(MigrationError::ram("map the source's memory"))
        .and_then(|ram| {
            create_vm(&header, ram).map_err(MigrationError::backend("create the destination VM"))
        })
        .and_then(|mut vm| {
            header.check_destination(&mut *vm)?;
            wire::sections::check_manifest(&header.sections, &vm.state_sections())?;
            Ok(vm)
        });
    let mut vm = match built {
        Ok(vm) => vm,
        Err(e) => {
            let reason = e.chain();
            return Err(fail(&stream, Head::Refused { reason }, e));
        }
    };
    vm.migration_event(Lifecycle::Started);
    let mut summary = LocalSummary::new(&header.vmm, vm.ram().size(), header.regions.len());
    summary.version = version;
    let accepted = Head::Accepted {
        version: ranged.then_some(version),
    };
    match take_over(&mut *vm, &stream, &header, accepted, opts, &mut summary) {
        Ok(()) => {
            summary.status = Outcome::Completed;
            summary.total_ms = ms(start.elapsed());
            vm.migration_event(Lifecycle::Completed);
            Ok((vm, summary))
        }
        Err(e) => {
            if vm.is_running() {
                let _ = vm.pause();
            }
            vm.migration_event(Lifecycle::Aborted(&e.chain()));
            Err(e)
        }
    }
}

fn take_over(
    vm: &mut dyn Vm,
    stream: &UnixStream,
    header: &StreamHeader,
    accepted: Head,
    opts: &LocalOptions,
    summary: &mut LocalSummary,
) -> Result<(), MigrationError> {
    let ram = std::sync::Arc::clone(vm.ram());
    let hashing = Instant::now();
    let mut digest = LocalDigest::scan(&ram)?;
    summary.hash_ms = ms(hashing.elapsed());
    message::send(stream, &accepted, &[], &[])?;

    let state = loop {
        let m = message::recv(stream)?;
        let Head::Rehash = &m.head else {
            break m;
        };
        let [bitmap] = m.blobs.as_slice() else {
            return Err(LocalError::Protocol("a rehash without its dirty bitmap".into()).into());
        };
        digest.refresh_runs(
            &ram,
            &message::dirty_from(bitmap, ram.pages(), summary.version)?,
        )?;
        summary.rehash_rounds += 1;
        message::send(stream, &Head::Rehashed, &[], &[])?;
    };
    let arrived = Instant::now();
    let Head::State {
        digest: source_digest,
    } = state.head
    else {
        return Err(
            LocalError::Protocol(format!("expected the state, got {}", state.head.name())).into(),
        );
    };
    let loaded = load(vm, &ram, &state.blobs, header, &mut digest, summary);
    let loaded = loaded.and_then(|()| {
        summary.digest_match = digest.value() == source_digest;
        if summary.digest_match {
            Ok(())
        } else {
            Err(LocalError::DigestMismatch {
                source_digest,
                destination_digest: digest.value(),
            }
            .into())
        }
    });
    if let Err(e) = loaded {
        let reason = e.chain();
        let _ = message::send(stream, &Head::Failed { reason }, &[], &[]);
        return Err(e);
    }
    if let Some(probe) = &opts.probe {
        summary.guest = Some(probe.read(vm).map_err(MigrationError::Probe)?);
    }
    message::send(stream, &Head::Ready, &[], &[])?;
    match message::recv(stream)?.head {
        Head::Go => {}
        other => {
            return Err(LocalError::Protocol(format!("expected go, got {}", other.name())).into())
        }
    }
    vm.start()
        .map_err(MigrationError::backend("resume the guest"))?;
    summary.downtime_ms = ms(arrived.elapsed());
    // The source committed at Go: the guest is this side's now, even if
    // the source is gone before it hears so.
    if let Err(e) = message::send(stream, &Head::Resumed, &[], &[]) {
        tracing::warn!("the guest runs here, but the source did not hear so: {e}");
    }
    Ok(())
}

/// Loads the vCPU state and sections, and rehashes what was dirty.
fn load(
    vm: &mut dyn Vm,
    ram: &GuestRam,
    blobs: &[Vec<u8>],
    header: &StreamHeader,
    digest: &mut LocalDigest,
    summary: &mut LocalSummary,
) -> Result<(), MigrationError> {
    let [vcpus, sections, dirty] = blobs else {
        return Err(LocalError::Protocol(format!("{} state blobs, not 3", blobs.len())).into());
    };
    summary.state_bytes = (vcpus.len() + sections.len()) as u64;
    let runs = message::dirty_from(dirty, ram.pages(), summary.version)?;
    summary.dirty_pages = digest.refresh_runs(ram, &runs)?;
    ferry_vm::restore_vcpu_state(vm, vcpus)
        .map_err(MigrationError::backend("load the vCPU state"))?;
    let sections = wire::sections::decode(sections)?;
    wire::sections::check_sections(&sections, &header.sections, &vm.state_sections())?;
    vm.restore_sections(&sections)
        .map_err(MigrationError::backend("load the device sections"))?;
    Ok(())
}

#[cfg(test)]
mod handed_tests {
    use super::*;

    #[test]
    fn a_handed_fd_is_taken_once_by_name_and_a_missing_one_is_named() {
        let file = File::open("/proc/self/stat").unwrap();
        let mut handed = HandedFds(vec![("disk".into(), OwnedFd::from(file))]);
        assert_eq!(handed.names(), ["disk"]);
        let err = handed.take("tap0").unwrap_err().to_string();
        assert_eq!(
            err,
            "the source handed over no fd named 'tap0' (it handed: disk)"
        );
        handed.take("disk").unwrap();
        let err = handed.take("disk").unwrap_err().to_string();
        assert_eq!(
            err,
            "the source handed over no fd named 'disk' (it handed: none)"
        );
    }
}
