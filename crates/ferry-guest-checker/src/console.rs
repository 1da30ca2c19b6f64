//! The checker's console: the lines it prints, and the "moved" line a VMM
//! types into it.
//!
//! Both share one serial port, so a line must reach the tty whole: the
//! kernel may send the VMM's input (echoed) or its own messages between
//! two writes, and a line cut that way fails its checksum at the host.

use std::io::Write;

/// Prints `text` and its newline in one write; a console that fails is no
/// reason to stop checking (and init may not exit).
pub fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("{text}\n").as_bytes());
    let _ = out.flush();
}

/// Stops the console echoing what is typed into it, where stdin is a
/// terminal: the tty would otherwise print the VMM's "moved" line back,
/// possibly in the middle of one of the checker's lines.
pub fn stop_echo() {
    // SAFETY: `termios` is plain data that tcgetattr fills in before it is
    // read; fd 0 outlives both calls, and a non-terminal fd only makes
    // tcgetattr fail, which is checked.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(0, &mut t) != 0 {
            return;
        }
        t.c_lflag &= !(libc::ECHO | libc::ECHONL);
        libc::tcsetattr(0, libc::TCSANOW, &t);
    }
}
