//! The fill device: a virtio device whose work happens in another process,
//! as a vhost-user-blk, -net or -fs device's does in Cloud Hypervisor and
//! QEMU.
//!
//! ```text
//!   guest (vCPU 0)  ── virtio-mmio registers ──▶  minivmm: FillDevice (device.rs)
//!        │                                           │ vhost-user socket (the vhost crate's Frontend)
//!        │ queue notify ── KVM_IOEVENTFD ──▶ kick ──▶ minivmm-vhost (backend.rs, vhost-user-backend)
//!        ◀── buffers filled, used ring ──── writes guest memory through the memfd it mapped
//!                                              and marks each page in the vhost-user dirty log (log.rs),
//!                                              which the engine reads as a dirty source (dirty_source.rs)
//! ```
//!
//! The guest posts buffers; the backend fills each with the next sequence
//! number and its check; the guest checks every number comes once, in
//! order, across migrations.

pub mod backend;
pub mod device;
pub mod dirty_source;
pub mod log;

/// The section's name.
pub const SECTION: &str = "vhost-fill";
/// The layout [`device::FillDevice::save`] writes.
pub const VERSION: u32 = 1;
/// virtio device id 4: an entropy source, which fills the guest's buffers.
pub const DEVICE_ID: u32 = 4;
/// Which virtio-mmio slot the device's registers take (after the disks').
pub const MMIO_INDEX: u32 = crate::layout::MAX_VCPUS;

/// What a buffer carries after its sequence number.
pub fn check(seq: u64) -> u64 {
    seq.wrapping_mul(crate::layout::CHECK_MUL) ^ 0xf111
}

/// Errors of the fill device.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// A vhost-user request to the backend.
    #[error("vhost-user backend at {socket}: {what} failed: {source}")]
    Vhost {
        /// The backend's socket.
        socket: String,
        /// What was asked.
        what: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The backend process.
    #[error("vhost-user backend at {socket}: {why}")]
    Backend {
        /// The backend's socket.
        socket: String,
        /// What happened.
        why: String,
    },
    /// Guest memory cannot be shared with the backend.
    #[error("the fill device needs guest memory in memfds it can map: {0}")]
    Memory(String),
}

/// Starts a backend process on a fresh socket and returns both. The
/// program: `$MINIVMM_VHOST` if set, else `minivmm-vhost` beside this
/// executable, else this executable's `vhost-backend` command.
pub fn spawn_backend() -> Result<(std::path::PathBuf, std::process::Child), FillError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let socket = std::env::temp_dir().join(format!(
        "minivmm-vhost-{}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&socket);
    let here = std::env::current_exe().map_err(|e| FillError::Backend {
        socket: socket.display().to_string(),
        why: format!("cannot find this executable: {e}"),
    })?;
    let beside = here.with_file_name("minivmm-vhost");
    let mut command = match std::env::var_os("MINIVMM_VHOST") {
        Some(program) => std::process::Command::new(program),
        None if beside.exists() => std::process::Command::new(beside),
        None => {
            let mut c = std::process::Command::new(here);
            c.arg("vhost-backend");
            c
        }
    };
    // Its stdout is not the VMM's: a backend that outlives this process
    // (a same-host upgrade) must not hold this process's stdout open.
    let child = command
        .arg("--socket")
        .arg(&socket)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| FillError::Backend {
            socket: socket.display().to_string(),
            why: format!("cannot start the backend process: {e}"),
        })?;
    Ok((socket, child))
}
