//! Postcopy recovery: when the connections break after the switchover, the
//! guest runs on at the destination (a vCPU that touches a missing page
//! waits in the kernel) and the source, paused, keeps every page. The
//! source dials a new set of connections for the same session, marked
//! `recover`; the destination says exactly which pages it still lacks,
//! and the push starts over from that list:
//!
//! ```text
//!  source (retries until --recover-timeout)      destination (listening)
//!  control: Hello(session, recover) ───────────► same session? Welcome
//!         ◄──────────────────────────────────── Missing(runs)…, Recover(count)
//!  data + priority: Hello(recover) ────────────► receivers restart in the push's round;
//!                                                 the pager asks again for every page
//!                                                 asked before and not placed yet
//!  push: every page of the list ───────────────► placed once, as before
//! ```
//!
//! Pages in flight when the connections broke are simply on the list: the
//! list is what the destination holds, not what the source sent. A second
//! cut, during recovery or after it, is met the same way, within one
//! deadline per outage. When the source never comes back, the destination
//! reports how many pages, and which ranges, only the source held.

use crate::error::MigrationError;
use crate::session::{unexpected, Dest, Source};
use crate::transport::{accept_channel, open_channel, Dial, Health, Listen, MainChannel, Side};
use crate::wire::messages::{Hello, MAX_MISSING_RUNS};
use crate::wire::{FrameKind, Message, StreamError};
use ferry_vm::{DirtyPages, Gfn};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause between the source's attempts to reconnect.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Missing ranges spelled out in an error message.
const RANGES_SHOWN: usize = 8;

impl Dest {
    /// Waits up to `timeout` for the source to reconnect, after the
    /// connections broke with `cause`. On success the new connections
    /// carry the rest of round `final_round`.
    pub(crate) fn await_recovery(
        &mut self,
        listener: &dyn Listen,
        final_round: u32,
        timeout: Duration,
        cause: MigrationError,
    ) -> Result<(), MigrationError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.drop_connections();
            let attempt = self.try_recovery(listener, final_round, deadline);
            match attempt {
                Ok(()) => {
                    tracing::info!("postcopy recovered: the source reconnected");
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!("a postcopy recovery attempt failed: {}", e.chain());
                }
                Err(_) => {
                    return Err(MigrationError::NotRecovered {
                        peer: "source",
                        secs: timeout.as_secs(),
                        cause: Box::new(cause),
                    })
                }
            }
        }
    }

    /// Ends every thread on the broken connections.
    fn drop_connections(&mut self) {
        self.health.abort();
        self.health.shutdown_all();
        if let Some(r) = self.receivers.take() {
            r.join();
        }
        self.priority = None;
    }

    fn try_recovery(
        &mut self,
        listener: &dyn Listen,
        final_round: u32,
        deadline: Instant,
    ) -> Result<(), MigrationError> {
        let (session, lanes) = (self.session, self.summary.connections as u16);
        let (io, hello) = accept_channel(listener, Some(deadline), &|h: &Hello| {
            if !h.recover || h.session != session {
                Err(
                    "this destination is waiting for a postcopy recovery of another migration"
                        .into(),
                )
            } else if h.channel != 0 {
                Err(
                    "a connection of a recovery attempt this destination gave up on: start over"
                        .into(),
                )
            } else if h.data_channels != lanes {
                Err(format!(
                    "the recovery opens {} data connections, the migration had {lanes}",
                    h.data_channels
                ))
            } else {
                Ok(())
            }
        })?;
        let health = Arc::new(Health::new(Side::Destination, self.health.stall_timeout()));
        let old = std::mem::replace(&mut self.health, Arc::clone(&health));
        self.bytes_before += old.data_bytes();
        self.ctl = MainChannel::start(io, health)?;
        let missing = self.still_missing();
        for runs in missing.runs().chunks(MAX_MISSING_RUNS) {
            let runs = runs.iter().map(|(g, n)| (g.0, *n)).collect();
            self.ctl.send(&Message::Missing(runs))?;
        }
        self.ctl.send(&Message::Recover {
            missing: missing.count(),
        })?;
        self.accept_data(listener, hello, final_round)
    }

    /// The pages not received yet.
    fn still_missing(&self) -> DirtyPages {
        let pages = self.loaded.pages;
        let mut missing = DirtyPages::new(pages);
        (0..pages)
            .map(Gfn)
            .filter(|&g| !self.loaded.received.contains(g))
            .for_each(|g| missing.set(g));
        missing
    }

    /// The missing ranges in words, for the error of a postcopy that
    /// cannot finish.
    pub(crate) fn missing_ranges(&self) -> String {
        describe_ranges(&self.still_missing())
    }
}

/// "frames 0x10-0x1f, 0x40 and 3 more ranges".
fn describe_ranges(missing: &DirtyPages) -> String {
    let runs = missing.runs();
    let mut shown: Vec<String> = runs
        .iter()
        .take(RANGES_SHOWN)
        .map(|(g, n)| match n {
            1 => format!("{:#x}", g.0),
            n => format!("{:#x}-{:#x}", g.0, g.0 + n - 1),
        })
        .collect();
    if runs.len() > RANGES_SHOWN {
        shown.push(format!("{} more ranges", runs.len() - RANGES_SHOWN));
    }
    if shown.is_empty() {
        return "no frame".into();
    }
    format!("frames {}", shown.join(", "))
}

impl Source<'_> {
    /// Reconnects after the postcopy connections broke with `cause`,
    /// trying until `deadline`, and re-arms the push with what the
    /// destination still lacks.
    pub(crate) fn recover(
        &mut self,
        dialer: &dyn Dial,
        hello: &dyn Fn(u16) -> Hello,
        round: u32,
        deadline: Instant,
        cause: MigrationError,
    ) -> Result<(), MigrationError> {
        let recover = |channel: u16| Hello {
            recover: true,
            ..hello(channel)
        };
        loop {
            self.links.health.abort();
            self.links.health.shutdown_all();
            drop(self.links.senders.take());
            if Instant::now() >= deadline {
                return Err(MigrationError::NotRecovered {
                    peer: "destination",
                    secs: self.opts.recover_timeout.as_secs(),
                    cause: Box::new(cause),
                });
            }
            match self.try_recovery(dialer, &recover, round) {
                Ok(()) => {
                    tracing::info!("postcopy recovered: reconnected to the destination");
                    return Ok(());
                }
                Err(e) => {
                    // Retried whatever it was, until the deadline: even a
                    // refusal may be a late connection of an attempt the
                    // destination dropped when it timed out (a loaded host).
                    tracing::warn!("a postcopy recovery attempt failed: {}", e.chain());
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    fn try_recovery(
        &mut self,
        dialer: &dyn Dial,
        hello: &dyn Fn(u16) -> Hello,
        round: u32,
    ) -> Result<(), MigrationError> {
        let io = open_channel(dialer, hello(0), self.opts.stall_timeout)?;
        let health = Arc::new(Health::new(Side::Source, self.opts.stall_timeout));
        let old = std::mem::replace(&mut self.links.health, Arc::clone(&health));
        self.links.bytes_before += old.data_bytes() + self.links.ctl.bytes_sent();
        self.links.ctl = MainChannel::start(io, health)?;
        let missing = self.recv_still_missing()?;
        self.open_links(dialer, hello, Some((round, &missing)))
    }

    /// Reads the destination's list of the pages it still lacks.
    pub(crate) fn recv_still_missing(&mut self) -> Result<DirtyPages, MigrationError> {
        let mut missing = DirtyPages::new(self.pages);
        loop {
            let i = self.links.ctl.recv()?;
            match Message::decode(i.kind, &i.payload, i.offset)? {
                Message::Missing(runs) => {
                    for (first, n) in runs {
                        if first >= self.pages || n > self.pages - first {
                            return Err(StreamError::Malformed {
                                kind: FrameKind::Missing,
                                offset: i.offset,
                                reason: format!("{n} pages from frame {first:#x}"),
                            }
                            .into());
                        }
                        (first..first + n).for_each(|g| missing.set(Gfn(g)));
                    }
                }
                Message::Recover { missing: count } if count == missing.count() => {
                    return Ok(missing)
                }
                Message::Recover { missing: count } => {
                    return Err(MigrationError::Refused(format!(
                        "the destination says {count} pages are missing, its runs list {}",
                        missing.count()
                    )))
                }
                m => return Err(unexpected("Missing or Recover", &m, i.offset)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_spelled_out_up_to_a_limit() {
        let mut m = DirtyPages::new(4096);
        assert_eq!(describe_ranges(&m), "no frame");
        m.set(Gfn(5));
        (16..32).for_each(|g| m.set(Gfn(g)));
        assert_eq!(describe_ranges(&m), "frames 0x5, 0x10-0x1f");
        (0..20).for_each(|i| m.set(Gfn(100 + 2 * i)));
        let text = describe_ranges(&m);
        assert!(
            text.starts_with("frames 0x5, 0x10-0x1f, 0x64, 0x66"),
            "{text}"
        );
        assert!(text.ends_with(", 14 more ranges"), "{text}");
    }
}
