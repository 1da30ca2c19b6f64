//! The source's data connections: one sender thread each.
//!
//! ```text
//!   engine thread: harvest → read pages into a free batch → seal(round) ──┐
//!        ▲                                                               │ round robin,
//!        └──── free batches (a small pool, reused) ◄── sender i ◄────────┘ first lane with room
//!   end of round r: RoundEnd(r, pages on lane i) to every lane; wait until every
//!   sender has written and flushed it (round timing and bandwidth are then exact)
//! ```
//!
//! Reading guest memory and finding zero pages happen on the engine thread
//! while the senders compress and write, so even one connection overlaps the
//! two, and compression runs on as many threads as there are connections.
//! The bandwidth cap is one token bucket shared by the senders, charged with
//! the bytes that go on the wire (compressed or not). A sender that fails
//! records why in [`Health`], which shuts every data connection down; the
//! engine thread sees it at its next batch.

use super::compression::Chooser;
use super::delta::DeltaCache;
use crate::choices::Compression;
use crate::error::MigrationError;
use crate::summary::DeltaSummary;
use crate::transport::health::spawn;
use crate::transport::{Channel, Health};
use crate::tunables::TokenBucket;
use crate::wire::compress::{Codec, Compressor};
use crate::wire::delta::DeltaBatch;
use crate::wire::frame::FRAME_HEADER_LEN;
use crate::wire::{FrameKind, Message, PageBatch};
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Batches queued per lane beyond the one being written.
const LANE_DEPTH: usize = 2;

enum Job {
    Batch(PageBatch),
    RoundEnd { round: u32, pages: u64 },
}

struct Lane {
    tx: SyncSender<Job>,
    pages: u64,
}

/// Rounds every sender has flushed: `flushed[i]` is one more than the last
/// round sender i wrote a RoundEnd for (0: none yet).
type Flushed = Arc<(Mutex<Vec<u32>>, Condvar)>;

/// How the senders sent their batches: raw, lz4, zstd.
#[derive(Debug, Default)]
pub(crate) struct SendStats {
    pub batches: [AtomicU64; 3],
}

impl SendStats {
    fn record(&self, codec: Option<Codec>) {
        let i = match codec {
            None => 0,
            Some(Codec::Lz4) => 1,
            Some(Codec::Zstd) => 2,
        };
        self.batches[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Batches sent raw, with lz4, with zstd.
    pub fn counts(&self) -> [u64; 3] {
        [0, 1, 2].map(|i| self.batches[i].load(Ordering::Relaxed))
    }
}

/// What each sender thread shares with the others.
struct Shared {
    flushed: Flushed,
    health: Arc<Health>,
    bucket: Arc<Mutex<TokenBucket>>,
    stats: Arc<SendStats>,
    compression: Compression,
    delta: Option<DeltaCache>,
}

impl Shared {
    /// Waits until the bandwidth cap lets `wire` more bytes out.
    fn pace(&self, wire: usize) {
        crate::tunables::pace(&self.bucket, wire as u64);
    }
}

/// The sender threads of one migration.
pub(crate) struct Senders {
    lanes: Vec<Lane>,
    handles: Vec<JoinHandle<()>>,
    free_rx: Receiver<PageBatch>,
    allocated: usize,
    batch_pages: usize,
    next: usize,
    flushed: Flushed,
    health: Arc<Health>,
    shared: Arc<Shared>,
    /// How the batches went.
    pub stats: Arc<SendStats>,
}

impl Senders {
    /// Starts one sender per data connection.
    pub fn start(
        links: Vec<Channel>,
        batch_pages: usize,
        compression: Compression,
        delta: Option<DeltaCache>,
        bucket: TokenBucket,
        health: Arc<Health>,
    ) -> Result<Self, MigrationError> {
        let (free_tx, free_rx) = mpsc::channel();
        let flushed: Flushed = Arc::new((Mutex::new(vec![0; links.len()]), Condvar::new()));
        let stats = Arc::new(SendStats::default());
        let shared = Arc::new(Shared {
            flushed: Arc::clone(&flushed),
            health: Arc::clone(&health),
            bucket: Arc::new(Mutex::new(bucket)),
            stats: Arc::clone(&stats),
            compression,
            delta,
        });
        let mut lanes = Vec::new();
        let mut handles = Vec::new();
        for (i, io) in links.into_iter().enumerate() {
            let (tx, rx) = mpsc::sync_channel(LANE_DEPTH);
            let (free, shared) = (free_tx.clone(), Arc::clone(&shared));
            let handle = spawn(
                &Arc::clone(&shared.health),
                format!("send-{}", i + 1),
                move || send_loop(i, io, &rx, &free, &shared),
            )
            .map_err(crate::wire::StreamError::Io)?;
            lanes.push(Lane { tx, pages: 0 });
            handles.push(handle);
        }
        Ok(Senders {
            lanes,
            handles,
            free_rx,
            allocated: 0,
            batch_pages,
            next: 0,
            flushed,
            health,
            shared,
            stats,
        })
    }

    /// The bandwidth cap's bucket, for other traffic that shares the link
    /// (postcopy's answers to page requests).
    pub fn bucket(&self) -> Arc<Mutex<TokenBucket>> {
        Arc::clone(&self.shared.bucket)
    }

    /// How delta re-sends went, if on.
    pub fn delta_summary(&self) -> Option<DeltaSummary> {
        self.shared.delta.as_ref().map(|d| DeltaSummary {
            cache_bytes: d.bytes(),
            pages: d.hits.load(Ordering::Relaxed),
            misses: d.misses.load(Ordering::Relaxed),
            bytes: d.delta_bytes.load(Ordering::Relaxed),
        })
    }

    /// An empty batch to fill: a returned one, or a new one while the pool
    /// is small, else waits for a sender to return one.
    pub fn batch(&mut self) -> Result<PageBatch, MigrationError> {
        if let Ok(b) = self.free_rx.try_recv() {
            return Ok(b);
        }
        if self.allocated < self.lanes.len() * (LANE_DEPTH + 1) + 1 {
            self.allocated += 1;
            return Ok(PageBatch::new(self.batch_pages));
        }
        loop {
            self.health.check()?;
            if let Ok(b) = self.free_rx.recv_timeout(Duration::from_millis(20)) {
                return Ok(b);
            }
        }
    }

    /// Gives back a batch taken with [`Senders::batch`] and not sent (a
    /// round that ended on a batch boundary leaves one empty). Dropped
    /// uncounted, each would shrink the pool for good, until `batch` waited
    /// for ever.
    pub fn recycle(&mut self, batch: PageBatch) {
        drop(batch);
        self.allocated = self.allocated.saturating_sub(1);
    }

    /// Hands a sealed batch to a sender: the first lane with room, starting
    /// after the last one used; if all are full, waits on the next in turn.
    pub fn send(&mut self, batch: PageBatch) -> Result<(), MigrationError> {
        let n = self.lanes.len();
        let pages = batch.len() as u64;
        let mut job = Job::Batch(batch);
        for k in 0..n {
            let i = (self.next + k) % n;
            match self.lanes[i].tx.try_send(job) {
                Ok(()) => {
                    self.lanes[i].pages += pages;
                    self.next = (i + 1) % n;
                    return Ok(());
                }
                Err(TrySendError::Full(j)) => job = j,
                Err(TrySendError::Disconnected(_)) => return Err(self.broken()),
            }
        }
        let i = self.next;
        self.lanes[i].tx.send(job).map_err(|_| self.broken())?;
        self.lanes[i].pages += pages;
        self.next = (i + 1) % n;
        Ok(())
    }

    /// Ends `round` on every lane and waits until every sender has flushed it.
    pub fn end_round(&mut self, round: u32) -> Result<(), MigrationError> {
        for i in 0..self.lanes.len() {
            let pages = std::mem::take(&mut self.lanes[i].pages);
            self.lanes[i]
                .tx
                .send(Job::RoundEnd { round, pages })
                .map_err(|_| self.broken())?;
        }
        let (lock, cv) = &*self.flushed;
        let mut flushed = lock.lock().unwrap_or_else(|p| p.into_inner());
        while flushed.iter().any(|&f| f <= round) {
            self.health.check()?;
            flushed = cv
                .wait_timeout(flushed, Duration::from_millis(20))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// Closes every lane once its queue is written (the destination then
    /// sees each data connection end cleanly) and joins the senders.
    pub fn finish(mut self) {
        self.lanes.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }

    fn broken(&self) -> MigrationError {
        // A sender only drops its lane after recording why in Health; one
        // that panics records it as its thread ends, and the source joins
        // the senders before it settles the error.
        MigrationError::Aborted
    }
}

impl Drop for Senders {
    fn drop(&mut self) {
        // Not finished: unblock the senders (the migration failed).
        if !self.handles.is_empty() {
            self.health.shutdown_data();
            self.lanes.clear();
            for h in self.handles.drain(..) {
                let _ = h.join();
            }
        }
    }
}

fn send_loop(
    lane: usize,
    mut io: Channel,
    jobs: &Receiver<Job>,
    free: &Sender<PageBatch>,
    shared: &Shared,
) {
    let health = &shared.health;
    let mut chooser = Chooser::new(shared.compression);
    let mut compressor = Compressor::default();
    let mut packed = Vec::new();
    let mut deltas = DeltaBatch::default();
    let result = (|| -> Result<(), MigrationError> {
        for job in jobs.iter() {
            match job {
                Job::Batch(mut b) => {
                    if let Some(cache) = shared.delta.as_ref().filter(|_| b.round() > 0) {
                        deltas.begin(b.round());
                        cache.split(&mut b, &mut deltas);
                        if !deltas.is_empty() {
                            let wire = FRAME_HEADER_LEN + deltas.payload().len();
                            shared.pace(wire);
                            io.write_frame(FrameKind::Delta, &[deltas.payload()])?;
                            health.add_data_bytes(wire as u64);
                        }
                        if b.is_empty() {
                            b.clear();
                            let _ = free.send(b);
                            continue;
                        }
                    }
                    let raw = b.payload_len();
                    let started = Instant::now();
                    let picked = chooser.pick();
                    let codec = picked.filter(|&c| compressor.compress(c, &b.parts(), &mut packed));
                    let payload = if codec.is_some() { packed.len() } else { raw };
                    let wire = FRAME_HEADER_LEN + payload;
                    shared.pace(wire);
                    match codec {
                        Some(c) => {
                            io.write_frame_with_flags(FrameKind::Pages, c.flag(), &[&packed])?
                        }
                        None => io.write_frame(FrameKind::Pages, &b.parts())?,
                    }
                    chooser.finished(picked, raw, started.elapsed().as_nanos() as u64);
                    shared.stats.record(codec);
                    health.add_data_bytes(wire as u64);
                    b.clear();
                    // The engine may have stopped taking batches back.
                    let _ = free.send(b);
                }
                Job::RoundEnd { round, pages } => {
                    let end = Message::RoundEnd { round, pages }.encode();
                    io.write_frame(FrameKind::RoundEnd, &[&end])?;
                    io.flush()?;
                    health.add_data_bytes((FRAME_HEADER_LEN + end.len()) as u64);
                    let (lock, cv) = &*shared.flushed;
                    lock.lock().unwrap_or_else(|p| p.into_inner())[lane] = round + 1;
                    cv.notify_all();
                }
            }
        }
        io.flush()?;
        Ok(())
    })();
    match result {
        Ok(()) => io.get_ref().shutdown_link(Shutdown::Write),
        Err(e) => {
            if !health.is_failed() {
                tracing::debug!("data connection {}: {}", lane + 1, e.chain());
            }
            health.fail(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Link, Side};
    use crate::tunables::Tunables;
    use crate::wire::FrameStream;

    #[test]
    fn batches_given_back_unsent_do_not_drain_the_pool() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let out = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_peer, _) = listener.accept().unwrap();
        let health = Arc::new(Health::new(Side::Source, Duration::from_secs(10)));
        let mut senders = Senders::start(
            vec![FrameStream::new(Box::new(out) as Box<dyn Link>)],
            16,
            Compression::None,
            None,
            TokenBucket::new(Tunables::shared()),
            Arc::clone(&health),
        )
        .unwrap();
        // Were a recycled batch not counted back, the pool would run dry
        // and `batch` wait for ever: the watchdog turns that into an error.
        let watchdog = {
            let health = Arc::clone(&health);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(5));
                health.abort();
            })
        };
        for _ in 0..100 {
            let b = senders.batch().expect("a batch from the pool");
            senders.recycle(b);
        }
        assert!(!health.is_failed(), "the pool ran dry");
        drop(senders);
        let _ = watchdog;
    }
}
