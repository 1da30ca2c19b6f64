//! Processes ferry starts (the demo's destination, the link bench's demos)
//! die with the process that started them, even if it is killed with
//! SIGKILL: no destination is left listening after its demo is gone.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes the child started by `cmd` receive SIGKILL when this process dies.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: getpid is async-signal-safe and touches no memory.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and only calls
    // prctl, pthread_sigmask (with sigemptyset/sigaddset), getppid and _exit,
    // which are async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // What the child runs gets SIGINT and SIGTERM as usual (this
            // process waits for them on one thread, blocked everywhere).
            crate::signals::unblock();
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}
