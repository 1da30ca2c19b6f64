//! Saving a running VM to a file: rounds that write the pages the guest
//! dirtied in place while it runs, then a short pause for the rest.

use super::accesses::Accesses;
use super::chain;
use super::converge::FileConvergence;
use super::format::{
    create_sized, encode_present, page_offset, partial_path, Manifest, Tail, FORMAT, FULL_FORMAT,
};
use super::live_proof::{self, ProofAt};
use super::pages::{PageWriter, Written};
use super::working_set;
use super::{SnapshotOptions, SnapshotRound, SnapshotSummary, Steering};
use crate::digest::{digest_of, memory_digest, source_digest_threads, MemoryDigest};
use crate::error::SnapshotError;
use crate::progress::{NoProgress, Phase};
use crate::summary::{ms, RoundKind, RoundStats};
use crate::tunables::{pace, TokenBucket};
use crate::wire::StreamHeader;
use crate::Tunables;
use ferry_vm::{DirtyPages, Vm};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Saves `vm` to `path` while it runs (see [`super`] for the file's
/// layout). The guest runs on afterwards unless `opts.stop`; a VM that was
/// paused stays paused, and is saved in one pass.
///
/// The file is written beside `path` and renamed over it only once it is
/// complete and synced: a failed snapshot leaves whatever `path` held. On
/// any failure the guest runs again if it ran before.
pub fn save(
    vm: &mut dyn Vm,
    path: &Path,
    opts: &SnapshotOptions,
) -> Result<SnapshotSummary, SnapshotError> {
    let steering = Steering {
        progress: &NoProgress,
        tunables: Tunables::shared(),
    };
    save_steered(vm, path, opts, &steering)
}

/// [`save`], watched and steered while it runs (a control socket's
/// snapshot): `steering` hears each round and may cancel it or cap its
/// write rate. A cancelled snapshot fails with
/// [`SnapshotError::Cancelled`], as any failure does: the guest runs on.
pub fn save_steered(
    vm: &mut dyn Vm,
    path: &Path,
    opts: &SnapshotOptions,
    steering: &Steering,
) -> Result<SnapshotSummary, SnapshotError> {
    let start = Instant::now();
    let partial = partial_path(path);
    let was_running = vm.is_running();
    let mut logging = false;
    let mut accesses = Accesses::default();
    let mut converge = FileConvergence::new(vm, opts.converge, opts.max_downtime)?;
    let result = write_file(
        vm,
        &partial,
        opts,
        steering,
        &mut logging,
        &mut accesses,
        &mut converge,
    );
    accesses.stop(vm);
    // Nothing a policy set outlives the snapshot, failed or not (after a
    // settle nothing is in force, and this is no work).
    converge.release(vm);
    let result = result.map_err(|e| match e {
        // Named by the file asked for, not the partial one.
        SnapshotError::Cancelled { .. } => SnapshotError::Cancelled {
            path: path.to_path_buf(),
        },
        e => e,
    });
    if logging {
        crate::dirty_logs::stop(vm, "the snapshot ended");
    }
    let result = result.and_then(|summary| {
        std::fs::rename(&partial, path).map_err(SnapshotError::io("rename", &partial))?;
        Ok(summary)
    });
    match result {
        Ok(mut summary) => {
            sync_dir(path);
            summary.total_ms = ms(start.elapsed());
            Ok(summary)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            if was_running && !vm.is_running() {
                if let Err(restart) = vm.start() {
                    tracing::error!(
                        "the snapshot failed, and the guest cannot run again: {restart}"
                    );
                }
            }
            Err(e)
        }
    }
}

/// Syncs the directory of `path`, so that the rename survives a crash.
fn sync_dir(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        tracing::warn!("cannot sync {}: {e}", dir.display());
    }
}

fn write_file(
    vm: &mut dyn Vm,
    path: &Path,
    opts: &SnapshotOptions,
    steering: &Steering,
    logging: &mut bool,
    accesses: &mut Accesses,
    converge: &mut FileConvergence,
) -> Result<SnapshotSummary, SnapshotError> {
    let progress = steering.progress;
    let tunables = &steering.tunables;
    let bucket = Mutex::new(TokenBucket::new(Arc::clone(tunables)));
    let header = StreamHeader::for_vm(vm);
    let ram = std::sync::Arc::clone(vm.ram());
    let frames = ram.pages();
    let file = create_sized(path, frames)?;
    let pages_end = page_offset(frames);
    let parent = match &opts.parent {
        Some(p) => Some(chain::Parent::open(p, &header)?),
        None => None,
    };
    let mut writer = match &parent {
        Some(p) => PageWriter::diff(&file, path, p.hashes.clone()),
        None => PageWriter::new(&file, path, frames),
    };
    let was_running = vm.is_running();
    let mut rounds = Vec::new();

    // Live rounds: all memory first, then what the guest dirtied meanwhile,
    // until what is left would fit the pause.
    let mut todo = ram.frames();
    let mut recent = working_set::Recorder::new();
    let mut last_accessed = None;
    let mut predicted = Duration::ZERO;
    let mut converged = true;
    if was_running {
        // The meter first, as a migration's: a writer that re-dirties its
        // pages as soon as the logs protect them is seen from the start.
        converge.start(vm);
        crate::dirty_logs::start(vm).map_err(|e| SnapshotError::DirtyLog(Box::new(e)))?;
        *logging = true;
        accesses.start(vm, opts.access_log);
        progress.phase(Phase::FullPass);
        loop {
            let t = Instant::now();
            let n = rounds.len() as u32;
            let total = todo.count();
            progress.round_started(n, total);
            let mut so_far = Written::default();
            // A live round's chunks: paced by the cap, a cancel ends them,
            // and the policy hears of them once per interval.
            let done = writer.write(&ram, &todo, &mut |w: Written| {
                progress.pages_sent(w.pages, w.bytes);
                if tunables.is_cancelled() {
                    return Err(SnapshotError::Cancelled {
                        path: path.to_path_buf(),
                    });
                }
                pace(&bucket, w.bytes);
                so_far = so_far.plus(w);
                let secs = t.elapsed().as_secs_f64();
                let left = total.saturating_sub(so_far.pages);
                converge.between_chunks(vm, tunables, progress, n, (so_far, secs), left)
            })?;
            let took = t.elapsed();
            rounds.push(round(rounds.len(), done, took));
            todo = DirtyPages::new(frames);
            let harvest = Instant::now();
            crate::dirty_logs::collect(vm, &mut todo)
                .map_err(|e| SnapshotError::DirtyLog(Box::new(e)))?;
            progress.round_finished(&stats(n, done, took, todo.count(), harvest.elapsed()));
            let accessed = accesses.harvest(vm);
            recent.record(Instant::now(), &todo, accessed.as_ref());
            // The pause writes this round's pages, and ranks its accesses
            // with the pause's own.
            last_accessed = accessed;
            let written = (done, took.as_secs_f64());
            converge.after_round(vm, tunables, progress, n, written, todo.count())?;
            let per_page = took.as_secs_f64() / done.pages.max(1) as f64;
            predicted = Duration::from_secs_f64(per_page * todo.count() as f64);
            progress.downtime_predicted(predicted);
            converged = predicted <= opts.max_downtime;
            if converged || rounds.len() as u32 >= opts.max_rounds {
                break;
            }
            progress.phase(Phase::DirtyRounds);
        }
    }

    // The pause: the last dirty pages, the vCPUs and the devices. A guest
    // the policy holds runs free for a moment first.
    progress.phase(Phase::Switchover);
    let settled = match was_running {
        true => converge.settle(vm, tunables, predicted),
        false => None,
    };
    let paused_at = Instant::now();
    if was_running {
        vm.pause()
            .map_err(SnapshotError::vm("pause the guest for the snapshot"))?;
    }
    // Before the final harvest, as a migration's switchover does: saving a
    // device may write guest memory (a flush into its ring), and those
    // pages must reach the file.
    let mut sections = vm
        .save_sections()
        .map_err(SnapshotError::vm("save the devices' state sections"))?;
    // Stamped and held to the header, as a migration holds them: a
    // section the VMM left at version 0 gets its spec's version.
    crate::wire::sections::check_saved(&mut sections, &header.sections, &header.section_bytes)
        .map_err(|e| SnapshotError::Sections(e.to_string()))?;
    if was_running {
        crate::dirty_logs::collect(vm, &mut todo)
            .map_err(|e| SnapshotError::DirtyLog(Box::new(e)))?;
        last_accessed = match (last_accessed, accesses.harvest(vm)) {
            (Some(mut round), Some(pause)) => {
                round.merge(&pause);
                Some(round)
            }
            (round, pause) => pause.or(round),
        };
    }
    accesses.stop(vm);
    let t = Instant::now();
    progress.round_started(rounds.len() as u32, todo.count());
    let done = writer.write(&ram, &todo, &mut |w| {
        progress.pages_sent(w.pages, w.bytes);
        Ok(())
    })?;
    rounds.push(round(rounds.len(), done, t.elapsed()));
    let vcpus = ferry_vm::save_vcpu_state_for(vm, false)
        .map_err(SnapshotError::vm("save the vCPUs' state"))?;
    let sections = crate::wire::sections::encode(&sections);
    let digest = digest_of(&writer.hashes);
    let stopped = opts.stop || !was_running;
    // The proof that the dirty logs missed nothing: the memory of the
    // pause, hashed on its own, is what the file holds. A guest that runs
    // on has its memory frozen instead, and hashed once it runs
    // (`live_proof`); elsewhere the hash is made here.
    let frozen = match opts.verify && opts.proof_after_pause && !stopped {
        true => live_proof::freeze(&ram),
        false => None,
    };
    let mut digest_ms = 0.0;
    let proof = match (&frozen, opts.verify) {
        (Some(_), _) => ProofAt::Frozen,
        (None, true) => {
            progress.phase(Phase::Verifying);
            let t = Instant::now();
            let memory = memory_digest(&ram, source_digest_threads())
                .map_err(SnapshotError::ram("hash the paused guest's memory"))?;
            digest_ms = ms(t.elapsed());
            held_to(memory, digest)?;
            ProofAt::Pause
        }
        (None, false) => ProofAt::Skipped,
    };
    if *logging {
        crate::dirty_logs::stop(vm, "the snapshot's pause");
        *logging = false;
    }
    if !stopped {
        vm.start()
            .map_err(SnapshotError::vm("resume the guest after the snapshot"))?;
    }
    let pause_ms = ms(paused_at.elapsed());
    if let Some(frozen) = frozen {
        progress.phase(Phase::Verifying);
        let t = Instant::now();
        let memory = frozen
            .hash(source_digest_threads())
            .map_err(SnapshotError::ram("hash the memory frozen at the pause"))?;
        digest_ms = ms(t.elapsed());
        held_to(memory, digest)?;
    }
    // Once the guest runs again: ordering the working set is no work for
    // the pause.
    let working_set = match was_running {
        true => recent.finish(
            &opts.first_touches,
            &todo,
            last_accessed.as_ref(),
            paused_at,
        ),
        false => working_set::Finished {
            runs: working_set::in_order(&opts.first_touches, frames).0,
            read_pages: 0,
        },
    };
    let (working_set, working_set_read_pages) = (working_set.runs, working_set.read_pages);

    // The parts after the pages, then the manifest, then the superblock.
    let hashes: Vec<u8> = writer.hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
    let mut tail = Tail::new(&file, path, pages_end);
    let manifest = Manifest {
        ferry: env!("CARGO_PKG_VERSION").to_string(),
        header,
        digest_pages: digest.pages,
        digest: digest.value,
        vcpus: tail.put(&vcpus)?,
        sections: tail.put(&sections)?,
        page_hashes: tail.put(&hashes)?,
        working_set: match working_set.is_empty() {
            true => None,
            false => Some(tail.put(&working_set::encode(&working_set))?),
        },
        present: match &writer.present {
            Some(bits) => Some(tail.put(&encode_present(bits))?),
            None => None,
        },
        parent: parent.as_ref().map(|p| p.reference.clone()),
        data_pages: writer.data_pages(),
        stopped,
        created_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let format = match manifest.parent {
        Some(_) => FORMAT,
        None => FULL_FORMAT,
    };
    tail.finish(&manifest, format)?;
    let meta = file.metadata().map_err(SnapshotError::io("stat", path))?;
    Ok(SnapshotSummary {
        // The caller's, once the file is in place.
        total_ms: 0.0,
        pause_ms,
        digest_ms,
        proof,
        rounds,
        bytes: meta.blocks() * 512,
        file_bytes: meta.len(),
        data_pages: manifest.data_pages,
        digest: digest.value,
        working_set_pages: working_set::pages(&working_set),
        access_log: accesses.used(),
        working_set_read_pages,
        stopped,
        converged,
        convergence: converge.report(),
        settle_ms: settled.map_or(0.0, |s| s.ms),
        settle_pages: settled.map_or(0, |s| s.pages),
    })
}

/// The proof's verdict: the memory of the pause is what the file holds.
fn held_to(memory: MemoryDigest, file: MemoryDigest) -> Result<(), SnapshotError> {
    match memory == file {
        true => Ok(()),
        false => Err(SnapshotError::Untracked {
            memory: memory.value,
            file: file.value,
        }),
    }
}

/// A live round as a migration's monitor takes it: the file is the link.
fn stats(n: u32, done: Written, took: Duration, dirtied: u64, harvest: Duration) -> RoundStats {
    let secs = took.as_secs_f64().max(1e-9);
    RoundStats {
        round: n,
        kind: if n == 0 {
            RoundKind::Full
        } else {
            RoundKind::Dirty
        },
        pages: done.pages,
        zero_pages: done.pages - done.data,
        bytes: done.bytes,
        raw_bytes: done.pages * ferry_vm::PAGE_SIZE as u64,
        ms: ms(took),
        dirty_rate_pages_s: dirtied as f64 / secs,
        bandwidth_mb_s: done.bytes as f64 / secs / 1e6,
        harvest_ms: ms(harvest),
    }
}

fn round(n: usize, done: Written, took: Duration) -> SnapshotRound {
    SnapshotRound {
        round: n as u32,
        pages: done.pages,
        data_pages: done.data,
        bytes: done.bytes,
        ms: ms(took),
    }
}
