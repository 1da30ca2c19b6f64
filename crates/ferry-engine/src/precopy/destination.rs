//! Precopy's destination: [`await_migration`] takes a migration's control
//! connection, and [`receive`] checks the header, builds the VM, loads pages
//! while keeping per-page hashes, resumes, verifies, commits and reports.
//! It returns as soon as the guest runs here and the source's Commit is in,
//! or hands over to postcopy's pager when the source switches to it.

use crate::error::MigrationError;
use crate::session::{unexpected, Blocked, Dest, DeviceIntake, Loaded, Outputs, ReceiveOptions};
use crate::summary::{ms, Outcome, ReceiveSummary};
use crate::transport::{accept_channel, Channel, Health, Listen, MainChannel, Side};
use crate::wire::capabilities::{Answer, POSTCOPY};
use crate::wire::messages::Hello;
use crate::wire::{FrameKind, Message, StreamHeader};
use ferry_vm::{error_chain, DirtyPages, Lifecycle, Vm, VmError};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::wire::CreateVm;

/// A migration whose main channel has arrived and introduced itself.
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

/// Waits on `listener` for a migration's main channel, until `deadline` if
/// one is given (then [`crate::TransportError::AcceptTimeout`]). A
/// connection that is not one (another program, a wrong version, a data
/// connection of another migration) is refused with a reason, sent to it as
/// well.
pub fn await_migration(
    listener: &dyn Listen,
    deadline: Option<Instant>,
) -> Result<IncomingMigration, MigrationError> {
    let (io, hello) = accept_channel(listener, deadline, &|h: &Hello| {
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
                "expected a migration's main channel, got its data connection {}",
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
/// returns `Ok` with [`Outcome::Held`]: the VM is paused, its memory
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
    let mut ctl = MainChannel::start(incoming.io, Arc::clone(&health))?;
    if let Err(e) = opts.validate() {
        return Err(ctl.give_up(e.into()));
    }
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
            status: Outcome::Failed,
            held: None,
            backend: header.vmm.clone(),
            wire_version: ctl.version(),
            paused: false,
            connections,
            tls: listener.tls(),
            total_ms: 0.0,
            resume_ms: 0.0,
            resume_steps: Default::default(),
            outputs_held_ms: None,
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
        devices: DeviceIntake::new(opts.max_device_bytes),
        priority: None,
        missing: None,
        outputs: Outputs::Free,
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
            if summary.status == Outcome::Completed {
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
    ctl: &MainChannel,
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
    let mut vm =
        create_vm(&header).map_err(MigrationError::backend("create the destination VM"))?;
    header.check_destination(&mut *vm)?;
    if let Some(profile) = &header.cpu {
        vm.check_cpu(profile)
            .map_err(|e| MigrationError::Refused(error_chain(&e)))?;
    }
    if vm.is_running() {
        return Err(MigrationError::Backend {
            what: "take memory into a VM whose vCPUs already run",
            source: VmError::NotPaused("receive a migration"),
        });
    }
    Ok((header, vm))
}

impl Dest {
    /// Refuses a migration the destination VM or the operator blocks, and
    /// answers the capabilities the header asked for (wire 6 on). A wire-5
    /// source asks nothing: it has postcopy in mind when it announced a
    /// priority connection, and is refused outright if postcopy is blocked
    /// here, since it cannot be told to do without.
    fn admit(
        &mut self,
        hello: &Hello,
        opts: &ReceiveOptions,
    ) -> Result<Option<Answer>, MigrationError> {
        let blocked = Blocked::of(&*self.vm, &opts.blockers);
        if let Some(reason) = blocked.migration {
            return Err(MigrationError::Refused(format!(
                "the destination VM cannot take a migration: {reason}"
            )));
        }
        crate::wire::sections::check_limit(
            &self.header.sections,
            &self.header.section_bytes,
            opts.max_device_bytes,
        )
        .map_err(|e| MigrationError::Refused(e.to_string()))?;
        let mut refused = BTreeMap::new();
        if let Some(reason) = blocked.postcopy {
            refused.insert(POSTCOPY.to_string(), reason);
        }
        if self.vm.output_gate().is_none() {
            refused.insert(
                crate::wire::capabilities::HELD_OUTPUTS.to_string(),
                "this VM cannot hold its guest's outputs: a strict switchover resumes at the \
                 Commit"
                    .to_string(),
            );
        }
        if !ferry_vm::saves_compact_vcpu_state(&mut *self.vm) {
            refused.insert(
                crate::wire::capabilities::COMPACT_VCPU_STATE.to_string(),
                "this VMM loads its vCPU state only in the full form".to_string(),
            );
        }
        if self.vm.live_state().is_none() {
            refused.insert(
                crate::wire::capabilities::LIVE_SECTIONS.to_string(),
                "this VMM loads no live device state: it all goes at the pause".to_string(),
            );
        }
        match &self.header.capabilities {
            Some(asked) => Ok(Some(Answer::to(asked, &refused))),
            None => match refused.remove(POSTCOPY) {
                Some(reason) if hello.priority => Err(MigrationError::Refused(format!(
                    "this destination does not take postcopy ({reason}), and the source \
                     (wire {}) may switch to it: migrate with --mode precopy",
                    self.ctl.version()
                ))),
                _ => Ok(None),
            },
        }
    }

    fn run(
        &mut self,
        listener: &dyn Listen,
        hello: Hello,
        opts: &ReceiveOptions,
    ) -> Result<(), MigrationError> {
        let answer = self.admit(&hello, opts)?;
        let held = crate::wire::capabilities::HELD_OUTPUTS;
        if answer
            .as_ref()
            .is_some_and(|a| a.takes.iter().any(|c| c == held))
        {
            self.outputs = Outputs::MayHold;
        }
        let live = crate::wire::capabilities::LIVE_SECTIONS;
        self.devices.agree_live(
            answer
                .as_ref()
                .is_some_and(|a| a.takes.iter().any(|c| c == live)),
        );
        self.ctl.send(&Message::Accept {
            verify_before_resume: opts.verify_before_resume,
            answer,
        })?;
        self.accept_data(listener, hello, 0)?;
        let (strict, final_round, postcopy) = self.load()?;
        let switched = crate::session::Moment::now();
        if postcopy {
            return self.postcopy(final_round, switched, listener, opts);
        }
        // Precopy completed: no page will be asked for.
        self.priority = None;
        self.loaded.wait_round(final_round, &self.health)?;
        self.summary.resume_steps.pages_ms = switched.elapsed_ms();
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
        // Strict, with the outputs held: the guest runs now, and nothing
        // it does leaves this VM before the Commit.
        let strict = strict && !self.hold_outputs()?;
        if !strict {
            self.resume(switched)?;
        }
        let digest = match self.ctl.recv_message("Digest")? {
            (Message::Digest(d), _) => d,
            (m, offset) => return Err(unexpected("Digest", &m, offset)),
        };
        self.verify_and_commit(strict, switched, digest)
    }
}

/// [`receive`] for a VMM with one VM type `V`: `create_vm` builds a `V`,
/// and the running VM comes back as that `V`, not as a `Box<dyn Vm>`.
///
/// # Example
///
/// The factory sees the stream's header before any memory arrives, and
/// refuses a stream it cannot build a VM for: the source is told why, and
/// its VM runs on (`CounterVm` as in [`crate::migrate`]'s example).
///
/// ```
/// # use ferry_engine::vmm::{Backing, GuestRam, StreamHeader, Vm, VmError};
/// # use std::sync::Arc;
/// # /// A VM whose "guest" is its VMM writing a counter into memory.
/// # struct CounterVm { ram: Arc<GuestRam>, running: bool }
/// # impl CounterVm {
/// #     fn new(bytes: u64) -> Result<Self, VmError> {
/// #         Ok(CounterVm { ram: Arc::new(GuestRam::new(&[bytes], Backing::Anonymous)?), running: false })
/// #     }
/// # }
/// # impl Vm for CounterVm {
/// #     fn vmm_id(&self) -> &str { "counter-vmm" }
/// #     fn ram(&self) -> &Arc<GuestRam> { &self.ram }
/// #     fn start(&mut self) -> Result<(), VmError> { self.running = true; Ok(()) }
/// #     fn pause(&mut self) -> Result<(), VmError> { self.running = false; Ok(()) }
/// #     fn is_running(&self) -> bool { self.running }
/// # }
/// use ferry_engine::{await_migration, listen, migrate, receive_as};
/// use ferry_engine::{NoProgress, PrecopyOptions, ReceiveOptions, TcpDialer};
///
/// let listener = listen("127.0.0.1:0").unwrap();
/// let to = TcpDialer(listener.local_addr().unwrap().to_string());
/// let destination = std::thread::spawn(move || {
///     let incoming = await_migration(&listener, None).unwrap();
///     // This destination has room for 2 MiB of guest memory only.
///     let mut create = |h: &StreamHeader| -> Result<CounterVm, VmError> {
///         if h.memory_bytes > 2 << 20 {
///             return Err(VmError::Guest(format!("no room for {} bytes", h.memory_bytes)));
///         }
///         CounterVm::new(h.memory_bytes)
///     };
///     receive_as(incoming, &listener, &mut create, &ReceiveOptions::default()).map(|_| ())
/// });
///
/// let mut vm = CounterVm::new(4 << 20).unwrap();
/// vm.start().unwrap();
/// let refused = migrate(&mut vm, &to, &PrecopyOptions::default(), &NoProgress).unwrap_err();
/// assert!(refused.to_string().contains("no room for"), "{refused}");
/// assert!(destination.join().unwrap().is_err());
/// assert!(vm.is_running());
/// ```
pub fn receive_as<V: Vm>(
    incoming: IncomingMigration,
    listener: &dyn Listen,
    create_vm: &mut dyn FnMut(&StreamHeader) -> Result<V, VmError>,
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
