//! SIGINT and SIGTERM: a migration is cancelled cleanly instead of the
//! process dying in the middle of it.
//!
//! ```text
//!   main, before any thread      block SIGINT and SIGTERM (every thread inherits it)
//!   one thread, sigwait          1st signal: run what the command registered
//!                                  (cancel the migration, stop the VM, ...),
//!                                  and exit anyway (130) if that has not
//!                                  ended the process within the grace;
//!                                  nothing registered: exit now (status 130)
//!                                2nd signal: exit now (status 130)
//!   children (pre-exec)          the signals unblocked again, as they were
//! ```
//!
//! A signal handler may only do async-signal-safe work; a thread that waits
//! for the signal may do anything, such as cancel a migration and let the
//! engine roll back, tell the destination, and print the summary.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// What the command does on the first signal.
type OnStop = Box<dyn Fn() + Send>;

static ON_STOP: Mutex<Option<OnStop>> = Mutex::new(None);
/// The first signal received (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// How long a clean stop may take before the process exits anyway: a vCPU
/// that never leaves KVM_RUN (a host that wedged it) must not keep ferry
/// alive. The command's stall timeout ([`exit_within`]); 10 s, its
/// default, until a command sets it.
static GRACE_MS: AtomicU64 = AtomicU64::new(10_000);

/// A clean stop that takes longer than `grace` ends with exit status 130
/// and a line saying so.
pub fn exit_within(grace: Duration) {
    GRACE_MS.store(grace.as_millis() as u64, Ordering::SeqCst);
}

/// Starts the watchdog of a clean stop.
fn exit_after(grace: Duration, sig: i32) {
    let watchdog = move || {
        std::thread::sleep(grace);
        eprintln!(
            "ferry: {}: not stopped cleanly within {} s (a vCPU or a peer did not answer): exiting now",
            name(sig),
            grace.as_secs()
        );
        std::process::exit(130);
    };
    if std::thread::Builder::new()
        .name("stop-watchdog".into())
        .spawn(watchdog)
        .is_err()
    {
        std::process::exit(130);
    }
}

fn stop_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
    }
    set
}

/// Blocks SIGINT and SIGTERM in this thread (call from `main` before any
/// thread starts) and starts the thread that waits for them.
pub fn install() {
    let set = stop_set();
    // SAFETY: pthread_sigmask reads `set`, a valid sigset_t, and changes
    // only this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig = 0;
            // SAFETY: sigwait reads `set` and writes the signal number into
            // `sig`, both valid for the call.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            if RECEIVED
                .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                eprintln!("ferry: {} again: exiting now", name(sig));
                std::process::exit(130);
            }
            let on_stop = ON_STOP.lock().unwrap_or_else(|p| p.into_inner());
            match on_stop.as_ref() {
                Some(f) => {
                    let grace = Duration::from_millis(GRACE_MS.load(Ordering::SeqCst));
                    eprintln!(
                        "ferry: {}: stopping cleanly (send it again to exit at once; \
                         exiting anyway in {} s)",
                        name(sig),
                        grace.as_secs()
                    );
                    exit_after(grace, sig);
                    f();
                }
                None => std::process::exit(130),
            }
        });
    if spawned.is_err() {
        // Without the waiting thread, the signals must act as they did.
        unblock();
    }
}

/// Unblocks SIGINT and SIGTERM in this thread. Async-signal-safe: a child
/// calls it between fork and exec, so that what it runs gets them as usual.
pub fn unblock() {
    let set = stop_set();
    // SAFETY: as in `install`; sigemptyset, sigaddset and pthread_sigmask
    // are async-signal-safe and touch only this frame and the thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
}

/// Sets what the first signal does from now on.
pub fn on_stop(f: impl Fn() + Send + 'static) {
    *ON_STOP.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
}

/// The signal that asked this process to stop, if one did: "SIGINT" or
/// "SIGTERM".
pub fn received() -> Option<&'static str> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(name(sig)),
    }
}

fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}
