//! The health of one side's connection set: the first failure of any of its
//! threads, stall detection, and the handles that shut every link down so
//! that no thread stays blocked once the migration has failed.
//!
//! Several threads can fail at once for one cause: a destination that
//! refuses the stream closes its data connections, so the source's senders
//! see a broken pipe at about the moment its main-channel reader gets the
//! destination's Error frame. The reason a user can act on is the peer's, so
//! failures are ranked and the highest-ranked one is kept:
//!
//! ```text
//!   rank 3  the peer's Error frame (it says why)
//!   rank 2  a stall: no progress from the peer for the stall timeout;
//!           or a panic on one of this side's threads (the other threads'
//!           errors, a closed channel or link, follow from it)
//!   rank 1  anything this side saw itself (I/O, protocol, backend, cancel)
//! ```
//!
//! **Stalls.** Each side hears the other's heartbeat on the main
//! channel at least every [`Health::heartbeat_interval`]. Heartbeats carry
//! the page-data bytes the peer has moved; a side calls the link stalled when
//! it heard nothing for the stall timeout, or when page data is outstanding
//! (sent but not received) and the receiving end's count has not moved for
//! the stall timeout.

use super::Link;
use crate::error::MigrationError;
use crate::wire::StreamError;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Which end of the migration this is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Side {
    /// Sends memory.
    Source,
    /// Receives memory.
    Destination,
}

impl Side {
    /// What this side calls the other.
    pub fn peer(self) -> &'static str {
        match self {
            Side::Source => "destination",
            Side::Destination => "source",
        }
    }
}

/// Shared by every thread of one side of a migration.
pub struct Health {
    side: Side,
    stall: Duration,
    epoch: Instant,
    failed: AtomicBool,
    /// Set once the migration is over: late closes and errors are not failures.
    done: AtomicBool,
    failure: Mutex<Option<(u8, MigrationError)>>,
    data_links: Mutex<Vec<Box<dyn Link>>>,
    main_link: Mutex<Option<Box<dyn Link>>>,
    /// Page-data bytes this side has sent (source) or received (destination).
    data_bytes: AtomicU64,
    /// The peer's count, from its latest heartbeat.
    peer_data_bytes: AtomicU64,
    /// When anything last arrived on the main channel (ns since epoch).
    last_heard_ns: AtomicU64,
    /// When the receiving end's data count last moved (ns since epoch).
    last_moved_ns: AtomicU64,
}

/// Spawns one of a migration's threads, named `name`. Should it panic (a
/// bug), the panic becomes the migration's failure, naming the thread:
/// the other threads then stop at once, where they would otherwise wait
/// on a thread that is gone until the stall timeout, and report a stall.
pub(crate) fn spawn(
    health: &Arc<Health>,
    name: String,
    body: impl FnOnce() + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    let health = Arc::clone(health);
    let thread = name.clone();
    std::thread::Builder::new().name(name).spawn(move || {
        if let Some(message) = ferry_vm::catch_panic(body) {
            health.fail(MigrationError::Panicked { thread, message });
        }
    })
}

/// A broken or closed connection: often the peer's doing.
pub fn is_link_failure(e: &MigrationError) -> bool {
    matches!(
        e,
        MigrationError::Stream(StreamError::Io(_) | StreamError::Truncated { .. })
            | MigrationError::Closed { .. }
    )
}

fn rank(e: &MigrationError) -> u8 {
    match e {
        MigrationError::Peer { .. } => 3,
        MigrationError::Stalled { .. } | MigrationError::Panicked { .. } => 2,
        MigrationError::Aborted => 0,
        _ => 1,
    }
}

impl Health {
    /// Health of a new migration on `side`, with `stall` as the stall timeout.
    pub fn new(side: Side, stall: Duration) -> Self {
        Health {
            side,
            stall,
            epoch: Instant::now(),
            failed: AtomicBool::new(false),
            done: AtomicBool::new(false),
            failure: Mutex::new(None),
            data_links: Mutex::new(Vec::new()),
            main_link: Mutex::new(None),
            data_bytes: AtomicU64::new(0),
            peer_data_bytes: AtomicU64::new(0),
            last_heard_ns: AtomicU64::new(0),
            last_moved_ns: AtomicU64::new(0),
        }
    }

    /// This side.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The stall timeout.
    pub fn stall_timeout(&self) -> Duration {
        self.stall
    }

    /// How often heartbeats go out: a quarter of the stall timeout, between
    /// 20 ms and 250 ms, so several are missed before a stall is called,
    /// also by a peer whose own stall timeout is shorter (down to 1 s).
    pub fn heartbeat_interval(&self) -> Duration {
        (self.stall / 4).clamp(Duration::from_millis(20), Duration::from_millis(250))
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Keeps a handle on a data connection, to shut it down on failure.
    pub fn add_data_link(&self, link: Box<dyn Link>) {
        self.data_links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(link);
        if self.failed.load(Ordering::Acquire) {
            self.shutdown_data();
        }
    }

    /// Keeps a handle on the main channel.
    pub fn set_main_link(&self, link: Box<dyn Link>) {
        *self.main_link.lock().unwrap_or_else(|p| p.into_inner()) = Some(link);
    }

    /// Records a failure and unblocks every thread: data connections are
    /// shut down at once; the main channel too unless the failure is
    /// this side's own, which the owner still reports to the peer on it.
    /// The highest-ranked failure is kept (see the module docs).
    pub fn fail(&self, e: MigrationError) {
        if self.done.load(Ordering::Acquire) {
            tracing::debug!("after the migration ended: {}", e.chain());
            return;
        }
        let r = rank(&e);
        // This side's own failure, which it still reports to the peer on
        // the main channel.
        let local = !matches!(
            e,
            MigrationError::Peer { .. } | MigrationError::Stalled { .. }
        );
        {
            let mut slot = self.failure.lock().unwrap_or_else(|p| p.into_inner());
            match &*slot {
                Some((have, _)) if *have >= r => {}
                _ => *slot = Some((r, e)),
            }
        }
        self.failed.store(true, Ordering::Release);
        self.shutdown_data();
        if !local {
            self.shutdown_main();
        }
    }

    /// Whether any thread has failed.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Ok while no thread has failed; else [`MigrationError::Aborted`], which
    /// [`Self::settle`] turns into the real reason.
    pub fn check(&self) -> Result<(), MigrationError> {
        if self.is_failed() {
            Err(MigrationError::Aborted)
        } else {
            Ok(())
        }
    }

    /// Whether the failure recorded so far is a broken or closed link: the
    /// peer may have said why just before, and its Error frame may still be
    /// on its way.
    pub fn failure_may_be_the_peers(&self) -> bool {
        let slot = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().is_some_and(|(_, e)| is_link_failure(e))
    }

    /// Marks the side failed and unblocks its data threads, recording
    /// nothing: the caller holds the reason and settles it later.
    pub fn abort(&self) {
        if !self.done.load(Ordering::Acquire) {
            self.failed.store(true, Ordering::Release);
            self.shutdown_data();
        }
    }

    /// The reason to report when the caller's work ended with `e`: `e`
    /// itself, unless another thread recorded a higher-ranked failure (or
    /// `e` only says that another thread failed).
    pub fn settle(&self, e: MigrationError) -> MigrationError {
        let mut slot = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        let chosen = match slot.take() {
            Some((r, stored)) if r > rank(&e) => stored,
            _ => e,
        };
        // Keep a marker so later calls still see a failure.
        *slot = Some((0, MigrationError::Aborted));
        self.failed.store(true, Ordering::Release);
        chosen
    }

    /// The migration is over (committed or given up): from now on closes
    /// and errors on its connections are expected.
    pub fn finish(&self) {
        self.done.store(true, Ordering::Release);
    }

    /// Whether [`Self::finish`] was called.
    pub fn is_finished(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Shuts every data connection down.
    pub fn shutdown_data(&self) {
        for l in self
            .data_links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            l.shutdown_link(Shutdown::Both);
        }
    }

    /// Shuts the main channel down.
    pub fn shutdown_main(&self) {
        if let Some(l) = &*self.main_link.lock().unwrap_or_else(|p| p.into_inner()) {
            l.shutdown_link(Shutdown::Both);
        }
    }

    /// Shuts everything down (end of the migration, either way).
    pub fn shutdown_all(&self) {
        self.shutdown_data();
        self.shutdown_main();
    }

    /// Counts page-data bytes this side moved.
    pub fn add_data_bytes(&self, n: u64) {
        self.data_bytes.fetch_add(n, Ordering::Relaxed);
        if self.side == Side::Destination {
            self.last_moved_ns.store(self.now_ns(), Ordering::Relaxed);
        }
    }

    /// Page-data bytes this side moved so far.
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes.load(Ordering::Relaxed)
    }

    /// Bytes written on the data connections that the peer has not
    /// acknowledged yet (0 where the links cannot tell).
    pub fn queued_bytes(&self) -> u64 {
        let links = self.data_links.lock().unwrap_or_else(|p| p.into_inner());
        links.iter().filter_map(|l| l.queued_bytes()).sum()
    }

    /// Something arrived on the main channel.
    pub fn heard(&self) {
        self.last_heard_ns.store(self.now_ns(), Ordering::Relaxed);
    }

    /// The peer's heartbeat reported `bytes` of page data moved.
    pub fn peer_data(&self, bytes: u64) {
        let before = self.peer_data_bytes.swap(bytes, Ordering::Relaxed);
        if self.side == Side::Source && before != bytes {
            self.last_moved_ns.store(self.now_ns(), Ordering::Relaxed);
        }
    }

    /// A stall, if the link has one now (see the module docs).
    pub fn stalled(&self) -> Option<MigrationError> {
        let now = self.now_ns();
        let limit = self.stall.as_nanos() as u64;
        let stalled = MigrationError::Stalled {
            peer: self.side.peer(),
            secs: self.stall.as_secs_f64(),
        };
        if now.saturating_sub(self.last_heard_ns.load(Ordering::Relaxed)) > limit {
            return Some(stalled);
        }
        let (ours, theirs) = (
            self.data_bytes.load(Ordering::Relaxed),
            self.peer_data_bytes.load(Ordering::Relaxed),
        );
        let outstanding = match self.side {
            Side::Source => ours > theirs,
            Side::Destination => theirs > ours,
        };
        let moved = self.last_moved_ns.load(Ordering::Relaxed);
        (outstanding && now.saturating_sub(moved) > limit).then_some(stalled)
    }

    /// Starts the stall clocks (when the connection set is up).
    pub fn start_clocks(&self) {
        let now = self.now_ns();
        self.last_heard_ns.store(now, Ordering::Relaxed);
        self.last_moved_ns.store(now, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_panics_fails_the_migration_naming_itself() {
        let h = Arc::new(Health::new(Side::Destination, Duration::from_secs(10)));
        let fine = spawn(&h, "place-1".into(), || {}).unwrap();
        fine.join().unwrap();
        assert!(h.check().is_ok());
        let n = 3;
        let broken = spawn(&h, "recv-2".into(), move || panic!("frame {n} is odd")).unwrap();
        assert!(broken.join().is_ok(), "the panic is caught on the thread");
        assert!(h.is_failed());
        // What another thread saw of it (its channel closed) does not hide it.
        let sibling = MigrationError::Closed { peer: "source" };
        let why = h.settle(sibling).to_string();
        assert!(why.contains("recv-2 thread panicked"), "{why}");
        assert!(why.contains("frame 3 is odd"), "{why}");
    }

    #[test]
    fn the_peers_reason_outranks_what_this_side_saw() {
        let h = Health::new(Side::Source, Duration::from_secs(10));
        assert!(h.check().is_ok());
        h.fail(MigrationError::Cancelled);
        assert!(h.check().is_err());
        h.fail(MigrationError::Peer {
            peer: "destination",
            message: "checksum mismatch".into(),
        });
        h.fail(MigrationError::Cancelled);
        let e = h.settle(MigrationError::Aborted);
        assert!(matches!(e, MigrationError::Peer { .. }), "{e}");
        assert!(h.is_failed());
    }

    #[test]
    fn the_owners_reason_wins_a_tie() {
        let h = Health::new(Side::Destination, Duration::from_secs(10));
        h.fail(MigrationError::Closed { peer: "source" });
        let e = h.settle(MigrationError::Cancelled);
        assert!(matches!(e, MigrationError::Cancelled), "{e}");
        let h = Health::new(Side::Destination, Duration::from_secs(10));
        h.fail(MigrationError::Closed { peer: "source" });
        let e = h.settle(MigrationError::Aborted);
        assert!(matches!(e, MigrationError::Closed { .. }), "{e}");
    }

    #[test]
    fn nothing_after_finish_is_a_failure() {
        let h = Health::new(Side::Destination, Duration::from_secs(10));
        h.finish();
        h.fail(MigrationError::Cancelled);
        assert!(!h.is_failed());
    }

    #[test]
    fn outstanding_data_that_does_not_move_is_a_stall() {
        let h = Health::new(Side::Source, Duration::from_millis(30));
        h.start_clocks();
        assert!(h.stalled().is_none());
        h.add_data_bytes(100);
        h.peer_data(100);
        std::thread::sleep(Duration::from_millis(40));
        h.heard();
        assert!(h.stalled().is_none(), "all delivered: idle is not a stall");
        h.add_data_bytes(5);
        std::thread::sleep(Duration::from_millis(40));
        h.heard();
        let e = h.stalled().expect("5 bytes outstanding for 40 ms");
        assert_eq!(e.to_string(), "no progress from destination for 0.03 s");
    }

    #[test]
    fn silence_is_a_stall() {
        let h = Health::new(Side::Destination, Duration::from_millis(20));
        h.start_clocks();
        std::thread::sleep(Duration::from_millis(30));
        assert!(h.stalled().is_some());
    }
}
