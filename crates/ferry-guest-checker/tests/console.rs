//! The checker on a terminal, as it runs on a guest's serial console: a
//! VMM types "moved" into it, and every line it prints must still reach
//! the host whole. A terminal echoes what is typed by default, and the
//! echo once landed inside a checker line in a Linux guest's move (the
//! line failed its checksum, and the run failed as "1 lost, 1 bad").

use ferry_guest_checker::line::{Line, DONE_PREFIX};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A pseudo-terminal: the host's end, and the path of the guest's end.
fn open_pty() -> (File, String) {
    // SAFETY: posix_openpt returns a new fd or -1, checked; the fd is
    // owned by the File from here on.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(
        master >= 0,
        "posix_openpt: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `master` is a valid pty master fd, owned by nothing else.
    let file = unsafe { File::from_raw_fd(master) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: `master` is a pty master; `name` is a writable buffer of the
    // length passed, which ptsname_r NUL-terminates.
    unsafe {
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        assert_eq!(libc::ptsname_r(master, name.as_mut_ptr(), name.len()), 0);
    }
    // SAFETY: ptsname_r succeeded, so `name` holds a NUL-terminated string.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    (file, path.to_string_lossy().into_owned())
}

#[test]
fn what_the_vmm_types_is_not_echoed_into_the_checkers_lines() {
    let (mut master, slave_path) = open_pty();
    let slave = File::options()
        .read(true)
        .write(true)
        .open(&slave_path)
        .expect("open the pty's guest end");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry-guest-checker"))
        .env("CHECKER_MIB", "1")
        .env("CHECKER_AFTER_MOVE", "1")
        .env("CHECKER_DISK", "/nonexistent")
        .stdin(slave.try_clone().expect("dup"))
        .stdout(slave)
        .stderr(Stdio::null())
        .spawn()
        .expect("start the checker");

    let out = Arc::new(Mutex::new(String::new()));
    let reader = {
        let (out, mut master) = (Arc::clone(&out), master.try_clone().expect("dup"));
        // Ends with EIO once the checker, the guest end's last holder, exits.
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = master.read(&mut buf) {
                out.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let text = || out.lock().unwrap().clone();
    let wait_for = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !text().contains(what) {
            assert!(Instant::now() < deadline, "no {what:?} in:\n{}", text());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("checker 1 ");
    master.write_all(b"moved\n").expect("type into the console");
    wait_for(DONE_PREFIX);
    let status = child.wait().expect("the checker ends");
    reader.join().expect("reader");
    let text = text();

    assert!(status.success(), "the checker failed: {status}\n{text}");
    assert!(
        text.contains("checker moved:"),
        "the checker did not read the line typed in:\n{text}"
    );
    for line in text.lines() {
        assert!(
            !line.contains("moved") || line.starts_with("checker moved:"),
            "the typed line came back on the console: {line:?}\n{text}"
        );
        if let Some(parsed) = Line::parse(line.strip_prefix(DONE_PREFIX).unwrap_or(line)) {
            parsed.unwrap_or_else(|e| panic!("a checker line reached the host cut: {e}\n{text}"));
        }
    }
}
