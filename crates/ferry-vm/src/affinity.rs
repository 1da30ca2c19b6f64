//! Pinning threads to host CPUs.
//!
//! A postcopy fault round trip is a vCPU thread going to sleep and the
//! handler thread that places its page waking it. On this project's nested
//! hosts a wake-up that has to bring an idle CPU back costs more than the
//! page copy; with the vCPU and its handler on one CPU, the sleep hands the
//! CPU straight to the handler and back. The demand-paging bench measures
//! both ways.

use std::io;

/// Restricts pthread `thread` to host CPU `cpu`.
pub fn pin_thread(thread: libc::pthread_t, cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked), so the bit is inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `thread` is a live pthread of this process (the caller holds
    // its handle, or it is the calling thread) and `set` is a valid
    // cpu_set_t of the size given.
    let r = unsafe {
        libc::pthread_setaffinity_np(thread, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// Restricts the calling thread to host CPU `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: pthread_self has no preconditions.
    pin_thread(unsafe { libc::pthread_self() }, cpu)
}
