//! The source's side of postcopy: it answers page requests on the priority
//! connection from the paused guest's memory, and chooses what the push on
//! the data connections sends next.
//!
//! Both take pages out of one set, `todo` (missing at switchover and not
//! sent yet), so the push skips what a request already fetched. A page may
//! still go out twice, when a request and the push take it at the same
//! moment; the destination places it once and drops the other copy.
//!
//! Answers and the push share one bandwidth cap (`--bandwidth`): a capped
//! link is capped for both. An answer never waits for tokens: it is charged
//! and sent at once, and the push, which waits outside the bucket's lock,
//! pays the debt (QEMU's postcopy requests likewise jump the queue).
//!
//! The push starts where the destination last asked: a guest that touches
//! page g soon touches g + 1, so those pages go next (QEMU's postcopy does
//! the same after each request).

use crate::error::MigrationError;
use crate::transport::health::spawn;
use crate::transport::{Channel, Health};
use crate::tunables::TokenBucket;
use crate::wire::frame::FRAME_HEADER_LEN;
use crate::wire::{FrameKind, Message, PageBatch, StreamError};
use ferry_vm::{DirtyPages, Gfn, GuestRam, PageBits};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// No request yet since the push last looked.
const NO_HINT: u64 = u64::MAX;

/// What the page server and the push share.
pub(crate) struct Served {
    ram: Arc<GuestRam>,
    /// Missing pages not sent yet, by an answer or by the push.
    todo: PageBits,
    /// The round answers are sealed with (the postcopy round).
    round: AtomicU32,
    /// Set at the postcopy switchover: requests are answered from then on.
    armed: AtomicBool,
    /// Where the destination last asked (first page after the request).
    hint: AtomicU64,
}

impl Served {
    /// Nothing to send yet, for a guest of `ram`.
    fn new(ram: Arc<GuestRam>) -> Self {
        Served {
            todo: PageBits::new(ram.pages()),
            ram,
            round: AtomicU32::new(0),
            armed: AtomicBool::new(false),
            hint: AtomicU64::new(NO_HINT),
        }
    }

    /// Arms the server for postcopy round `round`, with `missing` to send.
    pub fn arm(&self, round: u32, missing: &DirtyPages) {
        for g in missing.iter() {
            self.todo.insert(g);
        }
        self.round.store(round, Ordering::SeqCst);
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Missing pages not sent yet.
    pub fn unsent(&self) -> u64 {
        self.todo.count()
    }

    /// Takes the next run of unsent pages for the push, at most `max`
    /// long: from the latest request's end if there was one since the last
    /// call, else from `cursor`, wrapping once. `None` when all are sent.
    pub fn next_run(&self, cursor: &mut u64, max: usize) -> Option<(Gfn, usize)> {
        let hint = self.hint.swap(NO_HINT, Ordering::Relaxed);
        if hint != NO_HINT {
            *cursor = hint;
        }
        loop {
            let first = self
                .todo
                .next_from(Gfn(*cursor))
                .or_else(|| self.todo.next_from(Gfn(0)))?;
            // A request may take pages between the search and here: the run
            // is what is still there, and may turn out empty.
            let mut n = 0;
            while n < max && self.todo.contains(Gfn(first.0 + n as u64)) {
                self.todo.remove(Gfn(first.0 + n as u64));
                n += 1;
            }
            *cursor = first.0 + n as u64;
            if n > 0 {
                return Some((first, n));
            }
        }
    }
}

/// The page server of one migration (source side).
pub(crate) struct PageServer {
    /// Shared with the push.
    pub served: Arc<Served>,
    handle: Option<JoinHandle<()>>,
}

impl PageServer {
    /// Serves requests arriving on `io`, the priority connection.
    /// Answers are charged to `bucket`, the bandwidth cap the push shares.
    /// `armed`: already in postcopy round `.0`, with pages `.1` to send.
    pub fn start(
        io: Channel,
        ram: Arc<GuestRam>,
        health: Arc<Health>,
        bucket: Arc<Mutex<TokenBucket>>,
        armed: Option<(u32, &DirtyPages)>,
    ) -> Result<Self, MigrationError> {
        let served = Arc::new(Served::new(ram));
        if let Some((round, missing)) = armed {
            served.arm(round, missing);
        }
        let s = Arc::clone(&served);
        let handle = spawn(&Arc::clone(&health), "page-server".into(), move || {
            match serve(io, &s, &health, &bucket) {
                // The destination closes the priority connection when it
                // has every page, perhaps while an answer is on its way.
                // A link that breaks earlier costs only the answers: the
                // push still carries every page, and a dead network is
                // noticed on the other connections.
                Err(e) if crate::transport::health::is_link_failure(&e) => {
                    tracing::debug!("priority connection ended: {}", e.chain());
                }
                Err(e) => health.fail(e),
                Ok(()) => {}
            }
        })
        .map_err(StreamError::Io)?;
        Ok(PageServer {
            served,
            handle: Some(handle),
        })
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        // The thread ends when the destination closes the priority
        // connection, or when a failure shuts the links down.
        if let Some(h) = self.handle.take() {
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

fn serve(
    mut io: Channel,
    s: &Served,
    health: &Health,
    bucket: &Mutex<TokenBucket>,
) -> Result<(), MigrationError> {
    let mut batch = PageBatch::new(crate::wire::MAX_BATCH_PAGES);
    while let Some((kind, offset)) = io.read_frame_or_end()? {
        let (first, count) = match Message::decode(kind, io.payload(), offset)? {
            Message::PageRequest { first, count } => (first, u64::from(count)),
            m => {
                return Err(MigrationError::Protocol {
                    expected: "PageRequest on the priority connection",
                    got: m.kind(),
                    offset,
                })
            }
        };
        if !s.armed.load(Ordering::SeqCst) {
            return Err(MigrationError::Refused(format!(
                "the destination asked for page {first:#x} before the postcopy switchover"
            )));
        }
        let pages = s.ram.pages();
        if first >= pages || count > pages - first {
            return Err(MigrationError::Refused(format!(
                "the destination asked for {count} pages from {first:#x}; the guest has {pages}"
            )));
        }
        for g in first..first + count {
            s.todo.remove(Gfn(g));
        }
        s.hint.store(first + count, Ordering::Relaxed);
        batch.clear();
        let buf = batch.push_run(Gfn(first), count as usize);
        s.ram
            .read_pages_to_send(Gfn(first), buf)
            .map_err(MigrationError::ram("read guest memory for a page request"))?;
        batch.seal(s.round.load(Ordering::SeqCst));
        let wire = (FRAME_HEADER_LEN + batch.payload_len()) as u64;
        // A vCPU waits for this: it goes at once, and the push pays the
        // debt it leaves (the cap holds for the sum).
        bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .charge(wire);
        io.write_frame(FrameKind::Pages, &batch.parts())?;
        io.flush()?;
        health.add_data_bytes(wire);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_vm::Backing;

    fn served(pages: &[u64]) -> Served {
        let ram = Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap());
        let s = Served::new(ram);
        let mut missing = DirtyPages::new(512);
        pages.iter().for_each(|&g| missing.set(Gfn(g)));
        s.arm(3, &missing);
        s
    }

    #[test]
    fn the_push_takes_runs_and_follows_requests() {
        let s = served(&[1, 2, 3, 10, 11, 500]);
        let mut cursor = 0;
        assert_eq!(s.next_run(&mut cursor, 2), Some((Gfn(1), 2)));
        // A request at 10 sends the push on from 12.
        s.todo.remove(Gfn(10));
        s.hint.store(11, Ordering::Relaxed);
        assert_eq!(s.next_run(&mut cursor, 8), Some((Gfn(11), 1)));
        assert_eq!(s.next_run(&mut cursor, 8), Some((Gfn(500), 1)));
        // Then it wraps round to what it skipped.
        assert_eq!(s.next_run(&mut cursor, 8), Some((Gfn(3), 1)));
        assert_eq!(s.next_run(&mut cursor, 8), None);
        assert_eq!(s.unsent(), 0);
    }
}
