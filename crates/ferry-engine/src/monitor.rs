//! The live state of a VM's migration and the events it raises, in QEMU's
//! terms: what `query-migrate` answers, and the `MIGRATION`,
//! `MIGRATION_PASS` and `FERRY_MIGRATION_SUMMARY` events a QMP client
//! receives. A VMM passes the [`Monitor`] as the migration's [`Progress`]
//! and gets QMP-shaped status and events without writing a monitor of its
//! own; ferry's control socket serves exactly this.
//!
//! The engine reports through [`Progress`] on its migrating thread, which
//! must never wait on a slow client. So the monitor only updates counters and
//! queues events; a `migration-events` thread hands them to the
//! subscribers ([`EventSink`]) and drops one that fails (give a socket a
//! write timeout before subscribing it).

use crate::progress::{Phase, Progress};
use crate::summary::{MigrationSummary, Outcome, RoundStats, ThrottleStep};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long [`Monitor::drain`] waits for queued events to go out.
const DRAIN_WAIT: Duration = Duration::from_secs(3);

/// QEMU's `MigrationStatus`, as far as ferry has the states: the one
/// status of a migration under way. How a finished one ended is its
/// summary's [`Outcome`], which [`Monitor::finish`] maps onto this.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigStatus {
    /// No migration yet.
    None,
    /// Connecting and handshaking.
    Setup,
    /// Precopy rounds while the guest runs.
    Active,
    /// The source is paused: the last pages, the vCPU state and (precopy)
    /// the digest.
    Device,
    /// The guest runs at the destination, which fetches missing pages.
    PostcopyActive,
    /// Postcopy connections broke; the source reconnects.
    PostcopyRecover,
    /// Postcopy recovery ran out of time: the source stays paused with
    /// every page until a resume.
    PostcopyPaused,
    /// The guest moved, its memory verified.
    Completed,
    /// It failed; `error-desc` says why.
    Failed,
    /// An operator or the give-up deadline cancelled it.
    Cancelled,
}

impl MigStatus {
    /// QEMU's name for it.
    pub fn name(self) -> &'static str {
        match self {
            MigStatus::None => "none",
            MigStatus::Setup => "setup",
            MigStatus::Active => "active",
            MigStatus::Device => "device",
            MigStatus::PostcopyActive => "postcopy-active",
            MigStatus::PostcopyRecover => "postcopy-recover",
            MigStatus::PostcopyPaused => "postcopy-paused",
            MigStatus::Completed => "completed",
            MigStatus::Failed => "failed",
            MigStatus::Cancelled => "cancelled",
        }
    }

    /// Whether a migration is under way (a new one must wait).
    pub fn in_progress(self) -> bool {
        !matches!(
            self,
            MigStatus::None
                | MigStatus::Completed
                | MigStatus::Failed
                | MigStatus::Cancelled
                | MigStatus::PostcopyPaused
        )
    }
}

/// How a snapshot to a file ended ([`Monitor::finish_snapshot`]).
#[derive(Clone, Debug, PartialEq)]
pub enum SnapshotEnd {
    /// The file is complete, after `total_ms` with the guest paused for
    /// `pause_ms`.
    Completed {
        /// From the call to the file in place.
        total_ms: f64,
        /// The guest's pause.
        pause_ms: f64,
    },
    /// Cancelled before its pause; why, in words.
    Cancelled(String),
    /// It failed; why, in words.
    Failed(String),
}

/// Where events go: one JSON line at a time (with its newline), whole.
pub trait EventSink: Send + Sync {
    /// Writes `line`; an error drops the subscriber.
    fn send(&self, line: &str) -> std::io::Result<()>;
}

/// A writer behind a lock (a socket shared by its replies and its events,
/// so that lines never interleave) is a sink.
impl<W: Write + Send> EventSink for Mutex<W> {
    fn send(&self, line: &str) -> std::io::Result<()> {
        let mut w = self.lock().unwrap_or_else(|p| p.into_inner());
        w.write_all(line.as_bytes())?;
        w.flush()
    }
}

/// What the last finished migration left.
struct Finished {
    total_ms: f64,
    downtime_ms: f64,
    error: Option<String>,
    summary: Value,
}

struct State {
    status: MigStatus,
    started: Option<Instant>,
    setup_ms: Option<f64>,
    postcopy: bool,
    /// Whether the migration may switch to postcopy when asked.
    may_postcopy: bool,
    round: u32,
    round_pages: u64,
    round_sent: u64,
    dirty_pages_rate: f64,
    mbps: f64,
    /// The switchover rule's prediction after the last round, in ms.
    predicted_ms: Option<f64>,
    throttle_pct: u8,
    zero_pages: u64,
    finished: Option<Finished>,
}

impl State {
    fn idle() -> State {
        State {
            status: MigStatus::None,
            started: None,
            setup_ms: None,
            postcopy: false,
            may_postcopy: false,
            round: 0,
            round_pages: 0,
            round_sent: 0,
            dirty_pages_rate: 0.0,
            mbps: 0.0,
            predicted_ms: None,
            throttle_pct: 0,
            zero_pages: 0,
            finished: None,
        }
    }
}

/// Live migration state and event queue, shared by the VM's thread (which
/// migrates) and the control socket's connections (which ask).
pub struct Monitor {
    state: Mutex<State>,
    /// Guest memory: known on a destination only once the VM arrived.
    total_bytes: AtomicU64,
    /// Wire bytes sent in this migration.
    transferred: AtomicU64,
    /// Pages sent in this migration, zero pages included.
    pages: AtomicU64,
    events: Sender<Value>,
    subscribers: Arc<Mutex<Vec<Arc<dyn EventSink>>>>,
    queued: Arc<AtomicUsize>,
}

impl Monitor {
    /// A monitor for a guest of `total_bytes`, with its event thread.
    /// Fails if that thread cannot be started: a monitor without it would
    /// queue every event and never deliver one.
    pub fn start(total_bytes: u64) -> std::io::Result<Arc<Monitor>> {
        let (events, queue) = channel::<Value>();
        let subscribers: Arc<Mutex<Vec<Arc<dyn EventSink>>>> = Arc::default();
        let queued = Arc::new(AtomicUsize::new(0));
        let (subs, pending) = (Arc::clone(&subscribers), Arc::clone(&queued));
        std::thread::Builder::new()
            .name("migration-events".into())
            .spawn(move || {
                for event in queue {
                    // QMP ends every message with CRLF, as QEMU does.
                    let line = format!("{event}\r\n");
                    let mut subs = subs.lock().unwrap_or_else(|p| p.into_inner());
                    subs.retain(|w| w.send(&line).is_ok());
                    drop(subs);
                    pending.fetch_sub(1, Relaxed);
                }
            })?;
        Ok(Arc::new(Monitor {
            state: Mutex::new(State::idle()),
            total_bytes: AtomicU64::new(total_bytes),
            transferred: AtomicU64::new(0),
            pages: AtomicU64::new(0),
            events,
            subscribers,
            queued,
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends every later event to `sink` too.
    pub fn subscribe(&self, sink: Arc<dyn EventSink>) {
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(sink);
    }

    /// Marks a migration the VM's thread refused before it started.
    pub fn refuse(&self, error: &str) {
        let mut s = self.state();
        if s.status == MigStatus::Setup {
            s.finished = Some(Finished {
                total_ms: 0.0,
                downtime_ms: 0.0,
                error: Some(error.to_string()),
                summary: Value::Null,
            });
            self.set_status(&mut s, MigStatus::Failed);
        }
    }

    /// Queues an event in QMP's shape.
    pub fn emit(&self, event: &str, data: Value) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.queued.fetch_add(1, Relaxed);
        let sent = self.events.send(json!({
            "event": event,
            "data": data,
            "timestamp": {"seconds": now.as_secs(), "microseconds": now.subsec_micros()},
        }));
        if sent.is_err() {
            self.queued.fetch_sub(1, Relaxed);
        }
    }

    /// Waits (a few seconds at most) until queued events were written, so a
    /// process about to exit does not swallow its last ones.
    pub fn drain(&self) {
        let deadline = Instant::now() + DRAIN_WAIT;
        while self.queued.load(Relaxed) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn set_status(&self, state: &mut State, status: MigStatus) {
        if state.status != status {
            state.status = status;
            self.emit("MIGRATION", json!({ "status": status.name() }));
        }
    }

    /// Records whether the migration just begun may switch to postcopy.
    pub fn set_may_postcopy(&self, yes: bool) {
        self.state().may_postcopy = yes;
    }

    /// Whether the migration under way may switch to postcopy.
    pub fn may_postcopy(&self) -> bool {
        self.state().may_postcopy
    }

    /// Claims the monitor for a new migration: false if one is under way.
    pub fn begin(&self) -> bool {
        let mut s = self.state();
        if s.status.in_progress() {
            return false;
        }
        *s = State {
            started: Some(Instant::now()),
            ..State::idle()
        };
        self.transferred.store(0, Relaxed);
        self.pages.store(0, Relaxed);
        self.set_status(&mut s, MigStatus::Setup);
        true
    }

    /// Records how the migration ended, with `summary_json` as the
    /// summary's form in `query-migrate` and the summary event (the VMM's
    /// own rendering, or `serde_json::to_value(summary)`). `paused`: a
    /// postcopy that failed and can be resumed.
    pub fn finish(
        &self,
        summary: &MigrationSummary,
        summary_json: Value,
        cancelled: bool,
        paused: bool,
    ) {
        let status = match summary.status {
            Outcome::Completed => MigStatus::Completed,
            Outcome::Failed if paused => MigStatus::PostcopyPaused,
            Outcome::Failed if cancelled => MigStatus::Cancelled,
            Outcome::Failed => MigStatus::Failed,
            // QEMU has no such state: failed, with the reason in
            // error-desc, and query-status says "paused".
            Outcome::Held => MigStatus::Failed,
        };
        self.end(
            status,
            Finished {
                total_ms: summary.total_ms,
                downtime_ms: summary.downtime_ms,
                error: summary.error.clone(),
                summary: summary_json,
            },
        );
    }

    /// A destination's monitor: the migration arriving here has begun
    /// (`setup`, then `active`, as QEMU's destination reports them).
    pub fn begin_incoming(&self) -> bool {
        if !self.begin() {
            return false;
        }
        let mut s = self.state();
        self.set_status(&mut s, MigStatus::Active);
        true
    }

    /// A destination's monitor: the migration arriving here ended with
    /// `outcome` (`error`: why, if it failed) after `total_ms`, the guest
    /// paused for `downtime_ms`; `memory_bytes` of guest memory arrived,
    /// and `summary_json` is the destination's summary.
    pub fn finish_incoming(
        &self,
        outcome: Outcome,
        memory_bytes: u64,
        (total_ms, downtime_ms): (f64, f64),
        error: Option<String>,
        summary_json: Value,
    ) {
        self.total_bytes.store(memory_bytes, Relaxed);
        let status = match outcome {
            Outcome::Completed => MigStatus::Completed,
            Outcome::Failed | Outcome::Held => MigStatus::Failed,
        };
        self.end(
            status,
            Finished {
                total_ms,
                downtime_ms,
                error,
                summary: summary_json,
            },
        );
    }

    /// Records how a snapshot to a file ended (QMP's `migrate` to a
    /// `file:` URI), with `summary_json` as the summary's form.
    pub fn finish_snapshot(&self, end: SnapshotEnd, summary_json: Value) {
        let elapsed = self
            .state()
            .started
            .map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        let (status, total_ms, downtime_ms, error) = match end {
            SnapshotEnd::Completed { total_ms, pause_ms } => {
                (MigStatus::Completed, total_ms, pause_ms, None)
            }
            SnapshotEnd::Cancelled(why) => (MigStatus::Cancelled, elapsed, 0.0, Some(why)),
            SnapshotEnd::Failed(why) => (MigStatus::Failed, elapsed, 0.0, Some(why)),
        };
        self.end(
            status,
            Finished {
                total_ms,
                downtime_ms,
                error,
                summary: summary_json,
            },
        );
    }

    fn end(&self, status: MigStatus, finished: Finished) {
        let mut s = self.state();
        let summary = finished.summary.clone();
        s.finished = Some(finished);
        if !summary.is_null() {
            self.emit("FERRY_MIGRATION_SUMMARY", summary);
        }
        self.set_status(&mut s, status);
    }

    /// `query-migrate`'s answer.
    pub fn query(&self) -> Value {
        let s = self.state();
        if s.status == MigStatus::None {
            return json!({});
        }
        let transferred = self.transferred.load(Relaxed);
        let pages = self.pages.load(Relaxed);
        let remaining_pages = s.round_pages.saturating_sub(s.round_sent);
        let page = ferry_vm::PAGE_SIZE as u64;
        let mut out = json!({
            "status": s.status.name(),
            "ram": {
                "transferred": transferred,
                "remaining": remaining_pages * page,
                "total": self.total_bytes.load(Relaxed),
                "duplicate": s.zero_pages,
                "normal": pages.saturating_sub(s.zero_pages),
                "normal-bytes": pages.saturating_sub(s.zero_pages) * page,
                "dirty-pages-rate": s.dirty_pages_rate as u64,
                "mbps": s.mbps,
                "dirty-sync-count": u64::from(s.round) + u64::from(s.round_pages > 0),
                "page-size": page,
            },
        });
        if let Some(ms) = s.setup_ms {
            out["setup-time"] = json!(ms as u64);
        }
        if s.throttle_pct > 0 {
            out["cpu-throttle-percentage"] = json!(s.throttle_pct);
        }
        // What ferry's switchover rule expects the pause to cost if it came
        // now: its prediction after the last round (queue, dirty set,
        // harvest and the fixed costs), or before there is one, the
        // round's dirty set at the link's measured rate (QEMU's estimate).
        if s.status == MigStatus::Active {
            if let Some(ms) = s.predicted_ms {
                out["expected-downtime"] = json!(ms as u64);
            } else if s.mbps > 0.0 {
                let bytes = (s.round_pages * page) as f64;
                out["expected-downtime"] = json!((bytes * 8.0 / (s.mbps * 1e6) * 1e3) as u64);
            }
        }
        match (&s.finished, s.started) {
            (Some(f), _) => {
                out["total-time"] = json!(f.total_ms as u64);
                if s.status == MigStatus::Completed {
                    out["downtime"] = json!(f.downtime_ms as u64);
                }
                if let Some(e) = &f.error {
                    out["error-desc"] = json!(e);
                }
                if !f.summary.is_null() {
                    out["x-ferry-summary"] = f.summary.clone();
                }
            }
            (None, Some(t)) => out["total-time"] = json!(t.elapsed().as_millis() as u64),
            (None, None) => {}
        }
        out
    }

    /// The status now.
    pub fn status(&self) -> MigStatus {
        self.state().status
    }
}

impl Progress for Monitor {
    fn phase(&self, phase: Phase) {
        let mut s = self.state();
        let status = match phase {
            Phase::Handshake => MigStatus::Setup,
            Phase::FullPass | Phase::DirtyRounds => MigStatus::Active,
            Phase::Switchover => MigStatus::Device,
            Phase::Postcopy => {
                s.postcopy = true;
                MigStatus::PostcopyActive
            }
            Phase::Recovering => MigStatus::PostcopyRecover,
            // The digest and the report: after the push in postcopy, with
            // the source paused in precopy.
            Phase::Verifying | Phase::Reporting if s.postcopy => MigStatus::PostcopyActive,
            Phase::Verifying | Phase::Reporting => MigStatus::Device,
            // The final state comes from `finish`, which knows the outcome.
            Phase::Done => return,
        };
        if status == MigStatus::Active && s.setup_ms.is_none() {
            s.setup_ms = s.started.map(|t| t.elapsed().as_secs_f64() * 1e3);
        }
        self.set_status(&mut s, status);
    }

    fn round_started(&self, round: u32, pages: u64) {
        let mut s = self.state();
        s.round = round;
        s.round_pages = pages;
        s.round_sent = 0;
        drop(s);
        self.emit("MIGRATION_PASS", json!({ "pass": u64::from(round) + 1 }));
    }

    fn pages_sent(&self, pages: u64, bytes: u64) {
        self.transferred.fetch_add(bytes, Relaxed);
        self.pages.fetch_add(pages, Relaxed);
        self.state().round_sent += pages;
    }

    fn round_finished(&self, stats: &RoundStats) {
        let mut s = self.state();
        s.zero_pages += stats.zero_pages;
        s.round_sent = s.round_pages;
        if stats.dirty_rate_pages_s > 0.0 {
            s.dirty_pages_rate = stats.dirty_rate_pages_s;
        }
        // QEMU's mbps is megabits per second.
        s.mbps = stats.bandwidth_mb_s * 8.0;
    }

    fn throttle_changed(&self, step: &ThrottleStep) {
        self.state().throttle_pct = step.percent;
    }

    fn downtime_predicted(&self, downtime: Duration) {
        self.state().predicted_ms = Some(downtime.as_secs_f64() * 1e3);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::RoundKind;

    #[test]
    fn expected_downtime_is_the_dirty_set_at_the_measured_rate() {
        let m = Monitor::start(64 << 20).unwrap();
        assert!(m.begin());
        m.phase(Phase::FullPass);
        m.round_started(0, 16384);
        m.round_finished(&RoundStats {
            round: 0,
            kind: RoundKind::Full,
            pages: 16384,
            zero_pages: 0,
            bytes: 64 << 20,
            raw_bytes: 64 << 20,
            ms: 640.0,
            dirty_rate_pages_s: 0.0,
            bandwidth_mb_s: 100.0,
            harvest_ms: 0.0,
        });
        // 1024 dirty pages (4 MiB) at 100 MB/s: about 42 ms.
        m.round_started(1, 1024);
        let q = m.query();
        assert_eq!(q["expected-downtime"], 41, "{q}");
        assert!(q.get("blocked-reasons").is_none());
        // Once the switchover rule predicts, its figure is the one shown.
        m.downtime_predicted(Duration::from_millis(57));
        assert_eq!(m.query()["expected-downtime"], 57);
    }
}
