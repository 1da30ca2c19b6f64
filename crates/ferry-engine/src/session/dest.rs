//! The destination's side of a migration, whichever mode drives it: the
//! VM being built, its connections and receivers, the memory image
//! ([`Loaded`]), loading the vCPU state and sections, resuming, and the
//! digest, verdict and commit. Precopy's `receive` (`crate::precopy`) and
//! postcopy's pager (`crate::postcopy`) both drive it.

use super::device_intake::DeviceIntake;
use super::loaded::Loaded;
use super::moment::Moment;
use super::receivers::Receivers;
use super::{unexpected, ReceiveOptions};
use crate::error::MigrationError;
use crate::summary::{ms, Outcome, ReceiveSummary};
use crate::transport::{accept_channel, Channel, Health, Listen, MainChannel};
use crate::wire::messages::{Hello, PRIORITY_CHANNEL};
use crate::wire::{FinalReport, FrameKind, Message, StreamError, StreamHeader};
use ferry_vm::{error_chain, DirtyPages, Vm};
use std::sync::Arc;
use std::time::Instant;

pub(crate) struct Dest {
    pub(crate) summary: ReceiveSummary,
    pub(crate) vm: Box<dyn Vm>,
    pub(crate) ctl: MainChannel,
    /// Health of the current set of connections (a postcopy recovery
    /// starts a new one).
    pub(crate) health: Arc<Health>,
    /// Page-data bytes received over earlier sets of connections.
    pub(crate) bytes_before: u64,
    /// The migration's session id.
    pub(crate) session: u64,
    pub(crate) header: StreamHeader,
    pub(crate) loaded: Arc<Loaded>,
    pub(crate) receivers: Option<Receivers>,
    pub(crate) vcpu_state: Option<Vec<u8>>,
    /// The device state taken so far, within this destination's limit.
    pub(crate) devices: DeviceIntake,
    /// The priority connection, when the source may switch to postcopy.
    pub(crate) priority: Option<Channel>,
    /// Pages the source said are missing here (postcopy switchover).
    pub(crate) missing: Option<DirtyPages>,
    /// Whether the guest's outputs are, or may be, held until the Commit.
    pub(crate) outputs: Outputs,
}

/// The destination guest's outputs (capability `held-outputs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outputs {
    /// Not asked for, or this VM has no output gate: a strict switchover
    /// resumes the guest only at the Commit.
    Free,
    /// Taken: a strict switchover may hold them and resume at once.
    MayHold,
    /// Held since then (just before the resume); released at the Commit.
    Held(Instant),
}

impl Dest {
    /// Loads the vCPU state and the devices' sections that came before the
    /// Switchover, after checking the sections against the header and
    /// against what this VM loads.
    pub(crate) fn restore_state(&mut self) -> Result<(), MigrationError> {
        let state = self.vcpu_state.take().ok_or(MigrationError::Protocol {
            expected: "VcpuState before Switchover",
            got: FrameKind::Switchover,
            offset: 0,
        })?;
        let sections = self.devices.sections().ok_or(MigrationError::Protocol {
            expected: "Sections before Switchover",
            got: FrameKind::Switchover,
            offset: 0,
        })?;
        let sections = crate::wire::sections::decode(&sections)?;
        crate::wire::sections::check_sections(
            &sections,
            &self.header.sections,
            &self.vm.state_sections(),
        )?;
        let t = Instant::now();
        ferry_vm::restore_vcpu_state(&mut *self.vm, &state)
            .map_err(MigrationError::backend("restore vCPU state"))?;
        self.summary.resume_steps.restore_vcpus_ms = ms(t.elapsed());
        let t = Instant::now();
        self.vm
            .restore_sections(&sections)
            .map_err(MigrationError::backend(
                "restore the devices' state sections",
            ))?;
        self.summary.resume_steps.restore_sections_ms = ms(t.elapsed());
        Ok(())
    }

    /// Reads the guest's own checks before it resumes here, where the VMM
    /// gave a probe.
    pub(crate) fn read_probe(&mut self, opts: &ReceiveOptions) -> Result<(), MigrationError> {
        if let Some(probe) = &opts.probe {
            let t = Instant::now();
            let check = probe.read(&*self.vm).map_err(MigrationError::Probe)?;
            self.summary.guest_at_resume = Some(check);
            self.summary.resume_steps.probe_ms = ms(t.elapsed());
        }
        Ok(())
    }

    /// With the source's digest `theirs`: compare it with the received
    /// pages' hashes, resume (if not already), commit, report.
    pub(crate) fn verify_and_commit(
        &mut self,
        strict: bool,
        switched: Moment,
        theirs: crate::wire::MemoryDigest,
    ) -> Result<(), MigrationError> {
        let ours = self.loaded.hashes.digest();
        self.summary.digest = ours.value;
        let total = self.header.pages();
        let ram = Arc::clone(&self.loaded.ram);
        if theirs != ours {
            if self.vm.is_running() {
                self.vm
                    .pause()
                    .map_err(MigrationError::backend("pause the unverified guest"))?;
            }
            let _ = self.ctl.send(&Message::Verified {
                matched: false,
                dest: ours,
            });
            return Err(MigrationError::DigestMismatch {
                source_digest: theirs.value,
                dest_digest: ours.value,
            });
        }
        self.ctl.send(&Message::Verified {
            matched: true,
            dest: ours,
        })?;
        // A precopy's source may still resume its copy until it has our
        // verdict: the guest is ours only once it says Commit. Without it
        // (the link failed), our copy pauses, so that two copies never run.
        // A postcopy's source stays paused whatever happens.
        if self.summary.postcopy.is_none() {
            if let Err(e) = self.await_commit() {
                if self.vm.is_running() {
                    self.vm
                        .pause()
                        .map_err(MigrationError::backend("pause the uncommitted guest"))?;
                }
                // Verified, paused, and possibly the only copy left: it is
                // handed to the caller to hold for an operator, not dropped.
                tracing::error!("{}", e.chain());
                self.summary.status = Outcome::Held;
                self.summary.held = Some(e.chain());
                self.summary.digest_match = true;
                return Ok(());
            }
        }
        if strict {
            self.resume(switched)?;
        }
        self.release_outputs();
        // Committed: from here on the guest stays up whatever happens.
        self.health.finish();
        self.summary.digest_match = true;
        self.summary.status = Outcome::Completed;
        ram.take_vmm_dirty(&mut DirtyPages::new(total));
        let report = FinalReport {
            health: self.vm.check_health().err().map(|e| e.to_string()),
            postcopy: self.summary.postcopy.clone(),
        };
        if let Err(e) = self.ctl.send(&Message::Report(report)) {
            tracing::warn!("cannot send the final report to the source: {e}");
        }
        Ok(())
    }

    /// Before a strict switchover's resume: holds the guest's outputs, if
    /// the source asked for that (and was told this VM can). Whether it
    /// did. The source then waits for our Resumed before it sends its
    /// digest, so a gate that fails here fails the migration (the source
    /// runs on) rather than leaving the guest paused.
    pub(crate) fn hold_outputs(&mut self) -> Result<bool, MigrationError> {
        if self.outputs != Outputs::MayHold {
            return Ok(false);
        }
        let gate = self.vm.output_gate().ok_or(MigrationError::Backend {
            what: "hold the guest's outputs",
            source: ferry_vm::VmError::Guest("the VM no longer has an output gate".into()),
        })?;
        gate.hold()
            .map_err(MigrationError::backend("hold the guest's outputs"))?;
        self.outputs = Outputs::Held(Instant::now());
        Ok(true)
    }

    /// Committed: the held outputs go out. The guest is this side's now,
    /// so a failure is reported, not a reason to drop it.
    fn release_outputs(&mut self) {
        let Outputs::Held(since) = self.outputs else {
            return;
        };
        self.outputs = Outputs::MayHold;
        self.summary.outputs_held_ms = Some(ms(since.elapsed()));
        if let Some(Err(e)) = self.vm.output_gate().map(|g| g.release()) {
            tracing::error!(
                "cannot release the guest's held outputs: {}",
                error_chain(&e)
            );
        }
    }

    /// Waits for the source's Commit after our Verified(match).
    pub(crate) fn await_commit(&mut self) -> Result<(), MigrationError> {
        match self.ctl.recv_message("Commit") {
            Ok((Message::Commit, _)) => Ok(()),
            Ok((m, offset)) => Err(unexpected("Commit", &m, offset)),
            Err(e) => Err(MigrationError::Uncommitted(Box::new(e))),
        }
    }

    /// Takes the migration's data connections (within the stall timeout)
    /// and starts a receiver on each, in round `first_round`.
    pub(crate) fn accept_data(
        &mut self,
        listener: &dyn Listen,
        hello: Hello,
        first_round: u32,
    ) -> Result<(), MigrationError> {
        let n = usize::from(hello.data_channels);
        let deadline = Instant::now() + self.health.stall_timeout();
        let mut links: Vec<Option<Channel>> = (0..n).map(|_| None).collect();
        for _ in 0..n + usize::from(hello.priority) {
            let taken: Vec<bool> = links.iter().map(Option::is_some).collect();
            let priority_taken = self.priority.is_some();
            let admit = |h: &Hello| -> Result<(), String> {
                if h.session != hello.session {
                    return Err("this destination is receiving another migration".into());
                }
                if h.recover != hello.recover {
                    return Err("a connection of another attempt of this migration".into());
                }
                if h.channel == PRIORITY_CHANNEL {
                    return match (hello.priority, priority_taken) {
                        (false, _) => {
                            Err("a priority connection for a migration that announced none".into())
                        }
                        (true, true) => Err("the priority connection opened twice".into()),
                        (true, false) => Ok(()),
                    };
                }
                let in_range = (1..=n).contains(&usize::from(h.channel));
                if !in_range || h.data_channels != hello.data_channels {
                    return Err(format!(
                        "expected one of {n} data connections, got channel {} of {}",
                        h.channel, h.data_channels
                    ));
                }
                if taken[usize::from(h.channel) - 1] {
                    return Err(format!("data connection {} opened twice", h.channel));
                }
                Ok(())
            };
            let (io, h) = accept_channel(listener, Some(deadline), &admit)?;
            self.health
                .add_data_link(io.get_ref().try_clone_link().map_err(StreamError::Io)?);
            if h.channel == PRIORITY_CHANNEL {
                self.priority = Some(io);
            } else {
                links[usize::from(h.channel) - 1] = Some(io);
            }
        }
        let links = links.into_iter().flatten().collect();
        self.receivers = Some(Receivers::start(
            links,
            &self.loaded,
            &self.health,
            first_round,
        )?);
        Ok(())
    }

    /// Reads main-channel frames up to Switchover (pages arrive on the data
    /// connections meanwhile). Returns Switchover's verify-before-resume flag,
    /// final round and postcopy flag.
    pub(crate) fn load(&mut self) -> Result<(bool, u32, bool), MigrationError> {
        let pages = self.header.pages();
        loop {
            let i = self.ctl.recv()?;
            match i.kind {
                FrameKind::VcpuState => self.vcpu_state = Some(i.payload),
                FrameKind::LiveSection => {
                    self.devices.take_live(i.payload.len(), i.offset)?;
                    let (id, chunk) =
                        crate::wire::sections::decode_live(&i.payload, &self.header.sections)?;
                    let live = self.vm.live_state().ok_or_else(|| {
                        MigrationError::Refused(format!(
                            "live state for section {id} came, and this VM loads none"
                        ))
                    })?;
                    live.load(&id, chunk)
                        .map_err(MigrationError::backend("load live device state"))?;
                }
                FrameKind::SectionsPart | FrameKind::Sections => {
                    let header = &self.header;
                    // What the header declared, with room for the framing.
                    let expected = || {
                        crate::wire::sections::declared_total(
                            &header.sections,
                            &header.section_bytes,
                        )
                        .saturating_add(4 + 1024 * header.sections.len() as u64)
                    };
                    let last = i.kind == FrameKind::Sections;
                    self.devices.take_sections(i.payload, last, expected)?;
                }
                FrameKind::Missing if self.priority.is_some() => {
                    let runs = match Message::decode(i.kind, &i.payload, i.offset)? {
                        Message::Missing(runs) => runs,
                        m => return Err(unexpected("Missing", &m, i.offset)),
                    };
                    let set = self.missing.get_or_insert_with(|| DirtyPages::new(pages));
                    for (first, n) in runs {
                        if first >= pages || n > pages - first {
                            return Err(StreamError::Malformed {
                                kind: i.kind,
                                offset: i.offset,
                                reason: format!(
                                    "{n} pages from frame {first:#x}; the guest has {pages}"
                                ),
                            }
                            .into());
                        }
                        (first..first + n).for_each(|g| set.set(ferry_vm::Gfn(g)));
                    }
                }
                FrameKind::Switchover => match Message::decode(i.kind, &i.payload, i.offset)? {
                    Message::Switchover { postcopy: true, .. } if self.priority.is_none() => {
                        return Err(MigrationError::Refused(
                            "a postcopy switchover without a priority connection".into(),
                        ))
                    }
                    Message::Switchover {
                        verify_before_resume,
                        final_round,
                        postcopy,
                        paused,
                    } => {
                        self.summary.paused = paused;
                        return Ok((verify_before_resume, final_round, postcopy));
                    }
                    m => return Err(unexpected("Switchover", &m, i.offset)),
                },
                got => {
                    return Err(MigrationError::Protocol {
                        expected: "VcpuState, Sections or Switchover",
                        got,
                        offset: i.offset,
                    })
                }
            }
        }
    }

    /// Starts the guest here, unless it was paused on the source (then it
    /// stays paused, the VMM's to resume), and tells the source.
    pub(crate) fn resume(&mut self, switched: Moment) -> Result<(), MigrationError> {
        if !self.summary.paused {
            let t = Instant::now();
            self.vm.start().map_err(MigrationError::backend(
                "start the guest on the destination",
            ))?;
            self.summary.resume_steps.start_ms = ms(t.elapsed());
        }
        let took = switched.elapsed();
        self.summary.resume_ms = ms(took);
        self.summary.resume_steps.cpu_ms = switched.cpu_ms();
        self.ctl.send(&Message::Resumed {
            resume_ns: took.as_nanos().min(u128::from(u64::MAX)) as u64,
        })?;
        Ok(())
    }
}
