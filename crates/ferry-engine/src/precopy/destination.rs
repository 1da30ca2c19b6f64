//! The receiving side: check the header, build the VM, load pages while
//! keeping per-page hashes, resume, verify, commit, report. `receive`
//! returns as soon as the guest runs here and the source's Commit is in.

use super::loaded::Loaded;
use super::receivers::Receivers;
use super::{unexpected, ReceiveOptions};
use crate::error::MigrationError;
use crate::summary::{ms, ReceiveSummary, Status};
use crate::transport::{accept_channel, Channel, Control, Health, Listen, Side};
use crate::wire::control::{Hello, PRIORITY_CHANNEL};
use crate::wire::{FinalReport, FrameKind, Message, StreamError, StreamHeader};
use ferry_backend::{BackendError, DirtyPages, Lifecycle, Vm};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Builds the destination VM from the stream header: the VMM it names
/// ([`StreamHeader::vmm`]) and the VMM's own configuration
/// ([`StreamHeader::vmm_config`]). The engine then checks the VM against
/// the header's vCPUs and memory slots. For a VMM with one VM type,
/// [`receive_as`] takes a factory of that type instead.
pub type CreateVm<'a> = dyn FnMut(&StreamHeader) -> Result<Box<dyn Vm>, BackendError> + 'a;

/// A migration whose control connection has arrived and introduced itself.
pub struct IncomingMigration {
    io: Channel,
    hello: Hello,
    peer: String,
}

impl IncomingMigration {
    /// The source's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Data connections the source will open.
    pub fn connections(&self) -> usize {
        usize::from(self.hello.data_channels)
    }
}

/// Waits on `listener` for a migration's control connection. A connection
/// that is not one (another program, a wrong version, a data connection of
/// another migration) is refused with a reason, sent to it as well.
pub fn await_migration(listener: &dyn Listen) -> Result<IncomingMigration, MigrationError> {
    let (io, hello) = accept_channel(listener, None, &|h: &Hello| {
        if h.recover {
            Err(
                "there is no postcopy to recover here (this destination has no migration \
                 in progress)"
                    .into(),
            )
        } else if h.channel == 0 {
            Ok(())
        } else {
            Err(format!(
                "expected a migration's control connection, got its data connection {}",
                h.channel
            ))
        }
    })?;
    let peer = io.get_ref().peer_name();
    Ok(IncomingMigration { io, hello, peer })
}

/// Receives the migration `incoming` announced: reads the header, checks it
/// against `opts.expect`, builds the VM with `create_vm`, takes the data
/// connections on `listener`, loads memory, resumes the guest, verifies the
/// digest, waits for the source's Commit, and returns the running VM at
/// once: what the guest does from then on is the caller's business.
///
/// Errors found here are also sent to the source as an Error frame. On `Err`
/// no guest of this side is running. A precopy whose Commit never came
/// returns `Ok` with [`Status::Held`]: the VM is paused, its memory
/// verified, and it is the caller's to hold for an operator (the source may
/// have resumed its own copy, or may be gone with it).
pub fn receive(
    incoming: IncomingMigration,
    listener: &dyn Listen,
    create_vm: &mut CreateVm<'_>,
    opts: &ReceiveOptions,
) -> Result<(Box<dyn Vm>, ReceiveSummary), MigrationError> {
    let start = Instant::now();
    let health = Arc::new(Health::new(Side::Destination, opts.stall_timeout));
    let hello = incoming.hello;
    let mut ctl = Control::start(incoming.io, Arc::clone(&health))?;
    let prepared = prepare(&ctl, create_vm, opts);
    let (header, mut vm) = match prepared {
        Ok(p) => p,
        Err(e) => return Err(ctl.give_up(e)),
    };
    vm.migration_event(Lifecycle::Started);
    let ram = Arc::clone(vm.ram());
    // Fresh RAM is zero, except what the backend wrote while building the VM.
    let mut written = DirtyPages::new(header.pages());
    ram.take_vmm_dirty(&mut written);
    let connections = usize::from(hello.data_channels);
    let loaded = match Loaded::new(ram, &written, connections, opts.placement, hello.priority) {
        Ok(l) => Arc::new(l),
        Err(e) => return Err(ctl.give_up(e)),
    };
    let mut dest = Dest {
        summary: ReceiveSummary {
            status: Status::Failed,
            held: None,
            backend: header.vmm.clone(),
            connections,
            tls: listener.tls(),
            total_ms: 0.0,
            resume_ms: 0.0,
            bytes_received: 0,
            pages_received: 0,
            zero_pages: 0,
            batches: 0,
            digest: 0,
            digest_match: false,
            guest_at_resume: None,
            passes_after: None,
            mismatches_after: None,
            postcopy: None,
        },
        vm,
        ctl,
        health,
        bytes_before: 0,
        session: hello.session,
        header,
        loaded,
        receivers: None,
        vcpu_state: None,
        sections: None,
        priority: None,
        missing: None,
    };
    let result = dest.run(listener, hello, opts);
    let ranges = if result.is_err() && dest.loaded.in_postcopy() {
        dest.missing_ranges()
    } else {
        String::new()
    };
    let Dest {
        mut summary,
        mut vm,
        loaded,
        receivers,
        mut ctl,
        health,
        bytes_before,
        ..
    } = dest;
    summary.total_ms = ms(start.elapsed());
    summary.bytes_received = bytes_before + health.data_bytes();
    summary.pages_received = loaded.pages_received.load(Ordering::Relaxed);
    summary.zero_pages = loaded.zero_pages.load(Ordering::Relaxed);
    summary.batches = loaded.batches.load(Ordering::Relaxed);
    match result {
        Ok(()) => {
            ctl.close();
            if let Some(r) = receivers {
                r.join();
            }
            // A copy held after a lost Commit waits for its operator.
            if summary.status == Status::Completed {
                vm.migration_event(Lifecycle::Completed);
            }
            Ok((vm, summary))
        }
        Err(e) => {
            // A vCPU waiting for a page that will not come now can only be
            // stopped once the registration is gone (it then reads a zero
            // page: this copy of the guest is discarded anyway).
            let missing = loaded
                .in_postcopy()
                .then(|| (loaded.pages - loaded.received.count(), ranges));
            loaded.end_placement();
            if vm.is_running() {
                if let Err(pe) = vm.pause() {
                    tracing::error!("cannot pause the unverified destination guest: {pe}");
                }
            }
            let e = ctl.give_up(e);
            let e = match missing {
                Some((missing, ranges)) => MigrationError::PostcopyIncomplete {
                    missing,
                    total: loaded.pages,
                    ranges,
                    source: Box::new(e),
                },
                None => e,
            };
            if let Some(r) = receivers {
                r.join();
            }
            vm.migration_event(Lifecycle::Aborted(&e.chain()));
            Err(e)
        }
    }
}

/// Reads and checks the header, builds the VM, and checks it.
fn prepare(
    ctl: &Control,
    create_vm: &mut CreateVm<'_>,
    opts: &ReceiveOptions,
) -> Result<(StreamHeader, Box<dyn Vm>), MigrationError> {
    let first = ctl.recv()?;
    if first.kind != FrameKind::Header {
        return Err(MigrationError::Protocol {
            expected: "Header",
            got: first.kind,
            offset: first.offset,
        });
    }
    let header = StreamHeader::decode(&first.payload)?;
    if let Some(expect) = &opts.expect {
        header.check_expected(expect)?;
    }
    let vm = create_vm(&header).map_err(MigrationError::backend("create the destination VM"))?;
    header.check_destination(&*vm)?;
    if vm.is_running() {
        return Err(MigrationError::Backend {
            what: "take memory into a VM whose vCPUs already run",
            source: BackendError::NotPaused("receive a migration"),
        });
    }
    Ok((header, vm))
}

pub(crate) struct Dest {
    pub(crate) summary: ReceiveSummary,
    pub(crate) vm: Box<dyn Vm>,
    pub(crate) ctl: Control,
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
    /// The Sections frame's payload, until the switchover loads it.
    pub(crate) sections: Option<Vec<u8>>,
    /// The priority connection, when the source may switch to postcopy.
    pub(crate) priority: Option<Channel>,
    /// Pages the source said are missing here (postcopy switchover).
    pub(crate) missing: Option<DirtyPages>,
}

impl Dest {
    fn run(
        &mut self,
        listener: &dyn Listen,
        hello: Hello,
        opts: &ReceiveOptions,
    ) -> Result<(), MigrationError> {
        self.ctl.send(&Message::Accept {
            verify_before_resume: opts.verify_before_resume,
        })?;
        self.accept_data(listener, hello, 0)?;
        let (strict, final_round, postcopy) = self.load()?;
        let switched = Instant::now();
        if postcopy {
            return self.postcopy(final_round, switched, listener, opts);
        }
        // Precopy completed: no page will be asked for.
        self.priority = None;
        self.loaded.wait_round(final_round, &self.health)?;
        // Every page is in; the guest may touch any of them from now on.
        self.loaded.end_placement();
        let total = self.header.pages();
        let received = self.loaded.received.count();
        if received != total {
            return Err(MigrationError::Incomplete {
                missing: total - received,
                total,
            });
        }
        self.restore_state()?;
        self.read_probe(opts)?;
        if !strict {
            self.resume(switched)?;
        }
        let digest = match self.ctl.recv_message("Digest")? {
            (Message::Digest(d), _) => d,
            (m, offset) => return Err(unexpected("Digest", &m, offset)),
        };
        self.verify_and_commit(strict, switched, digest)
    }

    /// Loads the vCPU state and the devices' sections that came before the
    /// Switchover, after checking the sections against the header and
    /// against what this VM loads.
    pub(crate) fn restore_state(&mut self) -> Result<(), MigrationError> {
        let state = self.vcpu_state.take().ok_or(MigrationError::Protocol {
            expected: "VcpuState before Switchover",
            got: FrameKind::Switchover,
            offset: 0,
        })?;
        let sections = self.sections.take().ok_or(MigrationError::Protocol {
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
        self.vm
            .restore_vcpus(&state)
            .map_err(MigrationError::backend("restore vCPU state"))?;
        self.vm
            .restore_sections(&sections)
            .map_err(MigrationError::backend(
                "restore the devices' state sections",
            ))?;
        Ok(())
    }

    /// Reads the guest's own checks before it resumes here, where the VMM
    /// gave a probe.
    pub(crate) fn read_probe(&mut self, opts: &ReceiveOptions) -> Result<(), MigrationError> {
        if let Some(probe) = &opts.probe {
            let check = probe.read(&*self.vm).map_err(MigrationError::Probe)?;
            self.summary.guest_at_resume = Some(check);
        }
        Ok(())
    }

    /// With the source's digest `theirs`: compare it with the received
    /// pages' hashes, resume (if not already), commit, report.
    pub(crate) fn verify_and_commit(
        &mut self,
        strict: bool,
        switched: Instant,
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
                self.summary.status = Status::Held;
                self.summary.held = Some(e.chain());
                self.summary.digest_match = true;
                return Ok(());
            }
        }
        if strict {
            self.resume(switched)?;
        }
        // Committed: from here on the guest stays up whatever happens.
        self.health.finish();
        self.summary.digest_match = true;
        self.summary.status = Status::Completed;
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

    /// Waits for the source's Commit after our Verified(match).
    fn await_commit(&mut self) -> Result<(), MigrationError> {
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

    /// Reads control frames up to Switchover (pages arrive on the data
    /// connections meanwhile). Returns Switchover's verify-before-resume flag,
    /// final round and postcopy flag.
    fn load(&mut self) -> Result<(bool, u32, bool), MigrationError> {
        let pages = self.header.pages();
        loop {
            let i = self.ctl.recv()?;
            match i.kind {
                FrameKind::VcpuState => self.vcpu_state = Some(i.payload),
                FrameKind::Sections => self.sections = Some(i.payload),
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
                        (first..first + n).for_each(|g| set.set(ferry_backend::Gfn(g)));
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
                    } => return Ok((verify_before_resume, final_round, postcopy)),
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

    pub(crate) fn resume(&mut self, switched: Instant) -> Result<(), MigrationError> {
        self.vm.start().map_err(MigrationError::backend(
            "start the guest on the destination",
        ))?;
        let took = switched.elapsed();
        self.summary.resume_ms = ms(took);
        self.ctl.send(&Message::Resumed {
            resume_ns: took.as_nanos().min(u128::from(u64::MAX)) as u64,
        })?;
        Ok(())
    }
}

/// [`receive`] for a VMM with one VM type `V`: `create_vm` builds a `V`,
/// and the running VM comes back as that `V`, not as a `Box<dyn Vm>`.
pub fn receive_as<V: Vm>(
    incoming: IncomingMigration,
    listener: &dyn Listen,
    create_vm: &mut dyn FnMut(&StreamHeader) -> Result<V, BackendError>,
    opts: &ReceiveOptions,
) -> Result<(V, ReceiveSummary), MigrationError> {
    let mut boxed = |h: &StreamHeader| create_vm(h).map(|vm| Box::new(vm) as Box<dyn Vm>);
    let (vm, summary) = receive(incoming, listener, &mut boxed, opts)?;
    let vm: Box<dyn std::any::Any> = vm;
    match vm.downcast::<V>() {
        Ok(vm) => Ok((*vm, summary)),
        // receive returns the VM its factory built, and nothing else.
        Err(_) => unreachable!("receive returned a VM its factory did not build"),
    }
}
