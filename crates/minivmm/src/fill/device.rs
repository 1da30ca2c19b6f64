//! The fill device's frontend in minivmm: the virtio-mmio registers the
//! guest drives, translated into vhost-user requests to the backend
//! process through the `vhost` crate's `Frontend`.
//!
//! The data path does not pass through minivmm: the guest's queue notify
//! reaches the backend's kick eventfd through `KVM_IOEVENTFD`, and the
//! backend writes the buffers and the used ring through its own mapping of
//! the guest's memfds. minivmm steps in to set the ring up when the guest
//! finishes initializing, to stop it when the VM pauses
//! (`GET_VRING_BASE`: the backend finishes what it took and returns where
//! it stopped) and to restart it when the VM runs again, and to move the
//! backend's own state (`SET_DEVICE_STATE_FD`) with the section.

use super::log::Log;
use super::{FillError, DEVICE_ID, SECTION};
use crate::virtio_mmio;
use ferry_engine::vmm::{DirtyPages, GuestRam, Section};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserHeaderFlag,
    VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

/// What the device offers the guest: VERSION_1 only.
const GUEST_FEATURES: u64 = 1 << VIRTIO_F_VERSION_1;
/// The largest queue the guest may ask for.
const MAX_QUEUE: u16 = 256;
/// How long a backend just spawned may take to open its socket.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// The transport's registers that are state: the shared ones, and the
/// one queue's (kept here, since the backend holds the queue itself).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct Registers {
    #[serde(flatten)]
    common: virtio_mmio::Common,
    queue_size: u16,
    queue_ready: bool,
    desc: u64,
    avail: u64,
    used: u64,
}

/// Where the ring is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ring {
    /// The guest has not set it up, or has reset it.
    Inactive,
    /// The backend serves it.
    Running,
    /// Stopped (`GET_VRING_BASE`) at this next available index.
    Stopped(u16),
}

/// The section.
#[derive(Serialize, Deserialize)]
struct Saved {
    regs: Registers,
    /// The next available index the backend stopped at, if the ring ran.
    next_avail: Option<u16>,
    /// The backend's own state, as it saved it.
    backend_state: Vec<u8>,
}

/// The frontend.
pub struct FillDevice {
    ram: Arc<GuestRam>,
    socket: PathBuf,
    /// The backend process, if this VMM started it (and still owns it).
    backend: Option<Child>,
    /// The backend's pid, if this VMM took it over from another (a
    /// same-host upgrade): the last VMM to use a backend ends it.
    adopted: Option<libc::pid_t>,
    frontend: Option<Frontend>,
    kick: EventFd,
    call: EventFd,
    regs: Registers,
    ring: Ring,
    /// Backend state from the source, to load as the ring starts.
    state_to_load: Option<Vec<u8>>,
    log: Option<Log>,
    /// The backend registered guest memory with a userfaultfd for a
    /// postcopy (`POSTCOPY_LISTEN`) that has not ended yet.
    postcopy: bool,
    failed: Option<String>,
    /// Notify writes that exited to a vCPU thread.
    pub notify_exits: u64,
}

impl FillDevice {
    /// A device whose backend listens (or will) on `socket`, `backend` the
    /// process if this VMM started it; the guest's notifications signal
    /// `kick` (an ioeventfd), the backend's completions `call`.
    pub fn new(
        ram: Arc<GuestRam>,
        socket: PathBuf,
        backend: Option<Child>,
        kick: EventFd,
        call: EventFd,
    ) -> Self {
        FillDevice {
            ram,
            socket,
            backend,
            adopted: None,
            frontend: None,
            kick,
            call,
            regs: Registers::default(),
            ring: Ring::Inactive,
            state_to_load: None,
            log: None,
            postcopy: false,
            failed: None,
            notify_exits: 0,
        }
    }

    /// Why the device failed, if it did (its backend died, say). The VM
    /// runs on without it.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Leaves the backend process running when this device goes (a
    /// same-host upgrade: the new VMM reconnects to it).
    pub fn release_backend(&mut self) {
        self.backend = None;
        self.adopted = None;
    }

    fn vhost<E: std::error::Error + Send + Sync + 'static>(
        &self,
        what: &'static str,
    ) -> impl FnOnce(E) -> FillError {
        let socket = self.socket.display().to_string();
        move |source| FillError::Vhost {
            socket,
            what,
            source: Box::new(source),
        }
    }

    fn backend_error(&self, why: String) -> FillError {
        FillError::Backend {
            socket: self.socket.display().to_string(),
            why,
        }
    }

    fn fail(&mut self, e: FillError) -> FillError {
        self.failed = Some(e.to_string());
        self.ring = Ring::Inactive;
        self.frontend = None;
        e
    }

    /// A guest read of register `offset`.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let r = &self.regs;
        let value = r
            .common
            .read(offset, DEVICE_ID, GUEST_FEATURES)
            .unwrap_or(match offset {
                0x034 => u32::from(MAX_QUEUE),
                0x044 => u32::from(r.queue_ready),
                _ => 0,
            });
        virtio_mmio::answer(value, data);
    }

    /// A guest write of register `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let v = virtio_mmio::word(data);
        let r = &mut self.regs;
        if r.common.write(offset, v) {
            return;
        }
        let low = |old: u64| (old & !0xffff_ffff) | u64::from(v);
        let high = |old: u64| (old & 0xffff_ffff) | u64::from(v) << 32;
        match offset {
            0x038 => r.queue_size = (v as u16).min(MAX_QUEUE),
            0x044 => r.queue_ready = v == 1,
            virtio_mmio::QUEUE_NOTIFY => {
                // Only without the ioeventfd (which takes this write in
                // KVM): hand it to the backend the same way.
                self.notify_exits += 1;
                let _ = self.kick.write(1);
            }
            virtio_mmio::STATUS if v == 0 => self.reset(),
            virtio_mmio::STATUS => {
                r.common.status = v;
                if v & 4 != 0 && r.queue_ready && self.ring == Ring::Inactive {
                    if let Err(e) = self.activate(0) {
                        let e = self.fail(e);
                        eprintln!("minivmm: the fill device failed: {e}");
                    }
                }
            }
            0x080 => r.desc = low(r.desc),
            0x084 => r.desc = high(r.desc),
            0x090 => r.avail = low(r.avail),
            0x094 => r.avail = high(r.avail),
            0x0a0 => r.used = low(r.used),
            0x0a4 => r.used = high(r.used),
            _ => {}
        }
    }

    fn reset(&mut self) {
        if self.ring == Ring::Running {
            if let Some(f) = &mut self.frontend {
                let _ = f.get_vring_base(0);
            }
        }
        self.regs = Registers::default();
        self.ring = Ring::Inactive;
    }

    /// Connects to the backend (waiting for a backend just started to
    /// listen), takes it over from any VMM before (`RESET_OWNER`), and
    /// negotiates. For a postcopy destination (`postcopy`), the backend
    /// registers guest memory with a userfaultfd of its own as it maps it,
    /// which this returns, with where the backend mapped each region.
    fn connect(&mut self, postcopy: bool) -> Result<Option<(File, Vec<u64>)>, FillError> {
        let started = Instant::now();
        let mut frontend = loop {
            match Frontend::connect(&self.socket, 1) {
                Ok(f) => break f,
                Err(_) if started.elapsed() < CONNECT_PATIENCE && self.backend_alive() => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(self.vhost("connect")(e)),
            }
        };
        if self.backend.is_none() {
            self.adopted = peer_pid(&frontend);
        }
        frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        frontend.reset_owner().map_err(self.vhost("RESET_OWNER"))?;
        frontend.set_owner().map_err(self.vhost("SET_OWNER"))?;
        let offered = frontend
            .get_features()
            .map_err(self.vhost("GET_FEATURES"))?;
        let mut need = VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::DEVICE_STATE;
        if postcopy {
            need |= VhostUserProtocolFeatures::PAGEFAULT;
        }
        let protocol = frontend
            .get_protocol_features()
            .map_err(self.vhost("GET_PROTOCOL_FEATURES"))?;
        if !protocol.contains(need) {
            return Err(self.backend_error(format!(
                "it offers protocol features {protocol:?}, and minivmm needs {need:?} \
                 (acknowledged requests, a shared-memory dirty log, device state)"
            )));
        }
        frontend
            .set_protocol_features(need)
            .map_err(self.vhost("SET_PROTOCOL_FEATURES"))?;
        let want = GUEST_FEATURES | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if offered & want != want || offered & VhostUserVirtioFeatures::LOG_ALL.bits() == 0 {
            return Err(self.backend_error(format!(
                "it offers features {offered:#x}: minivmm needs VERSION_1, \
                 PROTOCOL_FEATURES and LOG_ALL"
            )));
        }
        self.frontend = Some(frontend);
        self.set_features()?;
        let uffd = match postcopy {
            true => {
                let advise = self.vhost("POSTCOPY_ADVISE");
                let uffd = self.frontend()?.postcopy_advise().map_err(advise)?;
                let listen = self.vhost("POSTCOPY_LISTEN");
                self.frontend()?.postcopy_listen().map_err(listen)?;
                self.postcopy = true;
                Some(uffd)
            }
            false => None,
        };
        let regions = self.memory_table()?;
        let bases = self
            .frontend()?
            .set_mem_table(&regions)
            .map_err(self.vhost("SET_MEM_TABLE"))?;
        // A new memory table drops the backend's log: set it again.
        if let Some(region) = self.log.as_ref().map(Log::region) {
            self.frontend()?
                .set_log_base(0, Some(region))
                .map_err(self.vhost("SET_LOG_BASE"))?;
        }
        let Some(uffd) = uffd else {
            return Ok(None);
        };
        let bases = bases.filter(|b| b.len() == regions.len()).ok_or_else(|| {
            self.backend_error("it did not say where it mapped guest memory".into())
        })?;
        let ack = self.vhost("POSTCOPY_ACK_MEM_REGIONS");
        self.frontend()?
            .postcopy_ack_mem_regions(vhost::vhost_user::message::FrontendReq::SET_MEM_TABLE)
            .map_err(ack)?;
        Ok(Some((uffd, bases)))
    }

    /// On a postcopy destination, before the VM starts: connects to the
    /// backend so that it maps guest memory with a userfaultfd of its own,
    /// and returns that fd with where the backend mapped each region, for
    /// the engine to serve.
    pub fn postcopy_userfaultfd(
        &mut self,
    ) -> Result<ferry_engine::vmm::DeviceUserfaultfd, FillError> {
        let (uffd, bases) = self
            .connect(true)?
            .ok_or_else(|| self.backend_error("no userfaultfd came".into()))?;
        let page = ferry_engine::vmm::PAGE_SIZE as u64;
        let regions = self
            .ram
            .memory()
            .iter()
            .zip(bases)
            .map(|(region, host)| ferry_engine::vmm::DeviceRegion {
                first: ferry_engine::vmm::Gfn(region.start_addr().0 / page),
                pages: region.len() / page,
                host,
            })
            .collect();
        Ok(ferry_engine::vmm::DeviceUserfaultfd {
            name: "vhost-user fill device".into(),
            fd: uffd.into(),
            regions,
        })
    }

    /// Every page is in: the backend drops its userfaultfd
    /// (`POSTCOPY_END`).
    pub fn end_postcopy(&mut self) {
        if std::mem::take(&mut self.postcopy) {
            let end = self.vhost("POSTCOPY_END");
            if let Err(e) = self.frontend().and_then(|f| f.postcopy_end().map_err(end)) {
                eprintln!("minivmm: ending the fill backend's postcopy: {e}");
            }
        }
    }

    fn frontend(&mut self) -> Result<&mut Frontend, FillError> {
        let e = self.backend_error("not connected".into());
        self.frontend.as_mut().ok_or(e)
    }

    fn set_features(&mut self) -> Result<(), FillError> {
        let mut features = GUEST_FEATURES | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if self.log.is_some() {
            features |= VhostUserVirtioFeatures::LOG_ALL.bits();
        }
        self.frontend()?
            .set_features(features)
            .map_err(self.vhost("SET_FEATURES"))
    }

    /// Every region of guest memory, as the backend maps it: by its memfd.
    fn memory_table(&self) -> Result<Vec<VhostUserMemoryRegionInfo>, FillError> {
        self.ram
            .memory()
            .iter()
            .map(|region| {
                let file = region.file_offset().ok_or_else(|| {
                    FillError::Memory("a region is anonymous memory: use --backing memfd".into())
                })?;
                Ok(VhostUserMemoryRegionInfo {
                    guest_phys_addr: region.start_addr().0,
                    memory_size: region.len(),
                    userspace_addr: region.as_ptr() as u64,
                    mmap_offset: file.start(),
                    mmap_handle: file.file().as_raw_fd(),
                })
            })
            .collect()
    }

    /// The host address the backend knows guest address `gpa` by.
    fn host_address(&self, gpa: u64) -> Result<u64, FillError> {
        self.ram
            .memory()
            .get_host_address(GuestAddress(gpa))
            .map(|p| p as u64)
            .map_err(|e| FillError::Memory(format!("the ring at {gpa:#x}: {e}")))
    }

    /// Connects if needed, loads state from the source if any, and starts
    /// the ring at `next_avail`.
    fn activate(&mut self, next_avail: u16) -> Result<(), FillError> {
        if self.frontend.is_none() {
            self.connect(false)?;
        }
        if let Some(state) = self.state_to_load.take() {
            self.transfer_state(VhostTransferStateDirection::LOAD, Some(state))?;
        }
        let r = self.regs;
        let config = VringConfigData {
            queue_max_size: MAX_QUEUE,
            queue_size: r.queue_size,
            flags: 0,
            desc_table_addr: self.host_address(r.desc)?,
            used_ring_addr: self.host_address(r.used)?,
            avail_ring_addr: self.host_address(r.avail)?,
            log_addr: None,
        };
        let (kick, call) = (
            self.kick
                .try_clone()
                .map_err(|e| self.backend_error(e.to_string()))?,
            self.call
                .try_clone()
                .map_err(|e| self.backend_error(e.to_string()))?,
        );
        let f = self.frontend()?;
        f.set_vring_num(0, r.queue_size)
            .and_then(|()| f.set_vring_addr(0, &config))
            .and_then(|()| f.set_vring_base(0, next_avail))
            .and_then(|()| f.set_vring_call(0, &call))
            .and_then(|()| f.set_vring_kick(0, &kick))
            .and_then(|()| f.set_vring_enable(0, true))
            .map_err(self.vhost("starting the ring"))?;
        self.ring = Ring::Running;
        // Whatever the guest made available while the ring was stopped.
        let _ = self.kick.write(1);
        Ok(())
    }

    /// Moves the backend's state: out (`SAVE`, returned) or in (`LOAD`).
    fn transfer_state(
        &mut self,
        direction: VhostTransferStateDirection,
        load: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, FillError> {
        let (read, write) = pipe().map_err(|e| self.backend_error(format!("a pipe: {e}")))?;
        let (ours, theirs) = match direction {
            VhostTransferStateDirection::SAVE => (read, write),
            _ => (write, read),
        };
        self.frontend()?
            .set_device_state_fd(direction, VhostTransferStatePhase::STOPPED, theirs)
            .map_err(self.vhost("SET_DEVICE_STATE_FD"))?;
        let mut file = File::from(ours);
        let mut state = Vec::new();
        let moved = match load {
            Some(bytes) => file.write_all(&bytes),
            None => file.read_to_end(&mut state).map(|_| ()),
        };
        drop(file);
        moved.map_err(|e| self.backend_error(format!("moving its state: {e}")))?;
        self.frontend()?
            .check_device_state()
            .map_err(self.vhost("CHECK_DEVICE_STATE"))?;
        Ok(state)
    }

    /// The VM paused: the backend stops the ring once it has finished the
    /// buffers it took, and says where it stopped.
    pub fn pause(&mut self) -> Result<(), FillError> {
        if self.ring != Ring::Running {
            return Ok(());
        }
        let stop = self.vhost("GET_VRING_BASE");
        match self
            .frontend()
            .and_then(|f| f.get_vring_base(0).map_err(stop))
        {
            Ok(base) => {
                self.ring = Ring::Stopped(base as u16);
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The VM runs again: the ring restarts where it stopped.
    pub fn start(&mut self) -> Result<(), FillError> {
        match self.ring {
            Ring::Stopped(base) if self.failed.is_none() => {
                self.activate(base).map_err(|e| self.fail(e))
            }
            _ => Ok(()),
        }
    }

    /// The section, saved while the VM is paused (the ring stopped).
    ///
    /// Then this VMM lets go of the backend: it serves one VMM at a time,
    /// and on a same-host upgrade the next one connects to it now. If the
    /// VM runs here again, [`FillDevice::start`] connects anew.
    pub fn save(&mut self) -> Result<Section, FillError> {
        let (next_avail, backend_state) = match (self.ring, &self.state_to_load) {
            // Restored and not started since: the state is still the
            // source's, not yet in a backend.
            (Ring::Stopped(base), Some(state)) => (Some(base), state.clone()),
            (Ring::Stopped(base), None) => (
                Some(base),
                self.transfer_state(VhostTransferStateDirection::SAVE, None)?,
            ),
            _ => (None, Vec::new()),
        };
        self.frontend = None;
        let saved = Saved {
            regs: self.regs,
            next_avail,
            backend_state,
        };
        let data = serde_json::to_vec(&saved).expect("plain data serializes");
        Ok(Section::new(SECTION, data))
    }

    /// Loads what [`FillDevice::save`] wrote; the ring starts with the VM.
    pub fn restore(&mut self, section: &Section) -> Result<(), crate::DeviceError> {
        let saved: Saved =
            serde_json::from_slice(&section.data).map_err(|e| crate::DeviceError::State {
                section: SECTION,
                why: e.to_string(),
            })?;
        self.regs = saved.regs;
        self.ring = match saved.next_avail {
            Some(base) => {
                self.state_to_load = Some(saved.backend_state);
                Ring::Stopped(base)
            }
            None => Ring::Inactive,
        };
        Ok(())
    }

    /// Whether the backend process (if this VMM started it) still runs,
    /// and its connection (if any) is up.
    fn backend_alive(&mut self) -> bool {
        if let Some(child) = &mut self.backend {
            if !matches!(child.try_wait(), Ok(None)) {
                return false;
            }
        }
        match &self.frontend {
            Some(f) => {
                let mut fd = libc::pollfd {
                    fd: f.as_raw_fd(),
                    events: libc::POLLRDHUP,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, a zero timeout.
                let n = unsafe { libc::poll(&mut fd, 1, 0) };
                n == 0 || fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) == 0
            }
            None => true,
        }
    }

    /// Dirty logging starts: a fresh log, shared with the backend.
    pub fn start_log(&mut self) -> Result<(), FillError> {
        let top = self
            .ram
            .memory()
            .iter()
            .map(|r| r.start_addr().0 + r.len())
            .max()
            .unwrap_or(0);
        self.log = Some(Log::new(top)?);
        if self.frontend.is_some() {
            let region = self.log.as_ref().map(Log::region).expect("just made");
            self.frontend()?
                .set_log_base(0, Some(region))
                .map_err(self.vhost("SET_LOG_BASE"))?;
            self.set_features()?;
        }
        Ok(())
    }

    /// Moves the pages the backend wrote into `into`; fails if the backend
    /// is gone, since its next writes would go unseen.
    pub fn collect_log(&mut self, into: &mut DirtyPages) -> Result<(), FillError> {
        if let Some(log) = &self.log {
            log.take(into);
        }
        if let Some(why) = &self.failed {
            return Err(self.backend_error(why.clone()));
        }
        if !self.backend_alive() {
            let e = self.backend_error("the backend is gone (its process or its socket)".into());
            return Err(self.fail(e));
        }
        Ok(())
    }

    /// Dirty logging stops. The backend keeps marking pages in its mapping
    /// of the log, which stays valid; this side forgets it at the next
    /// start.
    pub fn stop_log(&mut self) {
        if self.log.is_some() && self.frontend.is_some() {
            let log = self.log.take();
            let _ = self.set_features();
            self.log = log;
        }
    }

    /// The socket the backend listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for FillDevice {
    fn drop(&mut self) {
        if let Some(mut child) = self.backend.take() {
            let _ = child.kill();
            let _ = child.wait();
        } else if let Some(pid) = self.adopted.take() {
            // The pid is the one the kernel gave as the socket's peer.
            // SAFETY: kill(2) has no memory effects; a gone pid is ESRCH.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
}

/// The pid of the process at the other end of the vhost-user socket.
fn peer_pid(frontend: &Frontend) -> Option<libc::pid_t> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SO_PEERCRED on the frontend's own socket fd.
    // SAFETY: getsockopt fills at most `len` bytes of the ucred given.
    let r = unsafe {
        libc::getsockopt(
            frontend.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid)
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: a two-int array for pipe2 to fill; the result is checked.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: two fresh fds that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
