//! The fill device's backend: a process of its own, built on rust-vmm's
//! `vhost-user-backend`, serving one virtqueue over a vhost-user socket.
//! For each buffer the guest posts it writes the next sequence number and
//! its check ([`super::check`]) at the start, and the number's low byte
//! over the rest; the guest checks each buffer's number comes exactly once
//! and in order.
//!
//! It writes guest memory through its own mapping of the VMM's memfd, so
//! KVM's dirty log never sees those writes: they reach a migration only
//! through the vhost-user dirty log (`VHOST_USER_SET_LOG_BASE` with
//! `LOG_SHMFD`), which vhost-user-backend keeps for it once its memory's
//! bitmap is `BitmapMmapRegion`.
//!
//! On a postcopy destination it takes part (vhost-user-backend's
//! `postcopy` feature): `POSTCOPY_ADVISE` makes it a userfaultfd, `LISTEN`
//! has it register guest memory there as it maps it, and the VMM serves
//! its faults until `POSTCOPY_END`.
//!
//! Its state is the next sequence number, saved and loaded through
//! `VHOST_USER_SET_DEVICE_STATE_FD`. It serves one VMM at a time and takes
//! the next connection when one ends, so a VMM upgraded on the same host
//! reconnects and finds the same device; with no VMM connected for
//! [`IDLE_EXIT`], it exits.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost::vhost_user::Listener;
use vhost_user_backend::bitmap::BitmapMmapRegion;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

/// How long the backend waits for a VMM once the last one has gone.
pub const IDLE_EXIT: Duration = Duration::from_secs(20);
/// How long it takes over each buffer, as a device that does real work
/// would: so buffers are in flight when the VM pauses, and the pause must
/// stop the backend (`GET_VRING_BASE`) for guest memory to stay still.
pub const FILL_TIME: Duration = Duration::from_millis(2);

type Memory = GuestMemoryAtomic<GuestMemoryMmap<BitmapMmapRegion>>;

/// Errors running the backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The socket.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// Where.
        path: String,
        /// Why.
        source: vhost::vhost_user::Error,
    },
    /// vhost-user-backend's daemon.
    #[error("the vhost-user daemon: {0}")]
    Daemon(String),
}

/// The device.
struct Fill {
    memory: Mutex<Option<Memory>>,
    next: AtomicU64,
    /// A load of saved state in progress (its reader thread).
    loading: Mutex<Option<std::thread::JoinHandle<io::Result<u64>>>>,
    /// Held while buffers taken from the ring are being filled: the stop
    /// of the ring waits for it.
    serving: Mutex<()>,
}

impl Fill {
    fn fill(&self, vring: &VringRwLock<Memory>) -> io::Result<()> {
        let memory = self
            .memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| io::Error::other("a kick before any memory table"))?;
        let mem = memory.memory();
        let _serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        // A ring being stopped (GET_VRING_BASE) gives no more buffers.
        while vring.get_ref().get_queue().ready() {
            let chains: Vec<_> = vring
                .get_mut()
                .get_queue_mut()
                .iter(&*mem)
                .map_err(io::Error::other)?
                .collect();
            if chains.is_empty() {
                break;
            }
            for chain in chains {
                let head = chain.head_index();
                std::thread::sleep(FILL_TIME);
                let seq = self.next.fetch_add(1, Ordering::SeqCst);
                let mut written = 0u32;
                for desc in chain.clone().filter(|d| d.is_write_only()) {
                    let mut buf = vec![seq as u8; desc.len() as usize];
                    if buf.len() >= 16 {
                        buf[..8].copy_from_slice(&seq.to_le_bytes());
                        buf[8..16].copy_from_slice(&super::check(seq).to_le_bytes());
                    }
                    mem.write_slice(&buf, desc.addr())
                        .map_err(io::Error::other)?;
                    written += desc.len();
                }
                vring.add_used(head, written).map_err(io::Error::other)?;
            }
        }
        vring.signal_used_queue()
    }
}

impl VhostUserBackend for Fill {
    type Bitmap = BitmapMmapRegion;
    type Vring = VringRwLock<Memory>;

    fn num_queues(&self) -> usize {
        1
    }
    fn max_queue_size(&self) -> usize {
        256
    }
    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }
    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::DEVICE_STATE
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::PAGEFAULT
    }
    fn set_event_idx(&self, _enabled: bool) {}
    /// `GET_VRING_BASE`: the ring is already marked not ready, so no
    /// further buffer is taken; this waits until those taken are filled
    /// and used, so nothing is written once the VMM has the reply.
    fn stop_vring(&self, _queue_index: u32) -> io::Result<()> {
        drop(self.serving.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(())
    }
    fn update_memory(&self, memory: Memory) -> io::Result<()> {
        *self.memory.lock().unwrap_or_else(|e| e.into_inner()) = Some(memory);
        Ok(())
    }
    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock<Memory>],
        _thread_id: usize,
    ) -> io::Result<()> {
        match (device_event, vrings.first()) {
            (0, Some(vring)) => self.fill(vring),
            _ => Ok(()),
        }
    }
    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        match direction {
            VhostTransferStateDirection::SAVE => {
                // Eight bytes fit in any pipe: the write cannot block.
                let mut file = file;
                file.write_all(&self.next.load(Ordering::SeqCst).to_le_bytes())?;
                Ok(None)
            }
            VhostTransferStateDirection::LOAD => {
                let reader = std::thread::spawn(move || {
                    let mut file = file;
                    let mut bytes = Vec::new();
                    file.read_to_end(&mut bytes)?;
                    let next: [u8; 8] = bytes.try_into().map_err(|b: Vec<u8>| {
                        io::Error::other(format!("{} bytes of state, not 8", b.len()))
                    })?;
                    Ok(u64::from_le_bytes(next))
                });
                *self.loading.lock().unwrap_or_else(|e| e.into_inner()) = Some(reader);
                Ok(None)
            }
        }
    }
    fn check_device_state(&self) -> io::Result<()> {
        let reader = self
            .loading
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(reader) = reader {
            let next = reader
                .join()
                .map_err(|_| io::Error::other("the state reader panicked"))??;
            self.next.store(next, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// Serves the fill device on `socket` until no VMM has been connected for
/// [`IDLE_EXIT`].
pub fn run(socket: &Path) -> Result<(), BackendError> {
    let memory: Memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let fill = Arc::new(Fill {
        memory: Mutex::new(None),
        next: AtomicU64::new(0),
        loading: Mutex::new(None),
        serving: Mutex::new(()),
    });
    let mut daemon = VhostUserDaemon::new("minivmm-fill".into(), fill, memory)
        .map_err(|e| BackendError::Daemon(format!("{e:?}")))?;
    let mut listener = Listener::new(socket, true).map_err(|source| BackendError::Listen {
        path: socket.display().to_string(),
        source,
    })?;
    let connected = Arc::new(AtomicBool::new(false));
    let idle_since = Arc::new(Mutex::new(Instant::now()));
    {
        let (connected, idle_since) = (Arc::clone(&connected), Arc::clone(&idle_since));
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            let idle = *idle_since.lock().unwrap_or_else(|e| e.into_inner());
            if !connected.load(Ordering::Acquire) && idle.elapsed() > IDLE_EXIT {
                eprintln!("minivmm-vhost: no VMM for {IDLE_EXIT:?}; exiting");
                std::process::exit(0);
            }
        });
    }
    loop {
        daemon
            .start(&mut listener)
            .map_err(|e| BackendError::Daemon(format!("{e:?}")))?;
        connected.store(true, Ordering::Release);
        if let Err(e) = daemon.wait() {
            eprintln!("minivmm-vhost: the VMM's connection ended: {e:?}");
        }
        *idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        connected.store(false, Ordering::Release);
    }
}
