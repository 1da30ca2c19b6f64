//! What a program that is the guest's init must do itself: mount the
//! kernel's file systems, and power the guest off at the end (init may
//! not exit).

/// Mounts /proc, /sys and /dev, where they are not mounted already.
pub fn mount_basics() {
    for (fs, at) in [("proc", "/proc"), ("sysfs", "/sys"), ("devtmpfs", "/dev")] {
        let _ = std::fs::create_dir_all(at);
        let fs_c = std::ffi::CString::new(fs).expect("no NUL");
        let at_c = std::ffi::CString::new(at).expect("no NUL");
        // SAFETY: both strings are valid NUL-terminated C strings that
        // live across the call; no data argument is passed.
        unsafe {
            libc::mount(
                fs_c.as_ptr(),
                at_c.as_ptr(),
                fs_c.as_ptr(),
                0,
                std::ptr::null(),
            );
        }
    }
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Panics the kernel through sysrq (`c`), as an operator's fault
/// injection would; returns only if the kernel lacks sysrq or /proc.
pub fn crash_kernel() {
    let _ = std::fs::write("/proc/sysrq-trigger", b"c");
}

/// Syncs and powers the guest off; does not return.
pub fn power_off() -> ! {
    // SAFETY: sync and reboot take no pointers; as PID 1 with
    // CAP_SYS_BOOT, reboot(POWER_OFF) stops the machine.
    unsafe {
        libc::sync();
        libc::reboot(libc::LINUX_REBOOT_CMD_POWER_OFF);
    }
    loop {
        std::thread::park();
    }
}
