//! Precopy's source: [`migrate`] opens the migration, and the round loop
//! sends memory while the guest runs until the predicted final round fits
//! the downtime target (`super::downtime`), the round cap is reached, or
//! the mode hands over to postcopy.

use super::downtime::{FinalRound, SwitchRule};
use super::give_up::GiveUp;
use crate::converge::{settle_allowance, RoundEnd, Transfer};
use crate::error::MigrationError;
use crate::progress::{Phase, Progress};
use crate::session::{
    fresh_summary, new_session_id, Blocked, Migrating, Mode, PrecopyOptions, Source,
    EST_BYTES_PER_PAGE,
};
use crate::summary::{ms, MigrationSummary, RoundKind};
use crate::transport::{open_channel, Dial, Health, MainChannel, Side};
use crate::wire::messages::Hello;
use ferry_vm::{DirtyPages, Lifecycle, Vm, PAGE_SIZE};
use std::sync::Arc;
use std::time::Instant;

/// Migrates `vm` to the destination that `dialer` reaches (precopy), over
/// one main channel and `opts.connections` data connections.
///
/// Returns a summary on success, and also when the destination's memory
/// digest did not match (status `failed`, VM rolled back and running). On
/// `Err`, the VM runs again (if it ran before) and dirty logging is off; the
/// error is the destination's own reason when it gave one.
///
/// # Example
///
/// A VM moved over loopback within one process (`CounterVm` is a VM whose
/// guest is its VMM writing a counter: the whole of it is in
/// [`crate::vmm`]'s example). A destination that is not listening is an
/// error, and the source's VM runs on:
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
/// use ferry_engine::{NoProgress, Outcome, PrecopyOptions, ReceiveOptions, TcpDialer};
///
/// let listener = listen("127.0.0.1:0").unwrap();
/// let to = TcpDialer(listener.local_addr().unwrap().to_string());
/// let destination = std::thread::spawn(move || {
///     let incoming = await_migration(&listener, None).unwrap();
///     let mut create = |h: &StreamHeader| CounterVm::new(h.memory_bytes);
///     receive_as(incoming, &listener, &mut create, &ReceiveOptions::default()).unwrap()
/// });
///
/// let mut vm = CounterVm::new(4 << 20).unwrap();
/// vm.start().unwrap();
/// vm.ram().store_u64(ferry_engine::vmm::Gpa(0x3000), 42).unwrap();
/// let summary = migrate(&mut vm, &to, &PrecopyOptions::default(), &NoProgress).unwrap();
/// let (moved, _) = destination.join().unwrap();
/// assert_eq!((summary.status, summary.digest_match), (Outcome::Completed, true));
/// assert_eq!(moved.ram().load_u64(ferry_engine::vmm::Gpa(0x3000)).unwrap(), 42);
/// assert!(moved.is_running() && !vm.is_running());
///
/// // Nobody listens there now: the migration fails, and `vm` keeps running.
/// let mut vm = CounterVm::new(4 << 20).unwrap();
/// vm.start().unwrap();
/// assert!(migrate(&mut vm, &to, &PrecopyOptions::default(), &NoProgress).is_err());
/// assert!(vm.is_running());
/// ```
pub fn migrate(
    vm: &mut dyn Vm,
    dialer: &dyn Dial,
    opts: &PrecopyOptions,
    progress: &dyn Progress,
) -> Result<MigrationSummary, MigrationError> {
    let (summary, result) = migrate_accounted(vm, dialer, opts, progress);
    result.map(|()| summary)
}

/// Like [`migrate`], and also on `Err` returns what the migration did
/// before it failed (rounds, bytes sent, throttle timeline; status `failed`,
/// the error in `error`): a failed migration is still accounted for.
pub fn migrate_accounted(
    vm: &mut dyn Vm,
    dialer: &dyn Dial,
    opts: &PrecopyOptions,
    progress: &dyn Progress,
) -> (MigrationSummary, Result<(), MigrationError>) {
    let connections = opts.connections;
    let summary = fresh_summary(vm, opts, connections, dialer.tls());
    let start = Instant::now();
    // Settings that cannot go together, and a policy the VM cannot serve,
    // are refused before anything starts; no policy named is the best it
    // serves.
    let chosen = opts
        .validate()
        .map_err(MigrationError::from)
        .and_then(|()| refuse_if_blocked(vm, opts))
        .and_then(|()| refuse_if_too_few(dialer, opts))
        .and_then(|()| crate::converge::choose(opts.converge, vm));
    let opts = &match chosen {
        Ok(policy) => PrecopyOptions {
            converge: Some(policy),
            ..opts.clone()
        },
        Err(e) => {
            let mut summary = summary;
            summary.error = Some(e.chain());
            return (summary, Err(e));
        }
    };
    // While this runs, a VM command (a throttle) reaches the VM through the
    // tunables. A caller that owns the VM may have marked it migrating
    // already, so that a throttle asked in between waits here and is not
    // queued behind the whole migration.
    opts.tunables.set_migrating(true);
    let _migrating = Migrating(&opts.tunables);
    let give_up = opts
        .give_up_after
        .map(|after| GiveUp::arm(&opts.tunables, after));
    let disarm = |result| match give_up {
        Some(g) => g.disarm(result),
        None => result,
    };
    vm.migration_event(Lifecycle::Started);
    progress.phase(Phase::Handshake);
    let health = Arc::new(Health::new(Side::Source, opts.stall_timeout));
    let session = new_session_id();
    let hello = |channel: u16| Hello {
        session,
        channel,
        data_channels: connections as u16,
        priority: opts.mode.may_postcopy(),
        recover: false,
    };
    let control = open_channel(dialer, hello(0), opts.stall_timeout)
        .and_then(|io| MainChannel::start(io, Arc::clone(&health)));
    let control = match control {
        Ok(c) => c,
        Err(e) => {
            progress.phase(Phase::Done);
            let mut summary = summary;
            summary.total_ms = ms(start.elapsed());
            let e = disarm(Err(e)).unwrap_err();
            summary.error = Some(e.chain());
            vm.migration_event(Lifecycle::Aborted(summary.error.as_deref().unwrap_or("")));
            return (summary, Err(e));
        }
    };
    let mut src = Source::new(vm, control, health, opts, progress, session, summary, start);
    let result = src.run(dialer, &hello);
    src.conclude(disarm(result))
}

/// Refuses, before anything connects, a migration over connections handed
/// over that cannot open all it needs.
fn refuse_if_too_few(dialer: &dyn Dial, opts: &PrecopyOptions) -> Result<(), MigrationError> {
    let postcopy = opts.mode.may_postcopy();
    let needed = 1 + opts.connections + usize::from(postcopy);
    match dialer.available() {
        Some(given) if given < needed => Err(crate::error::TransportError::TooFewHeld {
            needed,
            data: opts.connections,
            priority: if postcopy { ", 1 priority" } else { "" },
            given,
        }
        .into()),
        _ => Ok(()),
    }
}

/// Refuses, before anything connects, a migration the VM or the operator
/// blocks, or a mode that may switch to postcopy when postcopy is blocked.
fn refuse_if_blocked(vm: &dyn Vm, opts: &PrecopyOptions) -> Result<(), MigrationError> {
    let blocked = Blocked::of(vm, &opts.blockers);
    if let Some(reason) = blocked.migration {
        return Err(MigrationError::Refused(format!(
            "the VM cannot migrate: {reason}"
        )));
    }
    match blocked.postcopy {
        Some(reason) if opts.mode.may_postcopy() => Err(MigrationError::Refused(format!(
            "the VM cannot use postcopy ({reason}), and {} mode may switch to it: \
             use --mode precopy",
            opts.mode
        ))),
        _ => Ok(()),
    }
}

impl Source<'_> {
    fn run(
        &mut self,
        dialer: &dyn Dial,
        hello: &dyn Fn(u16) -> Hello,
    ) -> Result<(), MigrationError> {
        let strict = self.handshake()?;
        self.summary.switchover.verify_before_resume = strict;
        if strict && self.opts.mode.may_postcopy() {
            return Err(MigrationError::Refused(format!(
                "{} cannot verify the digest before the guest resumes; \
                 drop --verify-before-resume on either side, or use --mode precopy",
                self.opts.mode
            )));
        }
        self.open_links(dialer, hello, None)?;

        // A paused guest dirties nothing: precopy moves it whole, and it
        // arrives paused (postcopy would have to run it on the destination).
        let may_switch = self.vm.is_running();
        if !may_switch && self.opts.mode.may_postcopy() {
            self.summary.mode = Mode::Precopy;
        }
        if self.opts.mode == Mode::Postcopy && may_switch {
            return self.postcopy_switchover(0, self.ram.frames(), dialer, hello);
        }
        // The meter starts first: a writer that re-dirties its working set
        // as soon as logging write-protects it (a few milliseconds on the
        // soft MMU) is then seen by the first interval, not missed.
        self.convergence.converger.start_meter(&mut *self.vm);
        self.start_logging()?;
        // The full pass sends every page, so VMM writes made so far are covered.
        let mut dirty = DirtyPages::new(self.pages);
        self.ram.take_vmm_dirty(&mut dirty);
        dirty.clear();

        self.progress.phase(Phase::FullPass);
        let mut switch_rule = SwitchRule::default();
        let mut last_harvest = Instant::now();
        self.send_round(0, RoundKind::Full, &self.ram.frames())?;
        self.send_live()?;
        let mut round = 1;
        // What the guest may dirty while it settles before the pause.
        let mut settle = 0;
        loop {
            self.vm
                .check_health()
                .map_err(MigrationError::backend("keep the guest running"))?;
            let t = Instant::now();
            let (found, since) = self.harvest(&mut dirty, &mut last_harvest)?;
            let harvest = t.elapsed();
            self.finish_round(found, since, harvest);
            let last = self.summary.memory.rounds.last();
            let sent = last.map(|r| Transfer {
                raw: r.raw_bytes,
                wire: r.bytes,
                secs: r.ms / 1e3,
                whole_round: true,
            });
            let bandwidth = self.plan_bandwidth(sent);
            let remaining = dirty.count() * EST_BYTES_PER_PAGE;
            let round_end = RoundEnd {
                dirty_bytes: found * PAGE_SIZE as u64,
                sent_bytes: sent.map_or(0, |t| t.raw),
            };
            let sample = self.sample(round - 1, remaining, bandwidth, Some(round_end));
            self.convergence
                .converger
                .after_round(sample, &mut *self.vm, &self.opts.tunables)?;
            for step in self.convergence.converger.unreported() {
                self.progress.throttle_changed(step);
            }
            let tun = &self.opts.tunables;
            let predicted = FinalRound {
                queued_bytes: self
                    .convergence
                    .link
                    .guest_bytes(self.links.health.queued_bytes()),
                dirty_bytes: remaining,
                device_bytes: self.devices.declared_at_pause + self.live_pending(),
                device_bytes_per_sec: self.summary.devices.device_state_bytes_per_sec,
                link_bytes_per_sec: bandwidth,
                harvest,
            }
            .downtime();
            self.summary.switchover.predicted_downtime_ms = ms(predicted);
            self.progress.downtime_predicted(predicted);
            let fits = switch_rule.decide(predicted, tun.downtime_target());
            self.summary.converged = dirty.is_empty() || fits;
            if self.summary.converged {
                settle = settle_allowance(predicted, tun.downtime_target(), bandwidth);
                break;
            }
            let capped = round >= tun.max_rounds();
            let stalled = std::mem::take(&mut self.convergence.converger.switch_requested);
            let asked = tun.take_postcopy_request();
            if asked && self.opts.mode.may_postcopy() {
                self.convergence
                    .converger
                    .note(round, crate::summary::EscalationKind::OperatorPostcopy);
            }
            let switch = self.opts.mode.switch_after(round)
                || ((capped || stalled || asked) && self.opts.mode.may_postcopy());
            if switch && self.vm.is_running() {
                return self.postcopy_switchover(round, dirty, dialer, hello);
            }
            if capped {
                break;
            }
            if round == 1 {
                self.progress.phase(Phase::DirtyRounds);
            }
            let set = std::mem::replace(&mut dirty, DirtyPages::new(self.pages));
            self.send_round(round, RoundKind::Dirty, &set)?;
            self.send_live()?;
            round += 1;
        }
        if self.opts.tunables.is_cancelled() {
            return Err(MigrationError::Cancelled);
        }
        self.switchover(round, dirty, strict, settle)
    }
}
