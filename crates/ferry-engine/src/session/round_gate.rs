//! Which round each data connection has ended, and which have closed.
//!
//! Batches of one round arrive over several connections in any order, and a
//! page appears at most once in a round, so within a round any order is
//! right. Across rounds a later copy of a page must win, so a receiver holds
//! a round-r batch until every connection has ended round r − 1. A
//! connection never blocks on its own later rounds, so the gate cannot
//! deadlock: each connection's RoundEnd(r − 1) precedes its round-r batches
//! in its own byte stream.

use crate::error::MigrationError;
use crate::transport::Health;
use std::sync::{Condvar, Mutex};
use std::time::Duration;
/// Which round each data connection has ended, and which have closed.
pub(crate) struct RoundGate {
    state: Mutex<Vec<Lane>>,
    cv: Condvar,
}

#[derive(Clone, Copy, Default)]
pub(crate) struct Lane {
    /// One more than the last round ended (0: none yet).
    pub(crate) ended: u32,
    pub(crate) closed: bool,
}

impl RoundGate {
    pub(crate) fn new(lanes: usize) -> Self {
        RoundGate {
            state: Mutex::new(vec![Lane::default(); lanes]),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn update(&self, lane: usize, f: impl FnOnce(&mut Lane)) {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner())[lane]);
        self.cv.notify_all();
    }

    /// Every lane open again, with the rounds before `round` ended (the
    /// new connections of a postcopy recovery).
    pub(crate) fn reopen(&self, round: u32) {
        let mut lanes = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for l in lanes.iter_mut() {
            *l = Lane {
                ended: round,
                closed: false,
            };
        }
        self.cv.notify_all();
    }

    pub(crate) fn wait_ended(&self, round: u32, health: &Health) -> Result<(), MigrationError> {
        let mut lanes = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if lanes.iter().all(|l| l.ended > round) {
                return Ok(());
            }
            health.check()?;
            if let Some(i) = lanes.iter().position(|l| l.closed && l.ended <= round) {
                // A connection that ends early broke, like one that resets:
                // in postcopy that is recovered.
                tracing::debug!(
                    "data connection {} closed before round {round} ended",
                    i + 1
                );
                return Err(MigrationError::Closed { peer: "source" });
            }
            lanes = self
                .cv
                .wait_timeout(lanes, Duration::from_millis(20))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
