//! The destination's data connections: two threads each, a reader and a
//! placer, placing pages into the [`Loaded`] image once the round gate
//! (`round_gate`) lets their round in.
//!
//! **Why two.** One connection's receiving thread was the first pass's
//! bottleneck: reading the socket, checking each page's xxh3 and placing it
//! with `UFFDIO_COPY`, one after the other. The reader reads and checks a
//! frame (the frame check is the page hashes the digest keeps, see
//! `wire::frame`); the placer decodes and places the one before it, so a
//! destination's checks run beside its placement on another core. At most
//! [`READ_AHEAD`] checked frames wait between the two; their buffers go
//! back to the reader, so none is allocated once they circulate.

use super::loaded::Loaded;
use crate::error::MigrationError;
use crate::transport::health::spawn;
use crate::transport::{Channel, Health};
use crate::wire::compress::decompress;
use crate::wire::delta::{decode_delta, DeltaView};
use crate::wire::frame::FRAME_HEADER_LEN;
use crate::wire::{decode_batch, BatchView, FrameKind, Message, ReadFrame, StreamError};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Checked frames a connection's reader may hold ready for its placer: one
/// to place next while another is read, and one more so that a short stall
/// on either side does not stop the other. More would only hold memory (a
/// frame is a batch, 1 MiB by default).
const READ_AHEAD: usize = 2;

/// A frame read and checked, on its way from a reader to its placer.
struct Checked {
    kind: FrameKind,
    /// Its offset in the connection's stream, for errors.
    offset: u64,
    frame: ReadFrame,
}

/// The receiver threads of one migration.
pub(crate) struct Receivers {
    handles: Vec<JoinHandle<()>>,
}

impl Receivers {
    /// Starts a reader and a placer per data connection, at round
    /// `first_round` (a postcopy recovery's new connections start in the
    /// push's round; the lanes are reopened there).
    pub fn start(
        links: Vec<Channel>,
        loaded: &Arc<Loaded>,
        health: &Arc<Health>,
        first_round: u32,
    ) -> Result<Self, MigrationError> {
        loaded.gate.reopen(first_round);
        let mut handles = Vec::new();
        for (i, io) in links.into_iter().enumerate() {
            let (checked_tx, checked) = mpsc::sync_channel(READ_AHEAD);
            let (spares, spares_rx) = mpsc::channel();
            // The placer first: if the reader cannot start, the placer sees
            // its lane end and closes it.
            let mut placer = Placer {
                lane: i,
                loaded: Arc::clone(loaded),
                health: Arc::clone(health),
                round: first_round,
                pages_this_round: 0,
                unpacked: Vec::new(),
                scratch: Vec::new(),
            };
            let placing = spawn(health, format!("place-{}", i + 1), move || {
                placer.run(&checked, &spares)
            })
            .map_err(StreamError::Io)?;
            handles.push(placing);
            let h = Arc::clone(health);
            let reader = spawn(health, format!("recv-{}", i + 1), move || {
                read_loop(io, &h, &checked_tx, &spares_rx)
            })
            .map_err(StreamError::Io)?;
            handles.push(reader);
        }
        Ok(Receivers { handles })
    }

    /// Waits for every reader and placer to end (the source closed its
    /// connections, or a failure shut them down).
    pub fn join(mut self) {
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// A decoded page-carrying frame.
enum Pages<'a> {
    Whole(BatchView<'a>),
    Delta(DeltaView<'a>),
}

/// A connection's reader: reads and checks frames, and hands them to its
/// placer in order, until the stream ends, fails, or the placer stops.
/// A failure is recorded at once (it shuts every connection down).
fn read_loop(
    mut io: Channel,
    health: &Health,
    checked: &SyncSender<Checked>,
    spares: &Receiver<ReadFrame>,
) {
    loop {
        let (kind, offset) = match io.read_frame_or_end() {
            Ok(Some(read)) => read,
            Ok(None) => return,
            Err(e) => return health.fail(e.into()),
        };
        health.add_data_bytes((FRAME_HEADER_LEN + io.payload().len()) as u64);
        let frame = io.take_frame(spares.try_recv().unwrap_or_default());
        if checked
            .send(Checked {
                kind,
                offset,
                frame,
            })
            .is_err()
        {
            return;
        }
    }
}

/// A connection's placing side: the round it is in, and what it has placed
/// in that round.
struct Placer {
    lane: usize,
    loaded: Arc<Loaded>,
    health: Arc<Health>,
    round: u32,
    pages_this_round: u64,
    /// A decompressed payload.
    unpacked: Vec<u8>,
    /// A page being patched by a delta.
    scratch: Vec<u8>,
}

impl Placer {
    /// Places what the reader checked, then closes the lane. The reason
    /// first: a lane seen closed must not look like the cause of a failure
    /// it only follows.
    fn run(&mut self, checked: &Receiver<Checked>, spares: &Sender<ReadFrame>) {
        if let Err(e) = self.place_all(checked, spares) {
            self.health.fail(e);
        }
        self.loaded.gate.update(self.lane, |l| l.closed = true);
    }

    /// Places the frames the reader checked, in order, until the reader
    /// ends or the migration fails (frames read before a failure are not
    /// placed after it); each frame's buffers go back to the reader.
    fn place_all(
        &mut self,
        checked: &Receiver<Checked>,
        spares: &Sender<ReadFrame>,
    ) -> Result<(), MigrationError> {
        for c in checked.iter() {
            if self.health.is_failed() {
                break;
            }
            match c.kind {
                FrameKind::Pages | FrameKind::Delta => self.place(&c)?,
                FrameKind::RoundEnd => {
                    match Message::decode(c.kind, c.frame.payload(), c.offset)? {
                        Message::RoundEnd { round, pages } => self.end_round(round, pages)?,
                        m => {
                            return Err(
                                self.refused(format!("the end of round {}, got {m:?}", self.round))
                            )
                        }
                    }
                }
                got => {
                    return Err(MigrationError::Protocol {
                        expected: "Pages, Delta or RoundEnd on a data connection",
                        got,
                        offset: c.offset,
                    })
                }
            }
            let _ = spares.send(c.frame);
        }
        Ok(())
    }

    /// Places a Pages or Delta frame of the current round, once every lane
    /// has ended the round before.
    fn place(&mut self, c: &Checked) -> Result<(), MigrationError> {
        let (kind, offset, io) = (c.kind, c.offset, &c.frame);
        let malformed = |reason| StreamError::Malformed {
            kind,
            offset,
            reason,
        };
        let payload = match io.flags() {
            0 => io.payload(),
            flags => {
                decompress(flags, io.payload(), &mut self.unpacked).map_err(malformed)?;
                &self.unpacked
            }
        };
        let pages = self.loaded.pages;
        let (batch_round, pages) = if kind == FrameKind::Pages {
            let batch = decode_batch(payload, pages).map_err(malformed)?;
            let batch = batch.with_page_hashes(io.page_hashes());
            (batch.round, Pages::Whole(batch))
        } else {
            let view = decode_delta(payload, pages).map_err(malformed)?;
            (view.round, Pages::Delta(view))
        };
        // A delta refers to an earlier round's copy, so never in round 0.
        let delta_in_0 = matches!(pages, Pages::Delta(_)) && self.round == 0;
        if batch_round != self.round || delta_in_0 {
            let round = self.round;
            return Err(MigrationError::Refused(format!(
                "data connection {} carried a round-{batch_round} {kind} frame in round {round}",
                self.lane + 1
            )));
        }
        // A later round waits until every lane has ended the one before.
        if self.round > 0 {
            self.loaded.wait_round(self.round - 1, &self.health)?;
        }
        self.pages_this_round += match &pages {
            Pages::Whole(batch) => self.loaded.apply(batch)?,
            Pages::Delta(view) => self
                .loaded
                .apply_delta(view, &mut self.scratch)
                .map_err(malformed)?,
        };
        Ok(())
    }

    /// The source ended `round` with `pages` on this lane: it must be the
    /// current round, with as many pages as were placed.
    fn end_round(&mut self, round: u32, pages: u64) -> Result<(), MigrationError> {
        if round != self.round {
            let expected = format!(
                "the end of round {}, got the end of round {round}",
                self.round
            );
            return Err(self.refused(expected));
        }
        if pages != self.pages_this_round {
            return Err(MigrationError::Refused(format!(
                "data connection {} ended round {round} with {} pages, the source sent {pages}",
                self.lane + 1,
                self.pages_this_round
            )));
        }
        self.loaded.gate.update(self.lane, |l| l.ended = round + 1);
        self.round = round + 1;
        self.pages_this_round = 0;
        Ok(())
    }

    /// The lane got something else than `expected`.
    fn refused(&self, expected: String) -> MigrationError {
        MigrationError::Refused(format!(
            "data connection {} expected {expected}",
            self.lane + 1
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Placement;
    use crate::wire::PageBatch;
    use ferry_vm::{Backing, DirtyPages, Gfn, GuestRam};

    fn batch_of(first: u64, fill: u8) -> Vec<u8> {
        let mut b = PageBatch::new(2);
        b.push_run(Gfn(first), 2).fill(fill);
        b.seal(0);
        let [a, c] = b.parts();
        [a, c].concat()
    }

    #[test]
    fn in_postcopy_a_late_copy_never_overwrites_what_the_guest_wrote() {
        let ram = Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap());
        let written = DirtyPages::new(ram.pages());
        let loaded = match Loaded::new(Arc::clone(&ram), &written, 1, Placement::Uffd, true) {
            Ok(l) => l,
            Err(e) => {
                ferry_vm::skip!(
                    "SKIP: userfaultfd unavailable here ({e}); place-once test not run"
                );
                return;
            }
        };
        // Pages 4 and 5 were placed in precopy; then they are missing again.
        let first = batch_of(4, 0x11);
        loaded.apply(&decode_batch(&first, 512).unwrap()).unwrap();
        let mut missing = DirtyPages::new(ram.pages());
        missing.set(Gfn(4));
        missing.set(Gfn(5));
        loaded.begin_postcopy(&missing).unwrap();
        assert!(!loaded.is_present(Gfn(4)) && loaded.received.count() == 0);
        // A request's answer lands, the guest writes page 4...
        let answer = batch_of(4, 0x22);
        loaded.apply(&decode_batch(&answer, 512).unwrap()).unwrap();
        ram.store_u64(Gfn(4).gpa(), 0x99).unwrap();
        // ...and the push's copy of the same pages arrives late.
        loaded.apply(&decode_batch(&answer, 512).unwrap()).unwrap();
        assert_eq!(
            ram.load_u64(Gfn(4).gpa()).unwrap(),
            0x99,
            "guest write kept"
        );
        assert_eq!(ram.load_u64(Gfn(5).gpa()).unwrap(), 0x2222_2222_2222_2222);
        assert_eq!(loaded.received.count(), 2);
        loaded.end_placement();
    }
}
