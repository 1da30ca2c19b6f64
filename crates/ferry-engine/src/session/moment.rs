//! A moment on two clocks: the wall's and the calling thread's CPU time.
//! The switchover's steps report both, so that a step's own work can be
//! told from the time its thread waited: for a peer, or for a CPU on a
//! crowded host (inside the SVM host, one CPU serves both ends, the
//! guest's vCPUs and the kernel's network).

use crate::summary::ms;
use std::time::{Duration, Instant};

/// When a step began, on both clocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Moment {
    wall: Instant,
    cpu: Duration,
}

impl Moment {
    pub(crate) fn now() -> Moment {
        Moment {
            wall: Instant::now(),
            cpu: thread_cpu(),
        }
    }

    /// Wall time since, in ms.
    pub(crate) fn elapsed_ms(&self) -> f64 {
        ms(self.wall.elapsed())
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.wall.elapsed()
    }

    /// The calling thread's CPU time since, in ms (the same thread's that
    /// took the moment, for the figure to mean anything).
    pub(crate) fn cpu_ms(&self) -> f64 {
        ms(thread_cpu().saturating_sub(self.cpu))
    }
}

/// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID: the vDSO does
/// not answer it, and the engine's seccomp list allows the syscall); zero
/// where the clock fails.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec that the call writes, and nothing
    // else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spinning_thread_counts_cpu_and_a_sleeping_one_does_not() {
        let sleeping = Moment::now();
        std::thread::sleep(Duration::from_millis(30));
        let (wall, cpu) = (sleeping.elapsed_ms(), sleeping.cpu_ms());
        assert!(wall >= 30.0, "{wall}");
        assert!(cpu < wall / 2.0, "asleep, yet {cpu} ms of CPU in {wall}");
        let spinning = Moment::now();
        while spinning.cpu_ms() < 20.0 && spinning.elapsed_ms() < 10_000.0 {
            std::hint::black_box(0u64);
        }
        let (wall, cpu) = (spinning.elapsed_ms(), spinning.cpu_ms());
        assert!(cpu >= 20.0 && wall >= cpu, "spun {cpu} ms of CPU in {wall}");
    }
}
