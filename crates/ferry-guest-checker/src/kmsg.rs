//! The kernel log worker: reads /dev/kmsg from its first record on, and
//! passes every warning ([`ferry_guest_checker::warnings`]) to the main
//! loop, which prints it on the console.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ferry_guest_checker::warnings::is_warning;

/// A warning, and whether the kernel logged it before the checker
/// started (while it booted).
pub struct Warning {
    pub text: String,
    pub at_boot: bool,
}

/// CLOCK_MONOTONIC in microseconds: the kernel log's timestamps count
/// from the same boot.
pub fn now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// Runs until `stop`, appending warnings to `found`; those logged before
/// `start_us` are the boot's.
pub fn run(found: &Mutex<Vec<Warning>>, start_us: u64, stop: &AtomicBool) {
    use std::os::unix::fs::OpenOptionsExt;
    let kmsg = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg");
    let mut kmsg = match kmsg {
        Ok(f) => f,
        Err(e) => {
            eprintln!("checker: no kernel log: /dev/kmsg: {e}");
            return;
        }
    };
    let mut buf = vec![0u8; 8192];
    while !stop.load(Ordering::Relaxed) {
        match kmsg.read(&mut buf) {
            // One record a read: "prio,seq,usec,flags;text\n" and
            // continuation lines.
            Ok(n) if n > 0 => {
                let record = String::from_utf8_lossy(&buf[..n]);
                let (head, text) = record.split_once(';').unwrap_or(("", ""));
                let text = text.lines().next().unwrap_or("");
                let usec: u64 = head
                    .split(',')
                    .nth(2)
                    .and_then(|u| u.parse().ok())
                    .unwrap_or(0);
                if is_warning(text) {
                    found
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Warning {
                            text: text.to_string(),
                            at_boot: usec < start_us,
                        });
                }
            }
            // Records overwritten before we read them (EPIPE) are gone;
            // reading goes on from the oldest left.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}
