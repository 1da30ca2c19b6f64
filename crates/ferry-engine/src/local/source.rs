//! The source of a same-host migration.

use super::digest::LocalDigest;
use super::message::{self, Head};
use super::{LocalError, LocalOptions, LocalSummary, PausePhases};
use crate::dirty_logs;
use crate::error::MigrationError;
use crate::summary::{ms, Outcome};
use crate::wire::{self, StreamHeader};
use ferry_vm::{BlockScope, DirtyPages, Lifecycle, Vm};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

/// Rounds of rehashing a busy guest's pages before the pause, at most.
const MAX_REHASH_ROUNDS: u32 = 8;
/// Few enough dirty pages to rehash during the pause (1 MiB, a small part
/// of a millisecond on each end). Larger, and the pause grew with memory: a
/// guest dirties pages for as long as the first hash takes, which grows with
/// memory, and up to this many were then left for the pause (at 4096 pages,
/// milliseconds on each end of a 16 GiB move, none of a 1 GiB one; see
/// docs/results.md, "Same-host upgrade").
const PAUSE_REHASH_PAGES: u64 = 256;

/// Where the source stands, for what a failure must undo.
#[derive(PartialEq)]
enum Stage {
    /// The guest runs here.
    Running,
    /// Paused here; the destination has not been told to resume.
    Paused,
    /// Told to resume: the guest is the destination's.
    Committed,
}

/// Moves the running `vm` to the destination listening on `socket`
/// ([`super::listen_local`]) on this host, handing it the memory's files.
///
/// On `Err` before the commit the guest runs here again, as it did; after
/// it ([`LocalError::Unconfirmed`]) the VM stays paused.
pub fn migrate_local(
    vm: &mut dyn Vm,
    socket: &Path,
    opts: &LocalOptions,
) -> Result<LocalSummary, MigrationError> {
    let start = Instant::now();
    let blocker = vm
        .blockers()
        .into_iter()
        .find(|b| b.scope == BlockScope::Migration);
    if let Some(b) = blocker {
        return Err(MigrationError::Refused(format!(
            "the VM cannot migrate: {}",
            b.reason
        )));
    }
    let ram = std::sync::Arc::clone(vm.ram());
    let files = ram.region_files().ok_or(LocalError::NotFileBacked)?;
    let stream = UnixStream::connect(socket).map_err(|source| LocalError::Path {
        what: "connect to",
        path: socket.into(),
        source,
    })?;
    message::set_timeouts(&stream, opts.timeout)?;
    dirty_logs::start(vm)?;
    vm.migration_event(Lifecycle::Started);
    let mut summary = LocalSummary::new(vm.vmm_id(), ram.size(), files.len());
    let mut stage = Stage::Running;
    let fds: Vec<_> = files.iter().map(|(_, f, _)| f.as_raw_fd()).collect();
    let offsets = files.iter().map(|(_, _, o)| *o).collect();
    let result = switch_over(vm, &stream, &fds, offsets, opts, &mut summary, &mut stage);
    dirty_logs::stop(vm, "after a same-host migration");
    summary.total_ms = ms(start.elapsed());
    match result {
        Ok(()) => {
            summary.status = Outcome::Completed;
            vm.migration_event(Lifecycle::Completed);
            Ok(summary)
        }
        Err(e) => {
            if stage == Stage::Paused {
                vm.start()
                    .map_err(MigrationError::backend("resume the guest after a failure"))?;
            }
            vm.migration_event(Lifecycle::Aborted(&e.chain()));
            Err(e)
        }
    }
}

fn switch_over(
    vm: &mut dyn Vm,
    stream: &UnixStream,
    fds: &[i32],
    offsets: Vec<u64>,
    opts: &LocalOptions,
    summary: &mut LocalSummary,
    stage: &mut Stage,
) -> Result<(), MigrationError> {
    let header = StreamHeader::for_vm(vm);
    let ram = std::sync::Arc::clone(vm.ram());
    // What the logs held before now is covered by the hash that follows.
    let mut dirty = DirtyPages::new(ram.pages());
    dirty_logs::collect(vm, &mut dirty)?;
    dirty.clear();
    let handed = vm.handover_fds();
    // The memory's fds alone: the VMM's own follow only once the
    // destination has agreed a version that takes them (3), as a version-1
    // destination refuses an offer with more fds than regions.
    let offer = Head::Offer {
        version: message::MIN_VERSION,
        max_version: Some(message::VERSION),
        header: Box::new(header),
        offsets,
        handed: Vec::new(),
    };
    message::send(stream, &offer, &[], fds)?;
    // Memory is hashed while the destination builds its VM, as before
    // the handshake had a second step: here on a thread of its own.
    let (scanned, agreed) = std::thread::scope(|s| -> Result<_, LocalError> {
        let hash = || {
            let hashing = Instant::now();
            LocalDigest::scan(&ram).map(|d| (d, ms(hashing.elapsed())))
        };
        let hasher = std::thread::Builder::new()
            .name("local-hash".into())
            .spawn_scoped(s, hash)
            .map_err(|source| LocalError::Thread { source })?;
        let agreed = handshake(stream, &handed);
        match hasher.join() {
            Ok(scanned) => Ok((scanned, agreed)),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })?;
    // A refusal says more than a hash that failed meanwhile.
    let version = agreed?;
    let (mut digest, hash_ms) = scanned?;
    summary.hash_ms = hash_ms;
    summary.version = version;
    // A busy guest dirtied pages while memory was hashed: rehash them on
    // both ends while it runs, until few are left for the pause.
    let mut last = u64::MAX;
    for _ in 0..MAX_REHASH_ROUNDS {
        dirty_logs::collect(vm, &mut dirty)?;
        let n = dirty.count();
        if n <= PAUSE_REHASH_PAGES || n * 2 > last {
            break;
        }
        message::send(
            stream,
            &Head::Rehash,
            &[&message::dirty_blob(&dirty, version)],
            &[],
        )?;
        digest.refresh(&ram, &dirty)?;
        match message::recv(stream)?.head {
            Head::Rehashed => {}
            other => return Err(unexpected("rehashed", &other)),
        }
        summary.rehash_rounds += 1;
        dirty.clear();
        last = n;
    }

    let paused = Instant::now();
    let mut lap = Lap::new();
    let mut phases = PausePhases::default();
    vm.pause()
        .map_err(MigrationError::backend("pause the guest"))?;
    *stage = Stage::Paused;
    if let Some(probe) = &opts.probe {
        summary.guest = Some(probe.read(vm).map_err(MigrationError::Probe)?);
    }
    phases.stop_ms = lap.next();
    // Saving a device may write guest memory: harvest after it.
    let mut sections = vm
        .save_sections()
        .map_err(MigrationError::backend("save the device sections"))?;
    // Versions and what a section declared hold here too.
    let specs = vm.state_sections();
    wire::sections::check_saved(
        &mut sections,
        &wire::sections::manifest(&specs),
        &wire::sections::declared(&specs),
    )?;
    let vcpus =
        ferry_vm::save_vcpu_state(vm).map_err(MigrationError::backend("save the vCPU state"))?;
    phases.save_ms = lap.next();
    dirty_logs::collect(vm, &mut dirty)?;
    phases.harvest_ms = lap.next();
    summary.dirty_pages = digest.refresh(&ram, &dirty)?;
    phases.rehash_ms = lap.next();
    let sections = wire::sections::encode(&sections);
    summary.state_bytes = (vcpus.len() + sections.len()) as u64;
    let state = Head::State {
        digest: digest.value(),
    };
    message::send(
        stream,
        &state,
        &[&vcpus, &sections, &message::dirty_blob(&dirty, version)],
        &[],
    )?;
    match message::recv(stream)?.head {
        Head::Ready => {}
        Head::Failed { reason } => {
            summary.digest_match = !reason.contains("digest mismatch");
            return Err(LocalError::Failed(reason).into());
        }
        other => return Err(unexpected("ready", &other)),
    }
    phases.destination_ms = lap.next();
    summary.digest_match = true;
    // From here the guest is the destination's, whatever happens.
    *stage = Stage::Committed;
    // Whether the destination got Go cannot be known if this fails: it may
    // run the guest.
    if message::send(stream, &Head::Go, &[], &[]).is_err() {
        summary.status = Outcome::Held;
        return Err(LocalError::Unconfirmed.into());
    }
    match message::recv(stream) {
        Ok(m) if matches!(m.head, Head::Resumed) => {}
        _ => {
            summary.status = Outcome::Held;
            return Err(LocalError::Unconfirmed.into());
        }
    }
    phases.resume_ms = lap.next();
    summary.pause = Some(phases);
    summary.downtime_ms = ms(paused.elapsed());
    Ok(())
}

/// The destination's answer to the offer, and the version both speak:
/// a version-3 destination agrees first and is handed the VMM's fds
/// (`handed`, possibly none) before it accepts; an older one accepts or
/// refuses at once, and is handed nothing (its VMM opens its files by
/// path).
fn handshake(
    stream: &UnixStream,
    handed: &[(String, std::os::fd::RawFd)],
) -> Result<u32, MigrationError> {
    let in_range = |version: u32| {
        if (message::MIN_VERSION..=message::VERSION).contains(&version) {
            Ok(version)
        } else {
            Err(MigrationError::from(LocalError::Protocol(format!(
                "the destination chose version {version} of the same-host protocol, \
                 which this ferry ({}-{}) did not offer",
                message::MIN_VERSION,
                message::VERSION
            ))))
        }
    };
    match message::recv(stream)?.head {
        Head::Agreed { version } => {
            let version = in_range(version)?;
            if !message::hands_over_after_agreeing(version) {
                return Err(LocalError::Protocol(format!(
                    "the destination agreed version {version}, which has no handover"
                ))
                .into());
            }
            let names = handed.iter().map(|(n, _)| n.clone()).collect();
            let fds: Vec<_> = handed.iter().map(|(_, fd)| *fd).collect();
            message::send(stream, &Head::Handover { handed: names }, &[], &fds)?;
            match message::recv(stream)?.head {
                Head::Accepted { version: v } if v.is_none_or(|v| v == version) => Ok(version),
                Head::Accepted { version: Some(v) } => Err(LocalError::Protocol(format!(
                    "the destination agreed version {version}, then accepted in {v}"
                ))
                .into()),
                Head::Refused { reason } => Err(LocalError::Refused(reason).into()),
                other => Err(unexpected("accepted", &other)),
            }
        }
        Head::Accepted { version } => {
            let version = in_range(version.unwrap_or(message::MIN_VERSION))?;
            if message::hands_over_after_agreeing(version) {
                return Err(LocalError::Protocol(format!(
                    "the destination accepted version {version} without agreeing it first"
                ))
                .into());
            }
            Ok(version)
        }
        Head::Refused { reason } => Err(LocalError::Refused(reason).into()),
        other => Err(unexpected("agreed or accepted", &other)),
    }
}

/// Times consecutive phases.
struct Lap(Instant);

impl Lap {
    fn new() -> Self {
        Lap(Instant::now())
    }

    /// The ms since the last call (or since `new`).
    fn next(&mut self) -> f64 {
        let now = Instant::now();
        let d = now - self.0;
        self.0 = now;
        ms(d)
    }
}

fn unexpected(expected: &str, got: &Head) -> MigrationError {
    LocalError::Protocol(format!("expected {expected}, got {}", got.name())).into()
}
