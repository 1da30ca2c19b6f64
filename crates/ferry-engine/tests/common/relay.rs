//! A fault-injecting TCP relay between a source and a destination on
//! loopback: it forwards every connection of a migration and, at a chosen
//! byte of the first data connection (the second connection opened), flips
//! a bit, stops forwarding everything while keeping every socket open (the
//! way a hung middlebox does), or cuts every connection (a network that
//! drops), then forwards the next set of connections. It can also hold
//! the main channel just before a chosen frame, so that a test
//! kills a peer process at that exact point, then forward on.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What the relay does to the first data connection.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Forward faithfully.
    None,
    /// Flip the low bit of the byte at this offset (source → destination).
    FlipAt(u64),
    /// Once this many bytes went source → destination, forward nothing more
    /// on any connection, either way, until [`Relay::release`].
    StallAfter(u64),
    /// Once this many bytes went source → destination, shut every
    /// connection opened so far down; the connections opened after that
    /// are a new set, whose first data connection is cut the same way,
    /// `times` cuts in all.
    CutAfter {
        /// Bytes into the first data connection of each set.
        bytes: u64,
        /// Cuts before the relay forwards faithfully.
        times: u32,
    },
    /// On the main channel, cut every connection just before the
    /// first frame of type `kind` goes through (source → destination, or
    /// with `to_source` the other way): a cut inside the switchover or the
    /// digest exchange, at a chosen message rather than a byte.
    CutAtFrame {
        /// The frame type's byte.
        kind: u8,
        /// The destination's frames, not the source's.
        to_source: bool,
    },
    /// Like [`Fault::CutAfter`] once, then every new connection is closed
    /// at once (a peer that cannot be reached) until [`Relay::readmit`]:
    /// a postcopy stays in recovery as long as a test needs.
    CutThenRefuse(u64),
    /// Rewrite the preamble of every connection (source → destination) to
    /// offer only this wire version: the destination then meets a peer of
    /// that version, and the source a destination that chose it.
    OfferVersion(u32),
    /// On the main channel, hold the first frame of type `kind` (in
    /// that direction) until [`Relay::release`], everything else flowing,
    /// then forward it and go on faithfully: a peer can be killed while the
    /// other waits for that frame.
    HoldAtFrame {
        /// The frame type's byte.
        kind: u8,
        /// The destination's frames, not the source's.
        to_source: bool,
    },
}

/// Finds where frames start in a stream fed chunk by chunk: the preamble
/// (if the stream opens with one) is skipped, then each 12-byte header
/// gives the length to skip.
#[derive(Default)]
struct FrameWatch {
    seen: Vec<u8>,
    next: usize,
    opened: bool,
}

impl FrameWatch {
    /// Feeds `chunk`; returns where in it a frame of type `kind` starts.
    fn feed(&mut self, chunk: &[u8], kind: u8) -> Option<usize> {
        let before = self.seen.len();
        self.seen.extend_from_slice(chunk);
        if !self.opened {
            if self.seen.len() < 8 {
                return None;
            }
            self.opened = true;
            if self.seen[..8] == ferry_engine::wire::MAGIC {
                self.next = ferry_engine::wire::PREAMBLE_LEN;
            }
        }
        while self.seen.len() >= self.next + 12 {
            let head = &self.seen[self.next..self.next + 12];
            if head[0] == kind {
                return Some(self.next.saturating_sub(before));
            }
            let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
            self.next += 12 + len;
        }
        None
    }
}

/// The connections of the current set, and the cuts left.
#[derive(Default)]
struct Cuts {
    open: std::sync::Mutex<Vec<TcpStream>>,
    /// Connections opened since the last cut.
    opened: AtomicU64,
    done: std::sync::atomic::AtomicU32,
    /// A held frame was reached.
    held: AtomicBool,
    /// The held frame is dropped with its connection, not forwarded.
    discard: AtomicBool,
    /// New connections are closed at once.
    refusing: AtomicBool,
}

impl Cuts {
    /// Shuts the current set down; the next connection starts a new set.
    fn cut(&self) {
        let mut open = self.open.lock().unwrap();
        // Counted first: whoever sees the cut's effect sees it counted.
        self.done.fetch_add(1, Ordering::SeqCst);
        self.opened.store(0, Ordering::SeqCst);
        for s in open.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// A running relay. Dropping it releases a stall and lets its threads end.
pub struct Relay {
    /// Where sources connect.
    pub addr: String,
    stalled: Arc<AtomicBool>,
    released: Arc<AtomicBool>,
    cuts: Arc<Cuts>,
    accept: Option<JoinHandle<()>>,
}

/// Flags the pumps share.
struct Flags {
    stalled: Arc<AtomicBool>,
    released: Arc<AtomicBool>,
    cuts: Arc<Cuts>,
}

impl Relay {
    /// Relays connections made to the returned address on to `target`.
    pub fn start(target: String, fault: Fault) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stalled = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicBool::new(false));
        let (s, r) = (Arc::clone(&stalled), Arc::clone(&released));
        let cuts = Arc::new(Cuts::default());
        let c = Arc::clone(&cuts);
        listener.set_nonblocking(true).unwrap();
        let accept = std::thread::spawn(move || {
            while !r.load(Ordering::Acquire) {
                let client = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                };
                client.set_nonblocking(false).unwrap();
                if c.refusing.load(Ordering::Acquire) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let index = c.opened.fetch_add(1, Ordering::SeqCst);
                let (fault, back) = match fault {
                    Fault::CutAfter { times, .. } if c.done.load(Ordering::SeqCst) >= times => {
                        (Fault::None, Fault::None)
                    }
                    Fault::CutThenRefuse(_) if c.done.load(Ordering::SeqCst) >= 1 => {
                        (Fault::None, Fault::None)
                    }
                    Fault::CutAtFrame { to_source, .. }
                        if index == 0 && c.done.load(Ordering::SeqCst) == 0 =>
                    {
                        if to_source {
                            (Fault::None, fault)
                        } else {
                            (fault, Fault::None)
                        }
                    }
                    Fault::CutAtFrame { .. } => (Fault::None, Fault::None),
                    Fault::HoldAtFrame { to_source, .. } if index == 0 => {
                        if to_source {
                            (Fault::None, fault)
                        } else {
                            (fault, Fault::None)
                        }
                    }
                    Fault::HoldAtFrame { .. } => (Fault::None, Fault::None),
                    Fault::OfferVersion(_) => (fault, Fault::None),
                    f if index == 1 => (f, Fault::None),
                    _ => (Fault::None, Fault::None),
                };
                {
                    let mut open = c.open.lock().unwrap();
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                let pair = [
                    (
                        client.try_clone().unwrap(),
                        server.try_clone().unwrap(),
                        fault,
                    ),
                    (server, client, back),
                ];
                for (from, to, fault) in pair {
                    let flags = Flags {
                        stalled: Arc::clone(&s),
                        released: Arc::clone(&r),
                        cuts: Arc::clone(&c),
                    };
                    std::thread::spawn(move || pump(from, to, fault, &flags));
                }
            }
        });
        Relay {
            addr,
            stalled,
            released,
            cuts,
            accept: Some(accept),
        }
    }

    /// Cuts made so far.
    pub fn cuts(&self) -> u32 {
        self.cuts.done.load(Ordering::SeqCst)
    }

    /// Whether the stall point was reached.
    pub fn has_stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// Whether the frame to hold has arrived (and is held).
    pub fn is_holding(&self) -> bool {
        self.cuts.held.load(Ordering::Acquire)
    }

    /// Lets new connections through again, after [`Fault::CutThenRefuse`].
    pub fn readmit(&self) {
        self.cuts.refusing.store(false, Ordering::Release);
    }

    /// Ends a hold by dropping the held frame and closing its connection:
    /// the frame was never sent (its sender, say, was killed first).
    pub fn discard(&self) {
        self.cuts.discard.store(true, Ordering::Release);
        self.release();
    }

    /// Ends a stall: the relay's held connections close.
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.release();
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, mut fault: Fault, flags: &Flags) {
    let (stalled, released, cuts) = (&*flags.stalled, &*flags.released, &*flags.cuts);
    let moved = AtomicU64::new(0);
    let mut watch = FrameWatch::default();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if stalled.load(Ordering::Acquire) {
            // Hold both sockets open, forward nothing.
            while !released.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(5));
            }
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let at = moved.fetch_add(n as u64, Ordering::Relaxed);
        let mut n = n;
        match fault {
            Fault::OfferVersion(v) if at < ferry_engine::wire::PREAMBLE_LEN as u64 => {
                // Bytes 8..12 are the newest version offered, 12..16 the
                // oldest: both become `v`.
                let bytes = [v.to_le_bytes(), v.to_le_bytes()].concat();
                for (i, b) in buf[..n].iter_mut().enumerate() {
                    let off = at + i as u64;
                    if (8..16).contains(&off) {
                        *b = bytes[(off - 8) as usize];
                    }
                }
            }
            Fault::FlipAt(off) if off >= at && off < at + n as u64 => {
                buf[(off - at) as usize] ^= 1;
            }
            Fault::StallAfter(limit) if at + n as u64 >= limit => {
                n = limit.saturating_sub(at) as usize;
                stalled.store(true, Ordering::Release);
            }
            Fault::CutAtFrame { kind, .. } => {
                if let Some(at) = watch.feed(&buf[..n], kind) {
                    let _ = to.write_all(&buf[..at]);
                    cuts.cut();
                    return;
                }
            }
            Fault::HoldAtFrame { kind, .. } => {
                if let Some(at) = watch.feed(&buf[..n], kind) {
                    if to.write_all(&buf[..at]).is_err() {
                        break;
                    }
                    // Only this direction of this connection waits: the
                    // flag tells the test, and the pumps at the loop's top
                    // do not hold for it (that is a stall).
                    flags.cuts.held.store(true, Ordering::Release);
                    while !released.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    if cuts.discard.load(Ordering::Acquire) {
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                        return;
                    }
                    if to.write_all(&buf[at..n]).is_err() {
                        break;
                    }
                    fault = Fault::None;
                    continue;
                }
            }
            Fault::CutThenRefuse(bytes) if at + n as u64 >= bytes => {
                let n = bytes.saturating_sub(at) as usize;
                let _ = to.write_all(&buf[..n]);
                cuts.refusing.store(true, Ordering::Release);
                cuts.cut();
                return;
            }
            Fault::CutAfter { bytes, .. } if at + n as u64 >= bytes => {
                let n = bytes.saturating_sub(at) as usize;
                let _ = to.write_all(&buf[..n]);
                cuts.cut();
                return;
            }
            _ => {}
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
