//! Restoring a VM from a snapshot file. Everything but the guest's pages
//! (the superblock, the manifest, the vCPU state, the sections, the page
//! hashes and the working set) is checked before the VM is even built.
//! Eager: each page is checked against its hash as it is read, and the
//! whole memory once it is in, before a vCPU runs. Lazy ([`super::lazy`]):
//! the vCPUs run at once, each page is checked as it comes in, and the
//! placed pages' hashes against the digest once all are in.

use super::chain::PageSource;
use super::checked::{check, Checked};
use super::lazy::LazyPages;
use super::{working_set, RestoreMode, RestoreOptions, RestoreSummary, SnapshotInfo};
use crate::digest::{memory_digest, source_digest_threads};
use crate::error::SnapshotError;
use crate::summary::ms;
use crate::wire::{CreateVm, StreamHeader};
use ferry_vm::{Vm, VmError};
use std::fs::File;
use std::path::Path;
use std::time::Instant;

/// A restored VM's memory while it comes in, returned with the VM by
/// [`restore`]: [`Restoring::finish`] waits for the last page and says
/// what the restore did. An eager restore is finished already.
#[must_use = "a lazy restore's pages come in until finish() says they are all in"]
pub struct Restoring {
    summary: RestoreSummary,
    lazy: Option<LazyPages>,
    /// The snapshot's memory digest.
    digest: u64,
    verify: bool,
}

impl Restoring {
    /// What the restore has done so far: its mode and first instruction.
    pub fn summary(&self) -> &RestoreSummary {
        &self.summary
    }

    /// Waits until every page of `vm` (the VM [`restore`] returned with
    /// this) is in, and checks the digest of the pages placed. A page that
    /// fails its check stops the guest (it is paused, and its vCPUs never
    /// see the page), and the error names the page and its file offset.
    /// Dropping a lazy restore unfinished still waits for every page.
    pub fn finish(self, vm: &mut dyn Vm) -> Result<RestoreSummary, SnapshotError> {
        let Restoring {
            mut summary,
            lazy,
            digest,
            verify,
        } = self;
        let Some(lazy) = lazy else {
            return Ok(summary);
        };
        let report = lazy.finish(|| match vm.is_running() {
            true => vm.pause().map_err(SnapshotError::vm(
                "stop the guest restored from a damaged file",
            )),
            false => Ok(()),
        })?;
        if report.devices_served {
            // Every page is in: the devices drop their userfaultfds, as at
            // the end of a postcopy.
            vm.migration_event(ferry_vm::Lifecycle::Completed);
        }
        summary.device_faults = report.device_faults;
        summary.working_set_ms = report.working_set_ms.max(summary.first_instruction_ms);
        summary.resident_ms = report.resident_ms;
        summary.blocking_faults = report.blocking_faults;
        summary.fault_pages = report.fault_pages;
        summary.pages_read = report.bytes_read / ferry_vm::PAGE_SIZE as u64;
        summary.bytes_read = report.bytes_read;
        summary.first_touch_pages = report.first_touches.len() as u64;
        summary.first_touches = report.first_touches;
        if verify {
            if report.digest != digest {
                if vm.is_running() {
                    vm.pause()
                        .map_err(SnapshotError::vm("pause the unverified guest"))?;
                }
                return Err(SnapshotError::Digest {
                    saved: digest,
                    restored: report.digest,
                });
            }
            summary.digest_match = true;
        }
        Ok(summary)
    }
}

/// Restores the VM saved in `path`: `create_vm` builds it from the
/// snapshot's header (the factory a migration's destination uses), its
/// memory comes in as `opts.mode` says, its vCPUs and devices are loaded,
/// and it is started unless `opts.paused`. A damaged or truncated file is
/// refused, naming the part and its offset, and nothing runs from it.
/// Call [`Restoring::finish`] on what comes back with the VM.
pub fn restore(
    path: &Path,
    create_vm: &mut CreateVm<'_>,
    opts: &RestoreOptions,
) -> Result<(Box<dyn Vm>, Restoring), SnapshotError> {
    let start = Instant::now();
    let file = File::open(path).map_err(SnapshotError::io("open", path))?;
    let checked = check(&file, path)?;
    // A diff's chain, each parent checked, before the VM is built.
    let source = PageSource::open(file, path, &checked)?;
    let header = &checked.manifest.header;
    let mut vm = create_vm(header).map_err(SnapshotError::vm("build the VM for the snapshot"))?;
    header
        .check_destination(&mut *vm)
        .map_err(|e| SnapshotError::Header(e.to_string()))?;
    if vm.ram().pages() != checked.hashes.len() as u64 {
        return Err(SnapshotError::Header(format!(
            "the VM built has {} frames of memory, the snapshot {}",
            vm.ram().pages(),
            checked.hashes.len()
        )));
    }
    crate::wire::sections::check_sections(
        &checked.sections,
        &header.sections,
        &vm.state_sections(),
    )
    .map_err(|e| SnapshotError::Header(e.to_string()))?;
    let mut summary = RestoreSummary {
        mode: opts.mode.name(),
        first_instruction_ms: 0.0,
        working_set_ms: 0.0,
        resident_ms: 0.0,
        working_set_pages: working_set::pages(&checked.working_set),
        blocking_faults: 0,
        fault_pages: 0,
        fault_path: "none",
        read_ms: 0.0,
        verify_ms: 0.0,
        pages_read: 0,
        bytes_read: 0,
        digest_match: false,
        started: !opts.paused,
        first_touch_pages: 0,
        first_touches: Vec::new(),
        device_faults: 0,
    };
    let mut lazy = match opts.mode {
        RestoreMode::Eager => {
            read_eagerly(&source, &mut *vm, &checked, opts, &mut summary)?;
            None
        }
        RestoreMode::Lazy | RestoreMode::LazyWorkingSet => {
            let first = opts.mode == RestoreMode::LazyWorkingSet;
            Some(start_lazily(
                source,
                &mut *vm,
                &checked,
                first,
                start,
                &mut summary,
            )?)
        }
    };
    let loaded = load_and_start(&mut *vm, &checked, opts, lazy.as_mut());
    if let Err(e) = loaded {
        if let Some(l) = lazy {
            l.abandon();
        }
        return Err(e);
    }
    summary.first_instruction_ms = ms(start.elapsed());
    if lazy.is_none() {
        summary.working_set_ms = summary.first_instruction_ms;
        summary.resident_ms = summary.first_instruction_ms;
    }
    Ok((
        vm,
        Restoring {
            summary,
            lazy,
            digest: checked.manifest.digest,
            verify: opts.verify,
        },
    ))
}

/// Reads every page before a vCPU runs, and checks the whole memory.
fn read_eagerly(
    source: &PageSource,
    vm: &mut dyn Vm,
    checked: &Checked,
    opts: &RestoreOptions,
    summary: &mut RestoreSummary,
) -> Result<(), SnapshotError> {
    let t = Instant::now();
    let (pages_read, bytes_read) = super::pages::read_all(source, vm.ram(), &checked.hashes)?;
    summary.read_ms = ms(t.elapsed());
    summary.pages_read = pages_read;
    summary.bytes_read = bytes_read;
    if opts.verify {
        let t = Instant::now();
        let restored = memory_digest(vm.ram(), source_digest_threads())
            .map_err(SnapshotError::ram("hash the restored memory"))?;
        summary.verify_ms = ms(t.elapsed());
        if restored.value != checked.manifest.digest {
            return Err(SnapshotError::Digest {
                saved: checked.manifest.digest,
                restored: restored.value,
            });
        }
        summary.digest_match = true;
    }
    Ok(())
}

/// Empties the VM's memory and starts serving it from the file: faults
/// through userfaultfd, or the VM's own fault exits where it has them.
fn start_lazily(
    source: PageSource,
    vm: &mut dyn Vm,
    checked: &Checked,
    working_set_first: bool,
    start: Instant,
    summary: &mut RestoreSummary,
) -> Result<LazyPages, SnapshotError> {
    let lazy = LazyPages::start(
        source,
        std::sync::Arc::clone(vm.ram()),
        checked.hashes.clone(),
        &checked.working_set,
        working_set_first,
        start,
    )?;
    summary.fault_path = match vm
        .memory_faults()
        .map(|m| m.set_fault_exits(lazy.fault_exits()))
    {
        Some(Ok(())) => "vcpu exit",
        Some(Err(e)) => {
            tracing::debug!("faults go through userfaultfd: {e}");
            "userfaultfd"
        }
        None => "userfaultfd",
    };
    Ok(lazy)
}

/// Loads the vCPUs and devices, and starts the guest unless asked not to.
/// In a lazy restore, devices in other processes that map guest memory (a
/// vhost-user backend) hand over their userfaultfds between the two, as on
/// a postcopy destination: a touch of theirs then waits for its page
/// instead of finding a hole.
fn load_and_start(
    vm: &mut dyn Vm,
    checked: &Checked,
    opts: &RestoreOptions,
    lazy: Option<&mut LazyPages>,
) -> Result<(), SnapshotError> {
    ferry_vm::restore_vcpu_state(vm, &checked.vcpus)
        .map_err(SnapshotError::vm("load the vCPUs' state"))?;
    vm.restore_sections(&checked.sections)
        .map_err(SnapshotError::vm("load the devices' state sections"))?;
    if let Some(lazy) = lazy {
        let devices = vm.device_userfaultfds().map_err(SnapshotError::vm(
            "ask the devices in other processes for their userfaultfds",
        ))?;
        lazy.serve_devices(devices);
    }
    if !opts.paused {
        vm.start()
            .map_err(SnapshotError::vm("start the restored guest"))?;
    }
    Ok(())
}

/// [`restore`] for a VMM with one VM type `V`: the restored VM comes back
/// as that `V`.
pub fn restore_as<V: Vm>(
    path: &Path,
    create_vm: &mut dyn FnMut(&StreamHeader) -> Result<V, VmError>,
    opts: &RestoreOptions,
) -> Result<(V, Restoring), SnapshotError> {
    let mut boxed = |h: &StreamHeader| create_vm(h).map(|vm| Box::new(vm) as Box<dyn Vm>);
    let (vm, restoring) = restore(path, &mut boxed, opts)?;
    let vm: Box<dyn std::any::Any> = vm;
    match vm.downcast::<V>() {
        Ok(vm) => Ok((*vm, restoring)),
        // restore returns the VM its factory built, and nothing else.
        Err(_) => unreachable!("restore returned a VM its factory did not build"),
    }
}

/// What a snapshot file holds, read and checked without building a VM:
/// every part but the pages is CRC-checked, as a restore checks it first.
pub fn inspect(path: &Path) -> Result<SnapshotInfo, SnapshotError> {
    let file = File::open(path).map_err(SnapshotError::io("open", path))?;
    let c = check(&file, path)?;
    let h = &c.manifest.header;
    Ok(SnapshotInfo {
        ferry: c.manifest.ferry.clone(),
        vmm: h.vmm.clone(),
        vcpus: h.vcpus,
        memory_bytes: h.memory_bytes,
        sections: c.sections.iter().map(|s| s.id.to_string()).collect(),
        digest: c.manifest.digest,
        data_pages: c.manifest.data_pages,
        stopped: c.manifest.stopped,
        created_unix_s: c.manifest.created_unix_s,
        parent: c.manifest.parent.as_ref().map(|p| p.path.clone()),
        frames_held: c
            .present
            .as_ref()
            .map_or(c.hashes.len() as u64, |p| p.count()),
        working_set_pages: working_set::pages(&c.working_set),
        working_set: c.working_set,
    })
}
