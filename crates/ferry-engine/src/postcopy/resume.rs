//! Resuming a postcopy after its automatic recovery ran out of time.
//!
//! The source VM is still paused with every page (it never resumes after a
//! postcopy switchover), and the destination keeps its guest running and
//! waits for the same session for its own `--recover-timeout`. An operator
//! who has fixed the network resumes with the token the failed migration
//! returned ([`MigrationError::Postcopy`]): a new set of connections, the
//! destination's list of the pages it still lacks, then the push, the
//! digest and the report, as in an automatic recovery.

use super::recovery::RETRY_PAUSE;
use crate::error::MigrationError;
use crate::error::PostcopyResume;
use crate::progress::{Phase, Progress};
use crate::session::{fresh_summary, Migrating, PrecopyOptions, Source};
use crate::summary::{ms, MigrationSummary};
use crate::transport::{open_channel, Dial, Health, MainChannel, Side};
use crate::wire::messages::Hello;
use ferry_vm::Vm;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Resumes the postcopy `token` names, of the paused `vm`, to the
/// destination `dialer` reaches, trying to connect for up to
/// `opts.recover_timeout` (at least a second). Like
/// [`crate::migrate_accounted`], returns the summary in every case; a
/// failure is again [`MigrationError::Postcopy`], with the same token.
pub fn resume_postcopy(
    vm: &mut dyn Vm,
    dialer: &dyn Dial,
    opts: &PrecopyOptions,
    token: &PostcopyResume,
    progress: &dyn Progress,
) -> (MigrationSummary, Result<(), MigrationError>) {
    let start = Instant::now();
    let mut summary = fresh_summary(vm, opts, token.connections, dialer.tls());
    let failed = |summary: &mut MigrationSummary, e: MigrationError| {
        let e = MigrationError::Postcopy {
            missing: 0,
            unsent: 0,
            resume: *token,
            source: Box::new(e),
        };
        summary.total_ms = ms(start.elapsed());
        summary.error = Some(e.chain());
        progress.phase(Phase::Done);
        Err(e)
    };
    if vm.is_running() {
        let e = MigrationError::Refused(
            "the VM is running: only the paused source of a failed postcopy can resume it".into(),
        );
        summary.error = Some(e.chain());
        return (summary, Err(e));
    }
    // Paused since the switchover: its counters are those of the pause.
    if let Err(e) = crate::session::probe_paused(vm, opts, &mut summary) {
        let r = failed(&mut summary, e);
        return (summary, r);
    }
    opts.tunables.set_migrating(true);
    let _migrating = Migrating(&opts.tunables);
    progress.phase(Phase::Recovering);
    // Every connection of a resumed postcopy is a recovery connection.
    let hello = |channel: u16| Hello {
        session: token.session,
        channel,
        data_channels: token.connections as u16,
        priority: true,
        recover: true,
    };
    let deadline = Instant::now() + opts.recover_timeout.max(Duration::from_secs(1));
    let health = Arc::new(Health::new(Side::Source, opts.stall_timeout));
    let ctl = loop {
        let opened = open_channel(dialer, hello(0), opts.stall_timeout)
            .and_then(|io| MainChannel::start(io, Arc::clone(&health)));
        match opened {
            Ok(c) => break c,
            Err(e @ MigrationError::Peer { .. }) => {
                let result = failed(&mut summary, e);
                return (summary, result);
            }
            Err(e) if Instant::now() >= deadline => {
                let result = failed(&mut summary, e);
                return (summary, result);
            }
            Err(e) => {
                tracing::info!("resuming the postcopy: {}; trying again", e.chain());
                std::thread::sleep(RETRY_PAUSE);
            }
        }
    };
    let mut src = Source::new(
        vm,
        ctl,
        health,
        opts,
        progress,
        token.session,
        summary,
        start,
    );
    // A recovered source is in postcopy from its first step.
    src.phase = crate::session::SourcePhase::Postcopy { verifying: false };
    src.postcopy_round = token.round;
    let result = (|| {
        let missing = src.recv_still_missing()?;
        src.summary.postcopy.get_or_insert_default().missing_pages = missing.count();
        src.open_links(dialer, &hello, Some((token.round, &missing)))?;
        src.finish_postcopy(token.round, dialer, &hello)
    })();
    src.conclude(result)
}
