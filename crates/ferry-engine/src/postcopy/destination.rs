//! The destination's postcopy switchover: drop stale copies, start the
//! pager, resume at once, and wait for every page before the digest. When
//! the connections break on the way, the guest runs on (a vCPU that touches
//! a missing page waits in the kernel) while the source reconnects.

use super::pager::Pager;
use super::recoverable;
use crate::error::MigrationError;
use crate::session::{unexpected, Dest, ReceiveOptions};
use crate::summary::ms;
use crate::summary::PostcopyReport;
use crate::transport::Listen;
use crate::wire::{MemoryDigest, Message};
use ferry_vm::uffd::DeviceFaults;
use std::time::{Duration, Instant};

/// How often the destination looks whether every page is in.
const ALL_IN_POLL: Duration = Duration::from_millis(2);

impl Dest {
    /// Postcopy from the Switchover on: the source sends round
    /// `final_round` (the push) after the guest resumes here.
    pub(crate) fn postcopy(
        &mut self,
        final_round: u32,
        switched: crate::session::Moment,
        listener: &dyn Listen,
        opts: &ReceiveOptions,
    ) -> Result<(), MigrationError> {
        // Every precopy page must be in before the stale ones are dropped.
        if final_round > 0 {
            self.loaded.wait_round(final_round - 1, &self.health)?;
        }
        self.summary.resume_steps.pages_ms = switched.elapsed_ms();
        let missing = self
            .missing
            .take()
            .unwrap_or_else(|| ferry_vm::DirtyPages::new(self.header.pages()));
        self.loaded.begin_postcopy(&missing)?;
        let mut pager = Some(self.start_pager(opts, false)?);
        // A backend whose vCPUs resolve their own faults asks for pages on
        // their threads (annotated exits); the others fault through
        // userfaultfd to the pager's handler thread.
        let exits = ferry_vm::FaultExits {
            present: self.loaded.present_set(),
            fetch: super::pager::fetcher(std::sync::Arc::clone(&self.loaded), opts.prefetch),
        };
        // Hugetlb: every fault asks for a whole huge page, which the
        // handler thread does (the vCPUs' own requests are per page).
        let fault_path = if !opts.vcpu_fault_exits || self.loaded.places_huge_pages() {
            "userfaultfd"
        } else {
            match self.vm.memory_faults().map(|m| m.set_fault_exits(exits)) {
                Some(Ok(())) => "vcpu exit",
                Some(Err(e)) => {
                    tracing::debug!("faults go through userfaultfd: {e}");
                    "userfaultfd"
                }
                None => "userfaultfd",
            }
        };
        self.restore_state()?;
        // Devices in other processes fault through userfaultfds of their
        // own: served from the same pages, before the VM (and they) start.
        let devices = self
            .vm
            .device_userfaultfds()
            .map_err(MigrationError::backend("set devices up for postcopy"))?;
        let device_faults = (!devices.is_empty()).then(|| {
            DeviceFaults::start(
                devices,
                super::pager::fetcher(std::sync::Arc::clone(&self.loaded), opts.prefetch),
            )
        });
        // What the probe reads may be on a missing page: the pager fetches it.
        self.read_probe(opts)?;
        self.resume(switched)?;
        let resumed = Instant::now();
        self.loaded.clock.start(resumed);
        let mut report = PostcopyReport::default();
        let mut postcopy_ms = None;
        let digest = loop {
            match self.all_in_and_digest(final_round, resumed, &mut postcopy_ms) {
                Ok(d) => break d,
                Err(e) => {
                    let e = self.health.settle(e);
                    if !recoverable(&e) || opts.recover_timeout.is_zero() {
                        return Err(e);
                    }
                    if let Some(p) = pager.take() {
                        report.add(&p.stop());
                    }
                    tracing::warn!(
                        "postcopy connections broke ({}); the guest runs on, waiting up to {} s \
                         for the source to reconnect",
                        e.chain(),
                        opts.recover_timeout.as_secs()
                    );
                    self.await_recovery(listener, final_round, opts.recover_timeout, e)?;
                    report.recoveries += 1;
                    pager = Some(self.start_pager(opts, true)?);
                }
            }
        };
        if let Some(p) = pager.take() {
            report.add(&p.stop());
        }
        report.device_faults = device_faults.map_or(0, DeviceFaults::stop);
        report.block_ms = self.loaded.clock.block_ms();
        report.page_requests = self.loaded.requests.sent();
        // The device-fault threads ask through the vCPUs' fetcher, once a
        // fault: those are not vCPU exits.
        report.vcpu_exits = self
            .loaded
            .requests
            .exits
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_sub(report.device_faults);
        report.fault_path = fault_path.into();
        report.postcopy_ms = postcopy_ms.unwrap_or_default();
        report.missing_pages = missing.count();
        super::blocked::fill(
            &mut report,
            self.loaded.clock.by_thread(),
            &self.vm.vcpu_threads(),
        );
        self.summary.postcopy = Some(report);
        // Every page is in: the registration has nothing left to catch.
        self.loaded.end_placement();
        self.verify_and_commit(false, switched, digest)
    }

    /// The fault handler and priority reader, on the priority connection.
    fn start_pager(
        &mut self,
        opts: &ReceiveOptions,
        ask_again: bool,
    ) -> Result<Pager, MigrationError> {
        let Some(io) = self.priority.take() else {
            return Err(MigrationError::Refused(
                "a postcopy switchover without a priority connection".into(),
            ));
        };
        Pager::start(
            io,
            std::sync::Arc::clone(&self.loaded),
            std::sync::Arc::clone(&self.health),
            super::pager::Handling {
                prefetch: opts.prefetch,
                handlers: opts.fault_handlers,
                busy_poll: opts.fault_busy_poll,
            },
            ask_again,
        )
    }

    /// Waits until every page is in and the push's round has ended, then
    /// for the source's digest. Sets `postcopy_ms` when the last page lands.
    fn all_in_and_digest(
        &mut self,
        final_round: u32,
        resumed: Instant,
        postcopy_ms: &mut Option<f64>,
    ) -> Result<MemoryDigest, MigrationError> {
        let total = self.header.pages();
        while self.loaded.received.count() < total {
            self.health.check()?;
            std::thread::sleep(ALL_IN_POLL);
        }
        postcopy_ms.get_or_insert_with(|| ms(resumed.elapsed()));
        self.loaded.wait_round(final_round, &self.health)?;
        match self.ctl.recv_message("Digest")? {
            (Message::Digest(d), _) => Ok(d),
            (m, offset) => Err(unexpected("Digest", &m, offset)),
        }
    }
}
