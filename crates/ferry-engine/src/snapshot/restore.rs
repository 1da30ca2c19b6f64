//! Restoring a VM from a snapshot file. Everything but the guest's pages
//! (the superblock, the manifest, the vCPU state, the sections and the
//! page hashes) is checked before the VM is even built; each page is
//! checked against its hash as it is read, and the whole memory once it
//! is in, before a vCPU runs.

use super::format::{page_offset, Manifest, Superblock};
use super::{RestoreOptions, RestoreSummary};
use crate::digest::{memory_digest, source_digest_threads};
use crate::error::SnapshotError;
use crate::summary::ms;
use crate::wire::{CreateVm, StreamHeader};
use ferry_vm::{Vm, VmError};
use std::fs::File;
use std::path::Path;
use std::time::Instant;

/// What a file holds, checked: everything but the pages.
struct Checked {
    manifest: Manifest,
    vcpus: Vec<u8>,
    sections: Vec<ferry_vm::Section>,
    hashes: Vec<u64>,
}

/// Restores the VM saved in `path`: `create_vm` builds it from the
/// snapshot's header (the factory a migration's destination uses), its
/// memory is read and checked, its vCPUs and devices loaded, and it is
/// started unless `opts.paused`. A damaged or truncated file is refused,
/// naming the part and its offset, and nothing runs from it.
pub fn restore(
    path: &Path,
    create_vm: &mut CreateVm<'_>,
    opts: &RestoreOptions,
) -> Result<(Box<dyn Vm>, RestoreSummary), SnapshotError> {
    let start = Instant::now();
    let file = File::open(path).map_err(SnapshotError::io("open", path))?;
    let checked = check(&file, path)?;
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
    let t = Instant::now();
    let (pages_read, bytes_read) = super::pages::read_all(&file, path, vm.ram(), &checked.hashes)?;
    let read_ms = ms(t.elapsed());
    let mut verify_ms = 0.0;
    if opts.verify {
        let t = Instant::now();
        let restored = memory_digest(vm.ram(), source_digest_threads())
            .map_err(SnapshotError::ram("hash the restored memory"))?;
        verify_ms = ms(t.elapsed());
        if restored.value != checked.manifest.digest {
            return Err(SnapshotError::Digest {
                saved: checked.manifest.digest,
                restored: restored.value,
            });
        }
    }
    ferry_vm::restore_vcpu_state(&mut *vm, &checked.vcpus)
        .map_err(SnapshotError::vm("load the vCPUs' state"))?;
    vm.restore_sections(&checked.sections)
        .map_err(SnapshotError::vm("load the devices' state sections"))?;
    let started = !opts.paused;
    if started {
        vm.start()
            .map_err(SnapshotError::vm("start the restored guest"))?;
    }
    let first_instruction_ms = ms(start.elapsed());
    Ok((
        vm,
        RestoreSummary {
            mode: "eager",
            first_instruction_ms,
            read_ms,
            verify_ms,
            pages_read,
            bytes_read,
            digest_match: opts.verify,
            started,
        },
    ))
}

/// [`restore`] for a VMM with one VM type `V`: the restored VM comes back
/// as that `V`.
pub fn restore_as<V: Vm>(
    path: &Path,
    create_vm: &mut dyn FnMut(&StreamHeader) -> Result<V, VmError>,
    opts: &RestoreOptions,
) -> Result<(V, RestoreSummary), SnapshotError> {
    let mut boxed = |h: &StreamHeader| create_vm(h).map(|vm| Box::new(vm) as Box<dyn Vm>);
    let (vm, summary) = restore(path, &mut boxed, opts)?;
    let vm: Box<dyn std::any::Any> = vm;
    match vm.downcast::<V>() {
        Ok(vm) => Ok((*vm, summary)),
        // restore returns the VM its factory built, and nothing else.
        Err(_) => unreachable!("restore returned a VM its factory did not build"),
    }
}

/// Reads and checks everything in the file but the pages.
fn check(file: &File, path: &Path) -> Result<Checked, SnapshotError> {
    let size = file
        .metadata()
        .map_err(SnapshotError::io("stat", path))?
        .len();
    let superblock = Superblock::read(file, size, path)?;
    let json = superblock.manifest.read(file, size, path, "manifest")?;
    let manifest: Manifest =
        serde_json::from_slice(&json).map_err(|e| SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    let frames = manifest.header.pages();
    if manifest.digest_pages != frames {
        return Err(SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: format!(
                "its digest covers {} frames, its memory {frames}",
                manifest.digest_pages
            ),
        });
    }
    let pages_end = page_offset(frames);
    if pages_end > size {
        return Err(SnapshotError::Truncated {
            path: path.to_path_buf(),
            part: "pages",
            offset: page_offset(0),
            len: pages_end - page_offset(0),
            size,
        });
    }
    let vcpus = manifest.vcpus.read(file, size, path, "vCPU state")?;
    let sections = manifest.sections.read(file, size, path, "sections")?;
    let sections =
        crate::wire::sections::decode(&sections).map_err(|e| SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: format!("its sections cannot be decoded: {e}"),
        })?;
    let raw = manifest.page_hashes.read(file, size, path, "page hashes")?;
    if raw.len() as u64 != frames * 8 {
        return Err(SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: format!("it holds {} page hashes for {frames} frames", raw.len() / 8),
        });
    }
    let hashes: Vec<u64> = raw
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    if crate::digest::digest_of(&hashes).value != manifest.digest {
        return Err(SnapshotError::Manifest {
            path: path.to_path_buf(),
            detail: "its page hashes do not make its digest".into(),
        });
    }
    Ok(Checked {
        manifest,
        vcpus,
        sections,
        hashes,
    })
}
