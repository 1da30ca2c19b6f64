//! The source's side of a migration, whichever mode drives it: the VM, its
//! connections (control, data senders, and the page server when postcopy
//! may follow), dirty logging and harvests, sending a round, and the
//! summary. Precopy's round loop (`crate::precopy`) and postcopy's
//! switchover and push (`crate::postcopy`) both drive it; the pause, the
//! vCPU state, the digest and the commit are in `switchover.rs`.

use super::delta::DeltaCache;
use super::dest_takes::DestTakes;
use super::device_plan::DevicePlan;
use super::links::Links;
use super::page_server::PageServer;
use super::senders::Senders;
use super::within_round::WithinRound;
use super::{unexpected, PostcopyResume, PrecopyOptions, SourcePhase};
use crate::converge::{Converger, RoundEnd, Sample};
use crate::converge::{LinkEstimate, Transfer};
use crate::error::MigrationError;
use crate::progress::{Phase, Progress};
use crate::summary::{
    ms, ConvergenceReport, DeviceReport, GuestReport, LinkReport, MemoryReport, MigrationSummary,
    Outcome, RoundKind, RoundStats, SwitchoverReport,
};
use crate::transport::{open_channel, Dial, Health, MainChannel};
use crate::tunables::TokenBucket;
use crate::wire::capabilities::{self, CAPABILITIES_SINCE};
use crate::wire::frame::FRAME_HEADER_LEN;
use crate::wire::messages::Hello;
use crate::wire::messages::PRIORITY_CHANNEL;
use crate::wire::{FrameKind, Message, PageBatch, StreamHeader, VERSION};
use ferry_vm::{DirtyPages, Gfn, GuestRam, Lifecycle, Vm, VmError, PAGE_SIZE};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wire bytes a dirty page is assumed to cost when estimating downtime.
pub(crate) const EST_BYTES_PER_PAGE: u64 = PAGE_SIZE as u64 + 16;
/// How often a round's end checks whether its queues have drained.
const DRAIN_POLL: Duration = Duration::from_millis(1);
/// The longest a round waits for its queues to drain.
const MAX_DRAIN: Duration = Duration::from_secs(1);

impl MigrationSummary {
    /// The summary of a migration of `vm` with `opts` that ended in
    /// `error` before the engine produced one (it could not connect, or
    /// the VM refused): what a caller reports for it.
    pub fn failed_before_start(
        vm: &mut dyn Vm,
        opts: &PrecopyOptions,
        tls: bool,
        error: String,
    ) -> Self {
        MigrationSummary {
            error: Some(error),
            ..fresh_summary(vm, opts, opts.connections, tls)
        }
    }
}

/// The summary of a migration about to start: status `failed` until it
/// completes.
pub(crate) fn fresh_summary(
    vm: &mut dyn Vm,
    opts: &PrecopyOptions,
    connections: usize,
    tls: bool,
) -> MigrationSummary {
    MigrationSummary {
        status: Outcome::Failed,
        backend: vm.vmm_id().to_string(),
        mode: opts.mode,
        total_ms: 0.0,
        downtime_ms: 0.0,
        converged: false,
        digest_match: false,
        digest_checked: false,
        error: None,
        link: LinkReport {
            wire_version: VERSION,
            connections,
            tls,
            bytes_sent: 0,
            compression: opts.compression,
            batches_by_codec: [0; 3],
            delta: None,
        },
        switchover: SwitchoverReport {
            predicted_downtime_ms: 0.0,
            dest_resume_ms: 0.0,
            downtime_cpu_ms: 0.0,
            pause_ms: 0.0,
            save_vcpus_ms: 0.0,
            save_sections_ms: 0.0,
            digest_ms: 0.0,
            digest_yield_ms: 0.0,
            verify_before_resume: opts.verify_before_resume,
            settle_ms: 0.0,
            settle_pages: 0,
            settle_all_ran: false,
        },
        devices: DeviceReport {
            device_state_bytes_per_sec: super::device_cost::rate(vm.vmm_id()),
            device_bytes_at_pause: 0,
            device_bytes_live: 0,
        },
        memory: MemoryReport {
            dirty_tracking: ferry_vm::dirty_tracking(vm).to_string(),
            discarded_bytes: vm.ram().discarded_pages() * ferry_vm::PAGE_SIZE as u64,
            spared_pages: 0,
            deferred_pages: 0,
            rounds: Vec::new(),
        },
        convergence: ConvergenceReport {
            converge: opts.converge,
            predicted: None,
            throttle_timeline: Vec::new(),
            escalations: Vec::new(),
            operator_changes: Vec::new(),
            vcpu_shares: Vec::new(),
        },
        guest: GuestReport::default(),
        postcopy: None,
    }
}

impl<'a> Source<'a> {
    /// The source side of a migration over `ctl`, before anything is sent.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        vm: &'a mut dyn Vm,
        ctl: MainChannel,
        health: Arc<Health>,
        opts: &'a PrecopyOptions,
        progress: &'a dyn Progress,
        session: u64,
        mut summary: MigrationSummary,
        start: Instant,
    ) -> Self {
        summary.link.wire_version = ctl.version();
        let max_downtime = opts
            .max_downtime
            .unwrap_or_else(|| opts.tunables.downtime_target());
        let ram = Arc::clone(vm.ram());
        Source {
            convergence: Convergence {
                logging: false,
                within: WithinRound::new(ram.pages()),
                converger: Converger::new(opts.converge.unwrap_or_default(), max_downtime)
                    .switching_on_stall(opts.mode.switch_on_stall()),
                link: LinkEstimate::default(),
            },
            pages: ram.pages(),
            vm,
            ram,
            links: Links {
                ctl,
                senders: None,
                health,
                bytes_before: 0,
                server: None,
                session,
            },
            opts,
            progress,
            phase: SourcePhase::Copying,
            postcopy_round: 0,
            devices: DevicePlan::default(),
            dest_takes: DestTakes::default(),
            start,
            summary,
        }
    }

    /// The summary and result of a migration that ended with `result`:
    /// on success the connections close; on failure the destination is told
    /// why, and the VM runs again unless postcopy began.
    pub(crate) fn conclude(
        mut self,
        result: Result<(), MigrationError>,
    ) -> (MigrationSummary, Result<(), MigrationError>) {
        if self.summary.status != Outcome::Completed {
            self.summary.total_ms = ms(self.start.elapsed());
        }
        self.summary.link.bytes_sent = self.links.bytes_sent();
        if let Some(s) = &self.links.senders {
            self.summary.link.batches_by_codec = s.stats.counts();
            self.summary.link.delta = s.delta_summary();
        }
        self.summary.convergence.throttle_timeline =
            std::mem::take(&mut self.convergence.converger.timeline);
        self.summary.convergence.escalations =
            std::mem::take(&mut self.convergence.converger.escalations);
        self.summary.convergence.operator_changes =
            std::mem::take(&mut self.convergence.converger.operator_changes);
        self.summary.convergence.converge = Some(self.convergence.converger.mode());
        self.progress.phase(Phase::Done);
        match result {
            Ok(()) => {
                if let Some(s) = self.links.senders.take() {
                    s.finish();
                }
                self.links.ctl.close();
                // A copy held after a lost Commit waits for its operator.
                match self.summary.status {
                    Outcome::Completed => self.vm.migration_event(Lifecycle::Completed),
                    Outcome::Held => {}
                    _ => self.vm.migration_event(Lifecycle::Aborted(
                        self.summary.error.as_deref().unwrap_or("not completed"),
                    )),
                }
                (self.summary, Ok(()))
            }
            Err(e) => {
                drop(self.links.senders.take());
                // A postcopy's destination runs the guest and waits to be
                // reconnected: it is not told to give up.
                let in_postcopy = self.phase.in_postcopy();
                let e = if in_postcopy {
                    self.links.ctl.abandon(e)
                } else {
                    self.links.ctl.give_up(e)
                };
                let e = match e {
                    e if in_postcopy => MigrationError::Postcopy {
                        missing: self
                            .summary
                            .postcopy
                            .as_ref()
                            .map_or(0, |p| p.missing_pages),
                        unsent: self.unsent(),
                        resume: PostcopyResume {
                            session: self.links.session,
                            round: self.postcopy_round,
                            connections: self.summary.link.connections,
                        },
                        source: Box::new(e),
                    },
                    e @ (MigrationError::Peer { .. } | MigrationError::Protocol { .. }) => e,
                    e if self.phase.awaiting_verdict() => MigrationError::Unconfirmed(Box::new(e)),
                    e => e,
                };
                if in_postcopy {
                    tracing::warn!("postcopy failed: {}", e.chain());
                } else {
                    tracing::warn!("migration failed, source resumes: {}", e.chain());
                }
                self.rollback();
                self.summary.status = Outcome::Failed;
                self.summary.error = Some(e.chain());
                self.vm.migration_event(Lifecycle::Aborted(&e.chain()));
                (self.summary, Err(e))
            }
        }
    }
}

/// Clears [`Tunables::set_migrating`] however `migrate` returns, and drops a
/// throttle or policy request it did not take: it does not apply to the
/// next one.
pub(crate) struct Migrating<'a>(pub(crate) &'a crate::tunables::Tunables);

impl Drop for Migrating<'_> {
    fn drop(&mut self) {
        self.0.set_migrating(false);
        self.0.take_throttle_request();
        self.0.take_policy_request();
        self.0.take_postcopy_request();
    }
}

/// A random id for one migration's connections.
pub(crate) fn new_session_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(start_nanos());
    h.write_u32(std::process::id());
    h.finish()
}

fn start_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// The source's dirty logs and what decides when precopy's rounds end.
pub(crate) struct Convergence {
    /// Whether the dirty logs run (this migration started them).
    pub(crate) logging: bool,
    /// Pages harvested within the current round (see [`WithinRound`]).
    pub(crate) within: WithinRound,
    /// The convergence policy, its meter and what it has done.
    pub(crate) converger: Converger,
    /// What the link moves, as measured so far.
    pub(crate) link: LinkEstimate,
}

/// The source's side of one migration. Its state, by concern:
/// - the VM and its memory (`vm`, `ram`, `pages`);
/// - the connections to the destination (`links`);
/// - dirty logging and convergence, with what the link was measured to
///   move (`convergence`);
/// - the device state (`devices`) and the destination's capabilities
///   that change the switchover (`dest_takes`);
/// - where the migration stands (`phase`, `postcopy_round`);
/// - the accounting (`start`, `summary`).
pub(crate) struct Source<'a> {
    pub(crate) vm: &'a mut dyn Vm,
    pub(crate) ram: Arc<GuestRam>,
    /// The connections to the destination.
    pub(crate) links: Links,
    pub(crate) opts: &'a PrecopyOptions,
    pub(crate) progress: &'a dyn Progress,
    /// The guest's memory in pages.
    pub(crate) pages: u64,
    /// The dirty logs and what ends precopy's rounds.
    pub(crate) convergence: Convergence,
    /// Where the migration stands here, and so what a failure does.
    pub(crate) phase: SourcePhase,
    /// When the migration started, and what it reports.
    pub(crate) start: Instant,
    pub(crate) summary: MigrationSummary,
    /// The round the postcopy push sends, once switched.
    pub(crate) postcopy_round: u32,
    /// What happens to the VM's device state, as the handshake agreed.
    pub(crate) devices: DevicePlan,
    /// What the destination took of this source's wishes.
    pub(crate) dest_takes: DestTakes,
}

impl Source<'_> {
    /// Opens the data connections (and the priority connection, when the
    /// migration may switch to postcopy) and starts their senders and the
    /// page server.
    /// A recovery's page server starts `armed` with the postcopy round and
    /// the pages to send, so that it answers the destination's first
    /// requests.
    pub(crate) fn open_links(
        &mut self,
        dialer: &dyn Dial,
        hello: &dyn Fn(u16) -> Hello,
        armed: Option<(u32, &DirtyPages)>,
    ) -> Result<(), MigrationError> {
        let mut links = Vec::new();
        for channel in 1..=self.summary.link.connections as u16 {
            let io = open_channel(dialer, hello(channel), self.opts.stall_timeout)?;
            self.links.health.add_data_link(
                io.get_ref()
                    .try_clone_link()
                    .map_err(crate::wire::StreamError::Io)?,
            );
            links.push(io);
        }
        self.links.senders = Some(Senders::start(
            links,
            self.opts.batch_pages,
            self.opts.compression,
            (self.opts.delta_cache_bytes > 0).then(|| DeltaCache::new(self.opts.delta_cache_bytes)),
            TokenBucket::new(Arc::clone(&self.opts.tunables)),
            Arc::clone(&self.links.health),
        )?);
        if self.opts.mode.may_postcopy() {
            let io = open_channel(dialer, hello(PRIORITY_CHANNEL), self.opts.stall_timeout)?;
            self.links.health.add_data_link(
                io.get_ref()
                    .try_clone_link()
                    .map_err(crate::wire::StreamError::Io)?,
            );
            let bucket = self.links.senders.as_ref().map(Senders::bucket);
            let bucket = bucket.ok_or(MigrationError::Aborted)?;
            self.links.server = Some(PageServer::start(
                io,
                Arc::clone(&self.ram),
                Arc::clone(&self.links.health),
                bucket,
                armed,
            )?);
        }
        Ok(())
    }

    /// Header, and the destination's Accept. Returns whether the
    /// destination verifies before resuming.
    /// From wire 6 on, the header asks for the capabilities this
    /// migration may use, and a destination that refuses one stops it
    /// here, before any memory moves.
    pub(crate) fn handshake(&mut self) -> Result<bool, MigrationError> {
        let mut header = StreamHeader::for_vm(&mut *self.vm);
        let mut needed = self.opts.capabilities();
        if crate::wire::sections::may_need_parts(&header.sections, &header.section_bytes) {
            needed.push(crate::wire::capabilities::SECTION_PARTS.to_string());
        }
        let mut live = self
            .vm
            .live_state()
            .map(|l| l.live_sections())
            .unwrap_or_default();
        if !live.is_empty() {
            needed.push(crate::wire::capabilities::LIVE_SECTIONS.to_string());
        }
        let parts = needed
            .iter()
            .any(|c| c == crate::wire::capabilities::SECTION_PARTS);
        let asks = self.links.ctl.version() >= CAPABILITIES_SINCE;
        if !live.is_empty() && !asks {
            // A wire-5 peer cannot take them live: all go at the pause.
            live.clear();
        }
        if parts && !asks {
            return Err(MigrationError::Refused(format!(
                "the VM's sections declare more device state than one frame holds, and the \
                 destination (wire {}) cannot take it in parts",
                self.links.ctl.version()
            )));
        }
        if asks {
            // A wish, like live sections: a destination that takes it
            // resumes before a strict switchover's verdict.
            let mut asked = needed.clone();
            asked.push(capabilities::HELD_OUTPUTS.to_string());
            if ferry_vm::saves_compact_vcpu_state(&mut *self.vm) {
                asked.push(capabilities::COMPACT_VCPU_STATE.to_string());
            }
            header.capabilities = Some(asked);
        }
        self.links
            .ctl
            .send_frame(FrameKind::Header, &header.encode())?;
        let (verify_before_resume, answer) = match self.links.ctl.recv_message("Accept")? {
            (
                Message::Accept {
                    verify_before_resume,
                    answer,
                },
                _,
            ) => (verify_before_resume, answer),
            (m, offset) => return Err(unexpected("Accept", &m, offset)),
        };
        self.dest_takes = DestTakes::from_answer(answer.as_ref());
        match answer {
            Some(a) => {
                // Live sections are a wish: refused, they go at the pause.
                let live_cap = crate::wire::capabilities::LIVE_SECTIONS;
                if !a.takes.iter().any(|c| c == live_cap) {
                    live.clear();
                }
                needed.retain(|c| c != live_cap);
                if let Some((cap, reason)) = a.first_refused(&needed) {
                    return Err(MigrationError::Refused(format!(
                        "the destination does not take {cap}: {reason}"
                    )));
                }
            }
            None if asks => {
                return Err(MigrationError::Refused(format!(
                    "the destination speaks wire {} and did not answer the capabilities asked",
                    self.links.ctl.version()
                )))
            }
            None => {}
        }
        // Parts were asked for, so taken once past the answer above.
        self.devices = DevicePlan::agreed(header.sections, header.section_bytes, live, parts);
        Ok(self.opts.verify_before_resume || verify_before_resume)
    }

    /// Backend log ∪ VMM writes into `into`. Returns the pages found and the
    /// time since the previous harvest (`last`, which is reset).
    pub(crate) fn harvest(
        &mut self,
        into: &mut DirtyPages,
        last: &mut Instant,
    ) -> Result<(u64, Duration), MigrationError> {
        let before = into.count();
        self.collect_logs(into)?;
        self.convergence.within.take_into(into);
        self.summary.memory.spared_pages = self.convergence.within.spared();
        self.summary.memory.deferred_pages = self.convergence.within.deferred();
        let since = last.elapsed();
        *last = Instant::now();
        Ok((into.count() - before, since))
    }

    /// Starts every dirty log: the VM's dirty sources first, so that one
    /// that cannot report refuses the migration (naming it) before the VM
    /// starts logging; then the VM's own.
    pub(crate) fn start_logging(&mut self) -> Result<(), MigrationError> {
        crate::dirty_logs::start(&mut *self.vm)?;
        self.convergence.logging = true;
        Ok(())
    }

    /// The VM's log, its dirty sources' and the VMM's own writes, into
    /// `into`.
    fn collect_logs(&mut self, into: &mut DirtyPages) -> Result<(), MigrationError> {
        crate::dirty_logs::collect(&mut *self.vm, into)
    }

    /// Stops every dirty log, if they run (`when` says when, for the log).
    pub(crate) fn stop_logging(&mut self, when: &str) {
        if std::mem::take(&mut self.convergence.logging) {
            crate::dirty_logs::stop(&mut *self.vm, when);
        }
    }

    /// Records the harvest that followed the last round in its stats.
    pub(crate) fn finish_round(&mut self, found: u64, since: Duration, harvest: Duration) {
        if let Some(r) = self.summary.memory.rounds.last_mut() {
            r.harvest_ms = ms(harvest);
            let secs = since.as_secs_f64();
            r.dirty_rate_pages_s = if secs > 0.0 { found as f64 / secs } else { 0.0 };
            self.progress.round_finished(r);
        }
    }

    /// Bytes/s of guest memory to plan with, after learning from
    /// `transfer` (see [`LinkEstimate`]).
    pub(crate) fn plan_bandwidth(&mut self, transfer: Option<Transfer>) -> f64 {
        if let Some(t) = transfer {
            self.convergence.link.learn(t);
        }
        self.convergence
            .link
            .guest_rate(self.opts.tunables.bandwidth_bytes_per_sec())
    }

    /// What the policy is told now: the per-vCPU dirty count since its
    /// last sample, and the figures given.
    pub(crate) fn sample(
        &mut self,
        round: u32,
        remaining_bytes: u64,
        link_bytes_per_sec: f64,
        round_end: Option<RoundEnd>,
    ) -> Sample {
        let (elapsed, vcpu_dirty_bytes) = self.convergence.converger.read_meter(&mut *self.vm);
        Sample {
            round,
            elapsed,
            vcpu_dirty_bytes,
            remaining_bytes,
            guest_bytes: self.ram.size(),
            link_bytes_per_sec,
            downtime_target: self.opts.tunables.downtime_target(),
            quota_interval: self.opts.tunables.quota_interval(),
            vcpus: self.vm.vcpus(),
            round_end,
            within_round_found: self
                .opts
                .harvest_within_rounds
                .then(|| self.convergence.within.found() * PAGE_SIZE as u64),
            resends_found: self
                .opts
                .harvest_within_rounds
                .then(|| self.convergence.within.take_resends() * PAGE_SIZE as u64),
        }
    }

    /// Between two batches of a round that started at `t` with the data
    /// connections at `bytes_at`, having sent `raw` guest bytes and with
    /// `left` pages of it to go: operator requests, and the policy once per
    /// interval.
    /// Also harvests once per interval, filing what it finds by `cursor`,
    /// the first page of `set` not read yet.
    fn between_batches(
        &mut self,
        round: u32,
        (t, bytes_at, raw): (Instant, u64, u64),
        (set, cursor): (&DirtyPages, Gfn),
        left: u64,
    ) -> Result<(), MigrationError> {
        let tun = &self.opts.tunables;
        if self.convergence.converger.interval_due(tun) {
            if self.convergence.logging && self.opts.harvest_within_rounds {
                self.harvest_within_round(set, cursor)?;
            }
            let link = self.plan_bandwidth(Some(Transfer {
                raw,
                wire: self.links.health.data_bytes() - bytes_at,
                secs: t.elapsed().as_secs_f64(),
                whole_round: false,
            }));
            let sample = self.sample(round, left * EST_BYTES_PER_PAGE, link, None);
            self.convergence
                .converger
                .on_interval(sample, &mut *self.vm, &self.opts.tunables)?;
        } else {
            // An operator's change lands within a batch.
            self.convergence
                .converger
                .live_requests(&mut *self.vm, tun, round)?;
        }
        for step in self.convergence.converger.unreported() {
            self.progress.throttle_changed(step);
        }
        Ok(())
    }

    /// Sends what the live sections have ready, on the main channel, at
    /// most what they had pending when called (a device that changes
    /// faster than the link sends is not chased for ever: the rest goes
    /// next round, or at the pause).
    pub(crate) fn send_live(&mut self) -> Result<(), MigrationError> {
        let Some(live) = self.vm.live_state() else {
            return Ok(());
        };
        for id in &self.devices.live {
            let mut budget = live.pending(id);
            while budget > 0 {
                let max = crate::wire::sections::PART_BYTES;
                let chunk = live
                    .save(id, max)
                    .map_err(MigrationError::backend("save live device state"))?;
                if chunk.is_empty() {
                    break;
                }
                if chunk.len() > max {
                    // The contract's bound: past it, a frame could outgrow
                    // what the destination reads.
                    return Err(MigrationError::Backend {
                        what: "save live device state",
                        source: VmError::BadSection {
                            section: id.to_string(),
                            reason: format!(
                                "LiveState::save gave {} bytes, more than the {max} asked for",
                                chunk.len()
                            ),
                        },
                    });
                }
                budget = budget.saturating_sub(chunk.len() as u64);
                self.summary.devices.device_bytes_live += chunk.len() as u64;
                let payload = crate::wire::sections::encode_live(id, &chunk);
                self.links
                    .ctl
                    .send_frame(FrameKind::LiveSection, &payload)?;
            }
        }
        Ok(())
    }

    /// What the live sections have pending now.
    pub(crate) fn live_pending(&mut self) -> u64 {
        let ids = &self.devices.live;
        self.vm
            .live_state()
            .map_or(0, |l| ids.iter().map(|id| l.pending(id)).sum())
    }

    /// A harvest while a round runs (see [`WithinRound`]).
    fn harvest_within_round(
        &mut self,
        set: &DirtyPages,
        cursor: Gfn,
    ) -> Result<(), MigrationError> {
        let mut found = DirtyPages::new(self.pages);
        self.collect_logs(&mut found)?;
        self.convergence.within.file(&found, set, cursor);
        Ok(())
    }

    pub(crate) fn send_round(
        &mut self,
        round: u32,
        kind: RoundKind,
        set: &DirtyPages,
    ) -> Result<(), MigrationError> {
        let t = Instant::now();
        self.progress.round_started(round, set.count());
        let bytes_at = self.links.health.data_bytes();
        let cancellable = kind != RoundKind::Final;
        let (opts, progress) = (self.opts, self.progress);
        let (mut pages, mut zero, mut raw) = (0u64, 0u64, 0u64);
        let mut batch = self.links.senders()?.batch()?;
        // The full pass leaves what it finds dirtied ahead of it for the
        // next round (`within_round`'s docs).
        let defers =
            kind == RoundKind::Full && self.opts.harvest_within_rounds && self.convergence.logging;
        self.convergence.within.defer_ahead(defers);
        for (first, count) in set.runs() {
            let (mut gfn, mut left) = (first.0, count as usize);
            while left > 0 {
                if defers && self.convergence.within.defers(Gfn(gfn)) {
                    gfn += 1;
                    left -= 1;
                    continue;
                }
                // Up to the next deferred page; rounds that defer nothing
                // do not look.
                let most = left.min(batch.room());
                let within = &self.convergence.within;
                let n = match defers {
                    true => (1..most)
                        .find(|&i| within.defers(Gfn(gfn + i as u64)))
                        .unwrap_or(most),
                    false => most,
                };
                let buf = batch.push_run(Gfn(gfn), n);
                self.ram
                    .read_pages_to_send(Gfn(gfn), buf)
                    .map_err(MigrationError::ram("read guest memory"))?;
                gfn += n as u64;
                left -= n;
                if batch.room() == 0 {
                    let senders = self.links.senders()?;
                    let full = std::mem::replace(&mut batch, senders.batch()?);
                    let (p, z, r) = ship(senders, full, round, cancellable, opts, progress)?;
                    pages += p;
                    zero += z;
                    raw += r;
                    if cancellable {
                        let left = set.count().saturating_sub(pages);
                        let at = (t, bytes_at, raw);
                        self.between_batches(round, at, (set, Gfn(gfn)), left)?;
                    }
                }
            }
        }
        let senders = self.links.senders()?;
        if batch.is_empty() {
            senders.recycle(batch);
        } else {
            let (p, z, r) = ship(senders, batch, round, cancellable, opts, progress)?;
            pages += p;
            zero += z;
            raw += r;
        }
        senders.end_round(round)?;
        if cancellable {
            self.drain_queues()?;
        }
        self.record_round(round, kind, t, bytes_at, (pages, zero, raw));
        Ok(())
    }

    /// Waits while the data connections deliver what they hold queued (the
    /// kernel's send queues and a shaped link's qdisc can hold a second of
    /// a slow link), for at most twice what the link needs for it. The
    /// round's time then measures the link, not how fast the socket took
    /// the bytes, and the switchover decision that follows sees a final
    /// round that would not wait behind them.
    fn drain_queues(&self) -> Result<(), MigrationError> {
        let queued = self.links.health.queued_bytes();
        if queued == 0 {
            return Ok(());
        }
        let need = self.convergence.link.drain_time(queued, MAX_DRAIN);
        let deadline = Instant::now() + 2 * need + DRAIN_POLL * 10;
        let small = (self.convergence.link.wire_rate() * DRAIN_POLL.as_secs_f64() * 2.0) as u64;
        while self.links.health.queued_bytes() > small && Instant::now() < deadline {
            self.links.health.check()?;
            if self.opts.tunables.is_cancelled() {
                return Err(MigrationError::Cancelled);
            }
            std::thread::sleep(DRAIN_POLL);
        }
        Ok(())
    }

    /// Adds a round that started at `t`, when the data connections had
    /// carried `bytes_at`, and sent `(pages, zero pages, raw bytes)`.
    pub(crate) fn record_round(
        &mut self,
        round: u32,
        kind: RoundKind,
        t: Instant,
        bytes_at: u64,
        (pages, zero, raw): (u64, u64, u64),
    ) {
        let elapsed = t.elapsed().max(Duration::from_nanos(1));
        let bytes = self.links.health.data_bytes() - bytes_at;
        self.summary.memory.rounds.push(RoundStats {
            round,
            kind,
            pages,
            zero_pages: zero,
            bytes,
            raw_bytes: raw,
            ms: ms(elapsed),
            dirty_rate_pages_s: 0.0,
            bandwidth_mb_s: bytes as f64 / elapsed.as_secs_f64() / 1e6,
            harvest_ms: 0.0,
        });
    }
}

/// Seals `batch` as part of `round` and hands it to a sender; returns its
/// pages, zero pages and uncompressed frame bytes.
pub(crate) fn ship(
    senders: &mut Senders,
    mut batch: PageBatch,
    round: u32,
    cancellable: bool,
    opts: &PrecopyOptions,
    progress: &dyn Progress,
) -> Result<(u64, u64, u64), MigrationError> {
    if cancellable && opts.tunables.is_cancelled() {
        return Err(MigrationError::Cancelled);
    }
    batch.seal(round);
    let bytes = (FRAME_HEADER_LEN + batch.payload_len()) as u64;
    let (pages, zero) = (batch.len() as u64, batch.zero_pages() as u64);
    senders.send(batch)?;
    progress.pages_sent(pages, bytes);
    Ok((pages, zero, bytes))
}
