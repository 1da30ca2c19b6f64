//! A synthetic device with large state that changes while the guest runs,
//! as a GPU's memory or a VFIO device's does: `bytes` of state in 64 KiB
//! blocks, a thread that rewrites one block every `period` while the VM
//! runs, and its live state ([`LiveState`]) sent as the blocks rewritten
//! since they were last sent, each `u32 block | 64 KiB`. For tests and
//! benchmarks of device state (`ferry bench device-state`): a VMM wraps it
//! into its VM's sections and `live_state`, and compares [`BigDevice::state`]
//! on both ends afterwards.

use crate::{LiveState, Section, SectionId, SectionSpec, VmError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes per block.
pub const BLOCK: usize = 64 << 10;
const ENTRY: usize = 4 + BLOCK;

struct Blocks {
    state: Vec<u8>,
    /// Rewritten since last sent.
    dirty: Vec<bool>,
    dirty_count: usize,
}

impl Blocks {
    fn mark(&mut self, block: usize) {
        if !self.dirty[block] {
            self.dirty[block] = true;
            self.dirty_count += 1;
        }
    }

    /// Up to `max` bytes of dirty blocks, as whole entries (none when
    /// `max` holds less than one); they are clean after.
    fn take(&mut self, max: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(max.min(self.dirty_count * ENTRY));
        for b in 0..self.dirty.len() {
            if out.len() + ENTRY > max {
                break;
            }
            if self.dirty[b] {
                self.dirty[b] = false;
                self.dirty_count -= 1;
                out.extend_from_slice(&(b as u32).to_le_bytes());
                out.extend_from_slice(&self.state[b * BLOCK..(b + 1) * BLOCK]);
            }
        }
        out
    }

    fn apply(&mut self, entries: &[u8]) -> Result<(), VmError> {
        let bad = |reason: String| VmError::BadSection {
            section: "'gpu' instance 0".into(),
            reason,
        };
        if !entries.len().is_multiple_of(ENTRY) {
            return Err(bad(format!("{} bytes of device blocks", entries.len())));
        }
        for e in entries.chunks(ENTRY) {
            let b = u32::from_le_bytes(e[..4].try_into().unwrap()) as usize;
            let at = b * BLOCK;
            let dst = self
                .state
                .get_mut(at..at + BLOCK)
                .ok_or_else(|| bad(format!("no block {b}")))?;
            dst.copy_from_slice(&e[4..]);
        }
        Ok(())
    }
}

/// The device.
pub struct BigDevice {
    id: SectionId,
    blocks: Arc<Mutex<Blocks>>,
    period: Duration,
    stop: Arc<AtomicBool>,
    writer: Option<JoinHandle<()>>,
    /// Whether it rewrites its state while it runs: a source's does; a
    /// destination's holds what arrived, to be compared with the source's.
    rewrites: bool,
    /// Whether it sends (or loads) its state live.
    pub live: bool,
}

impl BigDevice {
    /// A source's device: `bytes` of state that does not compress, all of
    /// it still to send, rewriting a block every `period` while it runs.
    pub fn source(bytes: usize, period: Duration) -> Self {
        let mut d = Self::destination(bytes);
        let mut b = d.lock();
        b.state = noise(7, bytes);
        for i in 0..b.dirty.len() {
            b.mark(i);
        }
        drop(b);
        d.period = period;
        d.rewrites = true;
        d
    }

    /// A destination's: zeroed, filled by what arrives.
    pub fn destination(bytes: usize) -> Self {
        let blocks = bytes.div_ceil(BLOCK);
        BigDevice {
            id: SectionId {
                name: "gpu".into(),
                instance: 0,
                version: 1,
            },
            blocks: Arc::new(Mutex::new(Blocks {
                state: vec![0; blocks * BLOCK],
                dirty: vec![false; blocks],
                dirty_count: 0,
            })),
            period: Duration::from_millis(1),
            stop: Arc::new(AtomicBool::new(false)),
            writer: None,
            rewrites: false,
            live: true,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Blocks> {
        self.blocks.lock().unwrap()
    }

    /// Its section's spec: at most every block, at the pause.
    pub fn spec(&self) -> SectionSpec {
        let entries = self.lock().dirty.len() * ENTRY;
        SectionSpec::new(&self.id.name, 1, 1).with_max_bytes(entries as u64)
    }

    /// Its state now.
    pub fn state(&self) -> Vec<u8> {
        self.lock().state.clone()
    }

    /// Starts rewriting blocks (the VM runs), if it is a source's.
    pub fn run(&mut self) {
        if self.writer.is_some() || !self.rewrites {
            return;
        }
        self.stop.store(false, Ordering::Release);
        let (blocks, stop, period) = (
            Arc::clone(&self.blocks),
            Arc::clone(&self.stop),
            self.period,
        );
        self.writer = Some(std::thread::spawn(move || {
            let mut n: u64 = 0;
            while !stop.load(Ordering::Acquire) {
                let mut b = blocks.lock().unwrap();
                let count = b.dirty.len() as u64;
                // Blocks in a scattered order, each stamped with the count.
                let block = (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) % count) as usize;
                b.state[block * BLOCK..block * BLOCK + 8].copy_from_slice(&n.to_le_bytes());
                b.mark(block);
                drop(b);
                n += 1;
                std::thread::sleep(period);
            }
        }));
    }

    /// Stops rewriting (the VM pauses).
    pub fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }

    /// What goes at the pause: every block still dirty.
    pub fn save_rest(&self) -> Section {
        Section {
            id: self.id.clone(),
            data: self.lock().take(usize::MAX),
            subsections: Vec::new(),
        }
    }

    /// Whether `s` is this device's section.
    pub fn owns(&self, s: &Section) -> bool {
        s.id.name == self.id.name
    }

    /// Loads what came at the pause.
    pub fn restore(&self, s: &Section) -> Result<(), VmError> {
        self.lock().apply(&s.data)
    }
}

impl LiveState for BigDevice {
    fn live_sections(&self) -> Vec<SectionId> {
        vec![self.id.clone()]
    }
    fn pending(&self, _id: &SectionId) -> u64 {
        (self.lock().dirty_count * ENTRY) as u64
    }
    fn save(&mut self, _id: &SectionId, max: usize) -> Result<Vec<u8>, VmError> {
        Ok(self.lock().take(max))
    }
    fn load(&mut self, _id: &SectionId, chunk: &[u8]) -> Result<(), VmError> {
        self.lock().apply(chunk)
    }
}

impl Drop for BigDevice {
    fn drop(&mut self) {
        self.halt();
    }
}

/// `len` bytes that do not compress (xorshift64 from `seed`): honest input
/// for anything that measures bytes on the wire.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_chunks_and_the_rest_rebuild_the_state() {
        let mut src = BigDevice::source(8 * BLOCK, Duration::from_millis(1));
        let mut dst = BigDevice::destination(8 * BLOCK);
        let id = src.live_sections()[0].clone();
        assert_eq!(src.pending(&id), (8 * ENTRY) as u64);
        let chunk = src.save(&id, 3 * ENTRY).unwrap();
        assert_eq!(chunk.len(), 3 * ENTRY);
        dst.load(&id, &chunk).unwrap();
        dst.restore(&src.save_rest()).unwrap();
        assert_eq!(src.pending(&id), 0);
        assert!(dst.state() == src.state());
        let bad = Section::new("gpu", vec![1, 2, 3]);
        assert!(dst.restore(&bad).is_err());
    }

    /// `save` keeps to its bound, as the contract says: a bound under one
    /// block takes nothing, and leaves it all pending.
    #[test]
    fn a_save_never_gives_more_than_it_was_asked() {
        let mut src = BigDevice::source(4 * BLOCK, Duration::from_millis(1));
        let id = src.live_sections()[0].clone();
        for max in [0, 1, ENTRY - 1, ENTRY, ENTRY + 1, 2 * ENTRY + 5] {
            let before = src.pending(&id);
            let chunk = src.save(&id, max).unwrap();
            assert!(chunk.len() <= max, "{} > {max}", chunk.len());
            assert_eq!(src.pending(&id), before - chunk.len() as u64);
        }
    }
}
