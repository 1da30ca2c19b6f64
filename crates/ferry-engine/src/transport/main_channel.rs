//! The main channel while a migration runs.
//!
//! ```text
//!   reader thread ── frames ──► channel ──► owner's recv()      Heartbeat: Health only
//!                                                               Error: Health (rank 3)
//!   owner / heartbeat thread ── send() ──► writer (one frame at a time, under a lock)
//!   heartbeat thread: every interval, Heartbeat(data bytes); then the stall check
//! ```
//!
//! The owner (the precopy source or destination) never reads the socket
//! itself, so it can wait for a message with a timeout and notice any other
//! thread's failure while it waits.

use super::health::{is_link_failure, spawn, Health};
use super::Channel;
use crate::error::MigrationError;
use crate::wire::{FrameKind, FrameStream, Message, StreamError};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a side that gives up waits for the peer to take its Error frame
/// (and for a pending Error of the peer's to arrive) before it closes.
const GIVE_UP_DRAIN: Duration = Duration::from_secs(2);
/// How often a waiting owner looks at the health of the other threads.
const POLL: Duration = Duration::from_millis(20);

/// A frame that arrived on the main channel.
#[derive(Debug)]
pub(crate) struct Incoming {
    /// Its type.
    pub kind: FrameKind,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its offset on the main channel.
    pub offset: u64,
}

/// The running main channel of one side.
pub struct MainChannel {
    /// The wire version both ends settled on.
    version: u32,
    /// Whether the peer runs on this host ([`super::Link::peer_on_this_host`]).
    peer_on_this_host: bool,
    health: Arc<Health>,
    writer: Arc<Mutex<Channel>>,
    rx: Receiver<Incoming>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    beat: Option<JoinHandle<()>>,
}

impl MainChannel {
    /// Starts the reader and heartbeat threads on `io`, a main channel
    /// that has been opened (Hello and Welcome exchanged).
    pub fn start(io: Channel, health: Arc<Health>) -> Result<MainChannel, MigrationError> {
        let version = io.version();
        let link = io.get_ref();
        let peer_on_this_host = link.peer_on_this_host();
        let write_half = link.try_clone_link().map_err(StreamError::Io)?;
        write_half
            .set_write_timeout_link(Some(health.stall_timeout()))
            .map_err(StreamError::Io)?;
        health.set_main_link(link.try_clone_link().map_err(StreamError::Io)?);
        let writer = Arc::new(Mutex::new(FrameStream::new(write_half)));
        let (tx, rx) = mpsc::channel();
        health.start_clocks();
        let h = Arc::clone(&health);
        let reader = spawn(&health, "ctl-reader".into(), move || read_loop(io, &h, &tx))
            .map_err(StreamError::Io)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (h, w, s) = (Arc::clone(&health), Arc::clone(&writer), Arc::clone(&stop));
        let beat = spawn(&health, "ctl-heartbeat".into(), move || {
            heartbeat_loop(&h, &w, &s)
        })
        .map_err(StreamError::Io)?;
        Ok(MainChannel {
            version,
            peer_on_this_host,
            health,
            writer,
            rx,
            stop,
            reader: Some(reader),
            beat: Some(beat),
        })
    }

    /// The wire version both ends speak.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Whether the peer runs on this host, sharing its CPUs.
    pub fn peer_on_this_host(&self) -> bool {
        self.peer_on_this_host
    }

    /// Bytes this side wrote on the main channel.
    pub fn bytes_sent(&self) -> u64 {
        self.writer
            .lock()
            .map(|w| w.bytes_written())
            .unwrap_or_default()
    }

    /// Sends one message and flushes it.
    pub fn send(&self, msg: &Message) -> Result<(), MigrationError> {
        self.send_frame(msg.kind(), &msg.encode())
    }

    /// Sends one frame and flushes it.
    pub fn send_frame(&self, kind: FrameKind, payload: &[u8]) -> Result<(), MigrationError> {
        send_locked(&self.writer, kind, payload).map_err(MigrationError::from)
    }

    /// The next frame, waiting for as long as the migration is healthy. An
    /// Error frame becomes [`MigrationError::Peer`].
    pub(crate) fn recv(&self) -> Result<Incoming, MigrationError> {
        loop {
            match self.rx.recv_timeout(POLL) {
                Ok(i) if i.kind == FrameKind::Error => {
                    let message = String::from_utf8_lossy(&i.payload).into_owned();
                    return Err(MigrationError::Peer {
                        peer: self.health.side().peer(),
                        message,
                    });
                }
                Ok(i) => return Ok(i),
                Err(RecvTimeoutError::Timeout) => self.health.check()?,
                Err(RecvTimeoutError::Disconnected) => {
                    self.health.check()?;
                    return Err(MigrationError::Closed {
                        peer: self.health.side().peer(),
                    });
                }
            }
        }
    }

    /// The next main-channel message, refusing frames that are not one.
    pub fn recv_message(&self, expected: &'static str) -> Result<(Message, u64), MigrationError> {
        let i = self.recv()?;
        if matches!(
            i.kind,
            FrameKind::Header
                | FrameKind::Pages
                | FrameKind::VcpuState
                | FrameKind::Sections
                | FrameKind::Hello
        ) {
            return Err(MigrationError::Protocol {
                expected,
                got: i.kind,
                offset: i.offset,
            });
        }
        Ok((Message::decode(i.kind, &i.payload, i.offset)?, i.offset))
    }

    /// Ends a migration that failed with `e` on this side: tells the peer
    /// why (unless the peer said it first, or the link stalled), waits a
    /// moment for the peer to take it, and returns the reason to report.
    /// When `e` is a broken or closed connection, the peer may have said why
    /// just before it closed; its reason is then the one reported.
    pub fn give_up(&mut self, e: MigrationError) -> MigrationError {
        let deadline = Instant::now() + GIVE_UP_DRAIN;
        self.health.abort();
        self.stop_heartbeats();
        let link_broke = match e {
            MigrationError::Aborted => self.health.failure_may_be_the_peers(),
            ref e => is_link_failure(e),
        };
        if link_broke {
            self.wait_for_reader(deadline);
        }
        let e = self.health.settle(e);
        if !matches!(
            e,
            MigrationError::Peer { .. } | MigrationError::Stalled { .. }
        ) {
            let _ = self.send(&Message::Error(e.chain()));
            if let Ok(w) = self.writer.lock() {
                w.get_ref().shutdown_link(Shutdown::Write);
            }
            // The peer closes once it has read the Error; closing first
            // could reset the connection before it does.
            self.wait_for_reader(deadline);
        }
        self.health.shutdown_all();
        self.join();
        e
    }

    /// Ends this set of connections after `e` without telling the peer,
    /// which may wait to be reconnected (a postcopy that can still be
    /// resumed): returns the reason to report.
    pub fn abandon(&mut self, e: MigrationError) -> MigrationError {
        self.health.abort();
        self.stop_heartbeats();
        let e = self.health.settle(e);
        self.health.shutdown_all();
        self.join();
        e
    }

    /// Ends a migration that completed: no more heartbeats, and nothing the
    /// peer does from now on is a failure.
    pub fn close(&mut self) {
        self.health.finish();
        self.stop_heartbeats();
        self.health.shutdown_all();
        self.join();
    }

    fn stop_heartbeats(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(b) = self.beat.take() {
            b.thread().unpark();
            let _ = b.join();
        }
    }

    /// Waits until the reader thread ended (the peer closed, or said why),
    /// or `deadline`.
    fn wait_for_reader(&self, deadline: Instant) {
        while let Some(r) = &self.reader {
            if r.is_finished() || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn join(&mut self) {
        if let Some(r) = self.reader.take() {
            if r.is_finished() {
                let _ = r.join();
            }
            // Else it is blocked on a link that shutdown_all has just closed;
            // it ends on its own and owns nothing the caller needs.
        }
    }
}

impl Drop for MainChannel {
    fn drop(&mut self) {
        self.stop_heartbeats();
        self.health.shutdown_all();
    }
}

fn send_locked(
    writer: &Mutex<Channel>,
    kind: FrameKind,
    payload: &[u8],
) -> Result<(), StreamError> {
    let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
    w.write_frame(kind, &[payload])?;
    w.flush()
}

fn read_loop(mut io: Channel, health: &Health, tx: &mpsc::Sender<Incoming>) {
    let peer = health.side().peer();
    loop {
        let (kind, offset) = match io.read_frame_or_end() {
            Ok(Some(f)) => f,
            Ok(None) => {
                if !health.is_finished() {
                    health.fail(MigrationError::Closed { peer });
                }
                return;
            }
            Err(e) => {
                if !health.is_finished() {
                    health.fail(e.into());
                }
                return;
            }
        };
        health.heard();
        if kind == FrameKind::Heartbeat {
            match Message::decode(kind, io.payload(), offset) {
                Ok(Message::Heartbeat { data_bytes }) => health.peer_data(data_bytes),
                Ok(_) => {}
                Err(e) => {
                    health.fail(e.into());
                    return;
                }
            }
            continue;
        }
        let incoming = Incoming {
            kind,
            payload: io.payload().to_vec(),
            offset,
        };
        if kind == FrameKind::Error {
            health.fail(MigrationError::Peer {
                peer,
                message: String::from_utf8_lossy(&incoming.payload).into_owned(),
            });
            let _ = tx.send(incoming);
            return;
        }
        if tx.send(incoming).is_err() {
            return;
        }
    }
}

fn heartbeat_loop(health: &Health, writer: &Mutex<Channel>, stop: &AtomicBool) {
    let every = health.heartbeat_interval();
    while !stop.load(Ordering::Acquire) && !health.is_failed() {
        let beat = Message::Heartbeat {
            data_bytes: health.data_bytes(),
        };
        if let Err(e) = send_locked(writer, beat.kind(), &beat.encode()) {
            if !stop.load(Ordering::Acquire) {
                health.fail(e.into());
            }
            return;
        }
        // Once the migration is over (the destination runs the committed
        // guest), a quiet source is no reason to stop heartbeating.
        if let Some(stall) = health.stalled().filter(|_| !health.is_finished()) {
            tracing::warn!("{stall}");
            health.fail(stall);
            return;
        }
        std::thread::park_timeout(every);
    }
}
