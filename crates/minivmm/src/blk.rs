//! virtio-blk over virtio-mmio (virtio 1.2, 4.2 and 5.2), one queue,
//! backed by a disk image file that both ends of a migration open: the
//! shared storage clouds use.
//!
//! Requests are served when the guest notifies, in one of three ways
//! ([`Notify`]): on the vCPU's own thread during that MMIO exit; or by the
//! I/O thread ([`crate::iothread`]), woken through an eventfd that either
//! the exit handler signals or KVM itself signals without any exit
//! (`KVM_IOEVENTFD`). With an I/O thread, requests are in flight while the
//! vCPUs run, and the pause quiesces it: a batch it took finishes (data
//! written or read, status and used-ring entry in guest memory), and a
//! notification it had not yet taken stays in its eventfd.
//!
//! So when the VM pauses, no request is half done, and the device state is
//! the transport registers, the queue's `QueueState` (where it is in the
//! rings), and, only when there is one, a notification not yet served
//! (the `notify` subsection). The destination's device serves that one as
//! the VM starts; requests the guest made available but had not yet
//! notified stay in guest memory for its next notify. This is QEMU's
//! choice too (it drains block requests before it saves a device), and it
//! keeps the disk free of writes from a guest that is about to stop.
//!
//! The device writes guest memory (read data, status, used ring) through
//! vm-memory, whose `AtomicBitmap` the engine collects: those pages are
//! dirty-tracked with nothing more to do. It also keeps a journal of the
//! sequence numbers of the writes it served, for the demo's
//! exactly-once check.

use crate::virtio_mmio::{self, Common as Registers};
use crate::DeviceError;
use ferry_engine::vmm::{GuestRam, Section};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// The section's name.
pub const SECTION: &str = "virtio-blk";
/// The layout [`Blk::save`] writes.
pub const VERSION: u32 = 1;
/// The subsection saved only when a notification waits unserved.
pub const NOTIFY_SUBSECTION: &str = "notify";
pub use crate::virtio_mmio::QUEUE_NOTIFY;
const SECTOR: u64 = 512;
/// The most data one request may move: the guest sets descriptor lengths,
/// and a larger one is refused with an I/O error rather than allocated.
const MAX_REQUEST_BYTES: u64 = 1 << 20;
const DEVICE_ID_BLOCK: u32 = 2;
/// VIRTIO_F_VERSION_1, the only feature offered (bit 32).
const FEATURES: u64 = 1 << 32;

/// How the guest's queue notification reaches the code that serves it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Notify {
    /// The notify write exits to the vCPU thread, which serves the queue
    /// before the vCPU runs on: nothing is ever in flight.
    Inline,
    /// The notify write exits to the vCPU thread, which only signals the
    /// I/O thread's eventfd.
    Exit,
    /// KVM signals the I/O thread's eventfd itself (`KVM_IOEVENTFD`): the
    /// notify write does not exit to userspace at all.
    #[default]
    Ioeventfd,
}

impl std::str::FromStr for Notify {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "inline" => Ok(Notify::Inline),
            "exit" => Ok(Notify::Exit),
            "ioeventfd" => Ok(Notify::Ioeventfd),
            _ => Err(format!("{s:?}: use inline, exit or ioeventfd")),
        }
    }
}

impl std::fmt::Display for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Notify::Inline => "inline",
            Notify::Exit => "exit",
            Notify::Ioeventfd => "ioeventfd",
        })
    }
}

/// Where a ready queue's rings are, readable without the device's lock
/// (which the I/O thread holds for a whole batch).
#[derive(Debug, Default)]
pub struct Rings {
    /// The available ring's address; 0 while the queue is not ready.
    avail: AtomicU64,
    /// The used ring's address.
    used: AtomicU64,
}

impl Rings {
    fn set(&self, q: &Queue) {
        let state = q.state();
        let (avail, used) = match state.ready {
            true => (state.avail_ring, state.used_ring),
            false => (0, 0),
        };
        self.avail.store(avail, Ordering::Release);
        self.used.store(used, Ordering::Release);
    }

    /// Requests the guest has made available that the device has not
    /// completed, read from the rings' indexes in guest memory.
    pub fn in_flight(&self, ram: &GuestRam) -> u16 {
        let avail = self.avail.load(Ordering::Acquire);
        if avail == 0 {
            return 0;
        }
        let mem = ram.memory();
        let idx = |ring: u64| -> u16 { mem.read_obj(GuestAddress(ring + 2)).unwrap_or(0) };
        idx(avail).wrapping_sub(idx(self.used.load(Ordering::Acquire)))
    }
}

/// A block device on the virtio-mmio transport.
pub struct Blk {
    ram: Arc<GuestRam>,
    disk: File,
    sectors: u64,
    regs: Registers,
    queue: Queue,
    rings: Arc<Rings>,
    /// The I/O thread's eventfd for this device, if one serves it.
    kick: Option<EventFd>,
    /// A notification arrived with the source's section, to be served as
    /// the VM starts.
    notify_on_start: bool,
    /// Each write reaches the disk's storage before it completes
    /// (`fdatasync`), as QEMU's `cache=writethrough`.
    writethrough: bool,
    /// The irqfd that raises its completion interrupt, if the VM has an
    /// in-kernel irqchip.
    interrupt: Option<EventFd>,
    /// Completion interrupts raised.
    pub interrupts: u64,
    /// Notify writes that exited to a vCPU thread.
    pub notify_exits: u64,
    /// Sequence numbers of the writes served (a block's first 8 bytes).
    pub journal: Vec<u64>,
}

/// The section: the registers and the queue's `QueueState`.
#[derive(Serialize, Deserialize)]
struct Saved {
    regs: Registers,
    #[serde(with = "SavedQueue")]
    queue: QueueState,
}

/// `virtio_queue::QueueState`, field for field, as serde sees it.
#[derive(Serialize, Deserialize)]
#[serde(remote = "QueueState")]
struct SavedQueue {
    max_size: u16,
    next_avail: u16,
    next_used: u16,
    event_idx_enabled: bool,
    size: u16,
    ready: bool,
    desc_table: u64,
    avail_ring: u64,
    used_ring: u64,
}

impl Blk {
    /// A device over `disk` (its whole length, in sectors), whose queue has
    /// at most `queue_size` entries, served on the vCPU thread, or by the
    /// I/O thread that waits on `kick`.
    pub fn new(
        ram: Arc<GuestRam>,
        disk: File,
        queue_size: u16,
        kick: Option<EventFd>,
    ) -> Result<Self, DeviceError> {
        let len = disk.metadata().map_err(DeviceError::Disk)?.len();
        let queue = Queue::new(queue_size).map_err(|e| DeviceError::State {
            section: SECTION,
            why: format!("queue of {queue_size}: {e}"),
        })?;
        Ok(Blk {
            ram,
            disk,
            sectors: len / SECTOR,
            regs: Registers::default(),
            queue,
            rings: Arc::default(),
            kick,
            writethrough: false,
            interrupt: None,
            interrupts: 0,
            notify_on_start: false,
            notify_exits: 0,
            journal: Vec::new(),
        })
    }

    /// A guest read of register `offset`.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let value = self
            .regs
            .read(offset, DEVICE_ID_BLOCK, FEATURES)
            .unwrap_or(match offset {
                0x034 => u32::from(self.queue.max_size()),
                0x044 => u32::from(self.queue.ready()),
                0x0fc => 0, // config generation: the config never changes
                0x100 => self.sectors as u32,
                0x104 => (self.sectors >> 32) as u32,
                _ => 0,
            });
        virtio_mmio::answer(value, data);
    }

    /// A guest write of register `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let v = virtio_mmio::word(data);
        if self.regs.write(offset, v) {
            return;
        }
        let q = &mut self.queue;
        match offset {
            0x038 => q.set_size(v as u16),
            0x044 => {
                q.set_ready(v == 1);
                self.rings.set(q);
            }
            QUEUE_NOTIFY => self.notified(),
            virtio_mmio::STATUS if v == 0 => self.reset(),
            virtio_mmio::STATUS => self.regs.status = v,
            0x080 => q.set_desc_table_address(Some(v), None),
            0x084 => q.set_desc_table_address(None, Some(v)),
            0x090 => q.set_avail_ring_address(Some(v), None),
            0x094 => q.set_avail_ring_address(None, Some(v)),
            0x0a0 => q.set_used_ring_address(Some(v), None),
            0x0a4 => q.set_used_ring_address(None, Some(v)),
            _ => {}
        }
    }

    fn reset(&mut self) {
        self.regs = Registers::default();
        self.queue.reset();
        self.rings.set(&self.queue);
    }

    /// Where its queue's rings are, to count what is in flight without
    /// the device's lock.
    pub fn rings(&self) -> Arc<Rings> {
        Arc::clone(&self.rings)
    }

    /// Each write completes only once on the disk's storage (`true`), or
    /// once in the host's page cache.
    pub fn set_writethrough(&mut self, on: bool) {
        self.writethrough = on;
    }

    /// Raises completions through `irqfd` (virtio's used-buffer
    /// notification), besides the interrupt-status register.
    pub fn set_interrupt(&mut self, irqfd: EventFd) {
        self.interrupt = Some(irqfd);
    }

    /// The guest notified through an exit.
    fn notified(&mut self) {
        self.notify_exits += 1;
        self.kick_or_serve();
    }

    /// Hands a notification to the I/O thread, or serves it here if none.
    fn kick_or_serve(&mut self) {
        match &self.kick {
            // An eventfd write fails only once its counter is near
            // u64::MAX, when the I/O thread is certain to wake anyway.
            Some(kick) => {
                let _ = kick.write(1);
            }
            None => self.serve(),
        }
    }

    /// Serves a notification that came with the source's state, now that
    /// the VM starts.
    pub fn start(&mut self) {
        if std::mem::take(&mut self.notify_on_start) {
            self.kick_or_serve();
        }
    }

    /// Whether a notification waits in the I/O thread's eventfd, not yet
    /// taken (the thread is quiesced, so it stays there).
    pub fn notify_pending(&self) -> bool {
        let Some(kick) = &self.kick else {
            return false;
        };
        let mut fd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(kick),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a zero timeout.
        unsafe { libc::poll(&mut fd, 1, 0) == 1 && fd.revents & libc::POLLIN != 0 }
    }

    /// Serves every request the guest has made available.
    pub fn serve(&mut self) {
        let ram = Arc::clone(&self.ram);
        let mem = ram.memory();
        if self.regs.status & 4 == 0 || !self.queue.is_valid(mem) {
            return;
        }
        let mut served = 0;
        while let Some(chain) = self.queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let descs: Vec<_> = chain.collect();
            let written = self.execute(&descs).unwrap_or(0);
            // A used entry the guest cannot find is its own undoing: the
            // rings are its memory.
            let _ = self.queue.add_used(mem, head, written);
            served += 1;
        }
        if served == 0 {
            return;
        }
        self.regs.interrupt_status |= 1;
        if let Some(irq) = &self.interrupt {
            // As with the notify eventfd: fails only with a full counter.
            if irq.write(1).is_ok() {
                self.interrupts += 1;
            }
        }
    }

    /// Runs one request: header, data descriptors, status. Returns the
    /// bytes written into guest memory.
    fn execute(&mut self, descs: &[virtio_queue::desc::split::Descriptor]) -> Option<u32> {
        let ram = Arc::clone(&self.ram);
        let mem = ram.memory();
        let (header, rest) = descs.split_first()?;
        let (status, data) = rest.split_last()?;
        if header.len() < 16 || status.len() < 1 || !status.is_write_only() {
            return None;
        }
        let kind: u32 = mem.read_obj(header.addr()).ok()?;
        let sector: u64 = mem.read_obj(header.addr().unchecked_add(8)).ok()?;
        let mut written = 1u32;
        let code = match kind {
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
                let write = kind == VIRTIO_BLK_T_OUT;
                match self.transfer(sector, data, write) {
                    Ok(n) => {
                        if !write {
                            written = written.saturating_add(n);
                        }
                        VIRTIO_BLK_S_OK
                    }
                    Err(_) => VIRTIO_BLK_S_IOERR,
                }
            }
            VIRTIO_BLK_T_GET_ID => {
                let id = *b"minivmm-disk\0\0\0\0\0\0\0\0";
                match data.first() {
                    Some(d) if d.is_write_only() => {
                        let n = id.len().min(d.len() as usize);
                        let _ = mem.write_slice(&id[..n], d.addr());
                        written = written.saturating_add(n as u32);
                        VIRTIO_BLK_S_OK
                    }
                    _ => VIRTIO_BLK_S_IOERR,
                }
            }
            _ => VIRTIO_BLK_S_UNSUPP,
        };
        mem.write_obj(code as u8, status.addr()).ok()?;
        Some(written)
    }

    /// Moves the data descriptors' bytes to or from the disk at `sector`.
    fn transfer(
        &mut self,
        sector: u64,
        data: &[virtio_queue::desc::split::Descriptor],
        write: bool,
    ) -> Result<u32, ()> {
        let ram = Arc::clone(&self.ram);
        let mem = ram.memory();
        let total: u64 = data.iter().map(|d| u64::from(d.len())).sum();
        if total > MAX_REQUEST_BYTES {
            return Err(());
        }
        let end = sector
            .checked_mul(SECTOR)
            .and_then(|b| b.checked_add(total));
        if end.is_none_or(|end| end > self.sectors * SECTOR) {
            return Err(());
        }
        let mut at = sector * SECTOR;
        let mut seqs = Vec::new();
        for d in data {
            // A read needs buffers the device may write, a write ones it
            // only reads.
            if d.is_write_only() == write {
                return Err(());
            }
            let mut buf = vec![0u8; d.len() as usize];
            if write {
                mem.read_slice(&mut buf, d.addr()).map_err(|_| ())?;
                self.disk.write_all_at(&buf, at).map_err(|_| ())?;
                if at.is_multiple_of(crate::layout::BLOCK_BYTES) && buf.len() >= 8 {
                    seqs.push(u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")));
                }
            } else {
                self.disk.read_exact_at(&mut buf, at).map_err(|_| ())?;
                mem.write_slice(&buf, d.addr()).map_err(|_| ())?;
            }
            at += u64::from(d.len());
        }
        if write && self.writethrough {
            self.disk.sync_data().map_err(|_| ())?;
        }
        self.journal.extend(seqs);
        Ok(total as u32)
    }

    /// The registers and the queue's state as instance `instance` of the
    /// section, with the `notify` subsection if a notification waits.
    pub fn save(&self, instance: u32) -> Section {
        let saved = Saved {
            regs: self.regs,
            queue: self.queue.state(),
        };
        let data = serde_json::to_vec(&saved).expect("plain data serializes");
        let section = Section::new(SECTION, data).instance(instance);
        if self.notify_pending() || self.notify_on_start {
            section.with_subsection(NOTIFY_SUBSECTION, Vec::new())
        } else {
            section
        }
    }

    /// Loads what [`Blk::save`] wrote.
    pub fn restore(&mut self, section: &Section) -> Result<(), DeviceError> {
        let bad = |why: String| DeviceError::State {
            section: SECTION,
            why,
        };
        let saved: Saved = serde_json::from_slice(&section.data).map_err(|e| bad(e.to_string()))?;
        let state = saved.queue;
        self.queue = Queue::try_from(state).map_err(|e| bad(format!("its queue: {e}")))?;
        self.rings.set(&self.queue);
        self.regs = saved.regs;
        self.notify_on_start = section.subsection(NOTIFY_SUBSECTION).is_some();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_engine::vmm::{Backing, Gpa};

    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;
    const HEADER: u64 = 0x4000;
    const DATA: u64 = 0x5000;
    const STATUS: u64 = 0x6000;

    fn disk() -> File {
        let path = std::env::temp_dir().join(format!("minivmm-blk-unit-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        f.set_len(64 * 1024).unwrap();
        let _ = std::fs::remove_file(path);
        f
    }

    fn reg(blk: &mut Blk, offset: u64, value: u32) {
        blk.write(offset, &value.to_le_bytes());
    }

    /// The driver's side, as the guest does it: queue 0 set up, and one
    /// GET_ID request made available.
    fn driver(blk: &mut Blk, ram: &GuestRam) {
        for (offset, value) in [(0x70, 1), (0x70, 3), (0x70, 0xb), (0x38, 16)] {
            reg(blk, offset, value);
        }
        for (offset, addr) in [(0x80, DESC), (0x90, AVAIL), (0xa0, USED)] {
            reg(blk, offset, addr as u32);
            reg(blk, offset + 4, 0);
        }
        reg(blk, 0x44, 1);
        reg(blk, 0x70, 0xf);
        ram.store_u64(Gpa(HEADER), u64::from(VIRTIO_BLK_T_GET_ID))
            .unwrap();
        let chain = [
            (HEADER, 16, 1u16, 1u16),
            (DATA, 20, 3, 2),
            (STATUS, 1, 2, 0),
        ];
        for (i, (addr, len, flags, next)) in chain.into_iter().enumerate() {
            let at = DESC + i as u64 * 16;
            ram.store_u64(Gpa(at), addr).unwrap();
            let tail = u64::from(len as u32) | u64::from(flags) << 32 | u64::from(next) << 48;
            ram.store_u64(Gpa(at + 8), tail).unwrap();
        }
        // Ring entry 0 is head 0; the index moves to 1.
        ram.store_u64(Gpa(AVAIL), 1 << 16).unwrap();
    }

    fn used_idx(ram: &GuestRam) -> u64 {
        (ram.load_u64(Gpa(USED)).unwrap() >> 16) & 0xffff
    }

    #[test]
    fn a_notification_waiting_at_the_pause_travels_in_its_subsection_and_is_served_at_start() {
        let ram = Arc::new(GuestRam::new(&[2 << 20], Backing::Anonymous).unwrap());
        let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut source = Blk::new(
            Arc::clone(&ram),
            disk(),
            16,
            Some(kick.try_clone().unwrap()),
        )
        .unwrap();
        driver(&mut source, &ram);
        assert_eq!(source.rings().in_flight(&ram), 1);
        // Nothing waits yet: no subsection.
        assert!(source.save(0).subsections.is_empty());

        // The guest notifies; no I/O thread takes it (it is quiesced).
        reg(&mut source, QUEUE_NOTIFY, 0);
        assert_eq!(used_idx(&ram), 0, "served without an I/O thread");
        assert!(source.notify_pending());
        let section = source.save(3);
        assert_eq!(section.id.instance, 3);
        assert!(section.subsection(NOTIFY_SUBSECTION).is_some());

        // The destination's device (served inline here) takes it as the
        // VM starts, not before.
        let mut destination = Blk::new(Arc::clone(&ram), disk(), 16, None).unwrap();
        destination.restore(&section).unwrap();
        assert_eq!(used_idx(&ram), 0);
        destination.start();
        assert_eq!(used_idx(&ram), 1, "the waiting request was not served");
        let mut id = [0u8; 12];
        ram.memory()
            .read_slice(&mut id, GuestAddress(DATA))
            .unwrap();
        assert_eq!(&id, b"minivmm-disk");
        assert_eq!(destination.rings().in_flight(&ram), 0);
        // Served once: a second start does nothing more.
        destination.start();
        assert!(destination.save(0).subsections.is_empty());
    }
}
