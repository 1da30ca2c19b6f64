//! The destination's postcopy switchover: drop stale copies, start the
//! pager, resume at once, and wait for every page before the digest.

use super::pager::Pager;
use crate::error::MigrationError;
use crate::precopy::{guest_totals, Dest, ReceiveOptions};
use crate::summary::ms;
use std::time::{Duration, Instant};

/// How often the destination looks whether every page is in.
const ALL_IN_POLL: Duration = Duration::from_millis(2);

impl Dest<'_> {
    /// Postcopy from the Switchover on: the source sends round
    /// `final_round` (the push) after the guest resumes here.
    pub(crate) fn postcopy(
        &mut self,
        final_round: u32,
        switched: Instant,
        opts: &ReceiveOptions,
    ) -> Result<(), MigrationError> {
        // Every precopy page must be in before the stale ones are dropped.
        if final_round > 0 {
            self.loaded.wait_round(final_round - 1, self.health)?;
        }
        let missing = self
            .missing
            .take()
            .unwrap_or_else(|| ferry_backend::DirtyPages::new(self.header.pages()));
        self.loaded.begin_postcopy(&missing)?;
        let Some(io) = self.priority.take() else {
            return Err(MigrationError::Refused(
                "a postcopy switchover without a priority connection".into(),
            ));
        };
        let pager = Pager::start(
            io,
            std::sync::Arc::clone(&self.loaded),
            std::sync::Arc::clone(self.health),
            opts.prefetch,
        )?;
        let state = self.vcpu_state.take().ok_or(MigrationError::Protocol {
            expected: "VcpuState before Switchover",
            got: crate::wire::FrameKind::Switchover,
            offset: 0,
        })?;
        self.vm
            .restore_vcpus(&state)
            .map_err(MigrationError::backend("restore vCPU state"))?;
        // The guest's counters may be on a missing page: the pager fetches it.
        let (passes_before, mismatches_before) = guest_totals(&self.loaded.ram, self.header.vcpus)
            .map_err(MigrationError::ram("read guest progress"))?;
        self.resume(switched)?;
        let resumed = Instant::now();
        let total = self.header.pages();
        while self.loaded.received.count() < total {
            self.health.check()?;
            std::thread::sleep(ALL_IN_POLL);
        }
        let postcopy_ms = ms(resumed.elapsed());
        self.loaded.wait_round(final_round, self.health)?;
        let mut report = pager.stop();
        report.postcopy_ms = postcopy_ms;
        report.missing_pages = missing.count();
        self.summary.postcopy = Some(report);
        // Every page is in: the registration has nothing left to catch.
        self.loaded.end_placement();
        self.verify_and_run(false, switched, passes_before, mismatches_before, opts)
    }
}
