//! The switchover steps both modes take on the source: the pause, the vCPU
//! state and sections, the digest, the commit or the rollback, and the
//! destination's final report.

use super::moment::Moment;
use super::source::Source;
use super::unexpected;
use crate::digest::{memory_digest, source_digest_threads};
use crate::error::MigrationError;
use crate::progress::Phase;
use crate::summary::{ms, Outcome, PostcopyReport};
use crate::wire::{FrameKind, MemoryDigest, Message};
use std::time::{Duration, Instant};

/// How long a source on the destination's host waits, once the
/// destination has resumed the guest, before it hashes its memory. Inside
/// the SVM host (one CPU, a Linux guest, 512 MiB, idle): the guest's vCPUs
/// each took about 60 ms of CPU to return to its checker after the pause,
/// and with the hash taking its share the longest gap the guest saw was
/// 294 ms; with this wait it was 107 ms.
pub const SHARED_HOST_YIELD: Duration = Duration::from_millis(150);

impl Source<'_> {
    /// Pauses the guest for a switchover (precopy or postcopy), reads its
    /// probe, if the VMM gave one, and saves the devices' sections (before
    /// the final harvest: saving may write guest memory). Returns when the
    /// pause began.
    pub(crate) fn pause_for_switchover(&mut self) -> Result<Moment, MigrationError> {
        self.progress.phase(Phase::Switchover);
        self.opts.tunables.set_paused(true);
        let paused_at = Moment::now();
        let by_us = self.vm.is_running();
        if by_us {
            self.vm
                .pause()
                .map_err(MigrationError::backend("pause the guest for switchover"))?;
        }
        self.phase.pause(by_us)?;
        // A vCPU that failed since the last round's check (a VMM's pause
        // may return once it is out of KVM_RUN, failed or not) is no guest
        // to move.
        self.vm
            .check_health()
            .map_err(MigrationError::backend("pause the guest for switchover"))?;
        self.summary.switchover.pause_ms = paused_at.elapsed_ms();
        super::probe_paused(&*self.vm, self.opts, &mut self.summary)?;
        let saving = Instant::now();
        let sections = self
            .vm
            .save_sections()
            .map_err(MigrationError::backend("save the devices' state sections"))?;
        self.summary.devices.device_bytes_at_pause = self.devices.hold_saved(sections)?;
        self.summary.switchover.save_sections_ms = ms(saving.elapsed());
        Ok(paused_at)
    }

    /// Saves the paused vCPUs' state and sends it to the destination, with
    /// the sections saved at the pause.
    pub(crate) fn send_vcpu_state(&mut self) -> Result<(), MigrationError> {
        let saving = Instant::now();
        let compact = self.dest_takes.compact_vcpu_state;
        let state = ferry_vm::save_vcpu_state_for(&mut *self.vm, compact)
            .map_err(MigrationError::backend("save vCPU state"))?;
        self.summary.switchover.save_vcpus_ms = ms(saving.elapsed());
        self.links.ctl.send_frame(FrameKind::VcpuState, &state)?;
        // In parts where the destination takes them, else in one frame
        // (its size was checked at the pause).
        let (sections, part) = self.devices.take_saved();
        let ctl = &mut self.links.ctl;
        crate::wire::sections::encode_in_parts(&sections, part, |bytes, last| {
            let kind = match last {
                true => FrameKind::Sections,
                false => FrameKind::SectionsPart,
            };
            ctl.send_frame(kind, bytes)
        })?;
        Ok(())
    }

    pub(crate) fn send_digest(&mut self) -> Result<MemoryDigest, MigrationError> {
        let t = Instant::now();
        let d = memory_digest(&self.ram, source_digest_threads())
            .map_err(MigrationError::ram("hash guest memory"))?;
        self.summary.switchover.digest_ms = ms(t.elapsed());
        self.phase.digest_sent()?;
        self.links.ctl.send(&Message::Digest(d))?;
        Ok(d)
    }

    /// The destination has resumed the guest, and the source is about to
    /// hash its memory. On one host (the peer is local), the guest first
    /// gets the CPUs for [`SHARED_HOST_YIELD`]: otherwise the hash takes
    /// their share just when the guest, back from its pause, catches up.
    /// Where the hosts differ nothing waits: the hash takes no CPU from the
    /// guest, and the verdict (and the outputs held for it) comes sooner.
    pub(crate) fn yield_to_resumed_guest(&mut self) {
        if self.links.ctl.peer_on_this_host() {
            let t = Instant::now();
            std::thread::sleep(SHARED_HOST_YIELD);
            self.summary.switchover.digest_yield_ms = ms(t.elapsed());
        }
    }

    /// The destination said Resumed: the downtime ends, counted from the
    /// source's pause.
    pub(crate) fn record_resumed(&mut self, paused_at: Moment, resume_ns: u64) {
        self.summary.downtime_ms = paused_at.elapsed_ms();
        self.summary.switchover.downtime_cpu_ms = paused_at.cpu_ms();
        self.summary.switchover.dest_resume_ms = resume_ns as f64 / 1e6;
        // Saving, and the destination's loading (most of its resume).
        let took =
            self.summary.switchover.save_sections_ms + self.summary.switchover.dest_resume_ms;
        super::device_cost::record(
            self.vm.vmm_id(),
            self.summary.devices.device_bytes_at_pause,
            Duration::from_secs_f64(took / 1e3),
        );
    }

    /// The guest now belongs to the destination: the source stays paused.
    pub(crate) fn commit(&mut self) -> Result<(), MigrationError> {
        self.phase.commit()?;
        self.summary.status = Outcome::Completed;
        // The migration is done here; the guest report that follows measures
        // the destination, not the move.
        self.summary.total_ms = ms(self.start.elapsed());
        self.stop_logging("after the migration");
        Ok(())
    }

    pub(crate) fn collect_report(&mut self) {
        self.progress.phase(Phase::Reporting);
        match self.links.ctl.recv_message("Report") {
            Ok((Message::Report(r), _)) => {
                if let Some(theirs) = r.postcopy {
                    // The destination's account, with this side's counts of
                    // the pages missing at the switchover and the recoveries.
                    let ours = self.summary.postcopy.take().unwrap_or_default();
                    self.summary.postcopy = Some(PostcopyReport {
                        missing_pages: ours.missing_pages,
                        recoveries: ours.recoveries,
                        ..theirs
                    });
                }
                if let Some(h) = r.health {
                    self.summary.error = Some(format!("destination guest: {h}"));
                }
            }
            Ok((m, offset)) => {
                self.summary.error = Some(unexpected("Report", &m, offset).to_string());
            }
            Err(e) => {
                self.summary.error = Some(format!(
                    "migration completed, but no final report from the destination: {}",
                    e.chain()
                ));
            }
        }
    }

    /// Leaves the source as it was before the migration.
    pub(crate) fn rollback(&mut self) {
        self.opts.tunables.set_paused(false);
        self.convergence.converger.release(&mut *self.vm);
        self.stop_logging("on rollback");
        match self.phase.roll_back() {
            Ok(true) => {
                if let Err(e) = self.vm.start() {
                    tracing::error!("cannot resume the source VM after a failed migration: {e}");
                }
            }
            Ok(false) => {}
            // The destination runs the guest (postcopy) or owns it: this
            // copy must not run.
            Err(e) => tracing::error!("{e}; the source stays paused"),
        }
    }
}
