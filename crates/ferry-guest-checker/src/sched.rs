//! What the guest's scheduler did to each worker, for `checker.sched=1`: a
//! line `checker-sched N ...` after each numbered line, with each worker's
//! CPU, the CPU time the kernel charged it and how often another task
//! preempted it in that second, and each CPU's steal time. A worker whose
//! clock stopped for seconds while it was charged that time as running was
//! starved with its vCPU; one preempted meanwhile lost its CPU to another
//! task. Off by default: the numbered lines are what VMMs check.

use std::fmt::Write as _;

/// One worker's figures, as /proc reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TaskTimes {
    /// The CPU it last ran on.
    pub cpu: u32,
    /// User plus system time charged, in clock ticks.
    pub ticks: u64,
    /// Of which system time (in the kernel), in clock ticks.
    pub sys_ticks: u64,
    /// Times another task took its CPU.
    pub preempted: u64,
}

/// Reads thread `tid` of this process (`None` if /proc does not have it).
pub fn task(tid: u64) -> Option<TaskTimes> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    parse_task(&stat, &status)
}

/// A task's figures from its `stat` and `status` files.
fn parse_task(stat: &str, status: &str) -> Option<TaskTimes> {
    // The name in parentheses may hold spaces: count fields after it.
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14, 15 (utime, stime) and 39 (processor), counted from 1 with
    // the pid and name as 1 and 2: here from 3.
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    let preempted = status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()?;
    Some(TaskTimes {
        cpu: field(39)? as u32,
        ticks: field(14)? + field(15)?,
        sys_ticks: field(15)?,
        preempted,
    })
}

/// Each CPU's steal time in clock ticks, from /proc/stat.
pub fn steal() -> Vec<u64> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    parse_steal(&stat)
}

fn parse_steal(stat: &str) -> Vec<u64> {
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .filter_map(|l| l.split_whitespace().nth(8)?.parse().ok())
        .collect()
}

/// TLB shootdowns and function-call interrupts taken, summed over the
/// CPUs, from /proc/interrupts: how often a CPU had to wait on another.
pub fn ipis() -> [u64; 2] {
    parse_ipis(&std::fs::read_to_string("/proc/interrupts").unwrap_or_default())
}

fn parse_ipis(text: &str) -> [u64; 2] {
    let count = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.trim_start().strip_prefix(name))
            .map_or(0, |rest| {
                rest.split_whitespace()
                    .map_while(|w| w.parse::<u64>().ok())
                    .sum()
            })
    };
    [count("TLB:"), count("CAL:")]
}

/// The line after numbered line `seq`: each worker's change since `before`.
pub fn line(
    seq: u64,
    before: &[TaskTimes],
    now: &[TaskTimes],
    steal: (&[u64], &[u64]),
    ipis: ([u64; 2], [u64; 2]),
) -> String {
    let tick_ms = 1000 / clock_ticks();
    let mut s = format!("checker-sched {seq}");
    for (i, (b, n)) in before.iter().zip(now).enumerate() {
        let _ = write!(
            s,
            " w{i} cpu={} ran_ms=+{} sys_ms=+{} preempted=+{}",
            n.cpu,
            n.ticks.saturating_sub(b.ticks) * tick_ms,
            n.sys_ticks.saturating_sub(b.sys_ticks) * tick_ms,
            n.preempted.saturating_sub(b.preempted)
        );
    }
    let stolen: Vec<String> = steal
        .0
        .iter()
        .zip(steal.1)
        .map(|(b, n)| (n.saturating_sub(*b) * tick_ms).to_string())
        .collect();
    let _ = write!(
        s,
        " steal_ms=+{} tlb=+{} cal=+{}",
        stolen.join(",+"),
        ipis.1[0].saturating_sub(ipis.0[0]),
        ipis.1[1].saturating_sub(ipis.0[1])
    );
    s
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// This thread's id.
pub fn tid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tasks_figures_are_read_past_a_name_with_spaces() {
        let mut stat = "42 (a (b) c) R 1 1 1 0 -1 0 0 0 0 0 7 5".to_string();
        // Fields 16 to 38, then the processor.
        for _ in 16..=38 {
            stat.push_str(" 0");
        }
        stat.push_str(" 1 0 0");
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t3\nnonvoluntary_ctxt_switches:\t9\n";
        assert_eq!(
            parse_task(&stat, status),
            Some(TaskTimes {
                cpu: 1,
                ticks: 12,
                sys_ticks: 5,
                preempted: 9
            })
        );
    }

    #[test]
    fn shootdowns_and_calls_are_summed_over_the_cpus() {
        let text = "           CPU0       CPU1\n  CAL:         12          30   Function call interrupts\n  TLB:          4           5   TLB shootdowns\n";
        assert_eq!(parse_ipis(text), [9, 42]);
    }

    #[test]
    fn steal_is_read_per_cpu() {
        let stat = "cpu  1 2 3 4 5 6 7 99 0 0\ncpu0 1 2 3 4 5 6 7 40 0 0\ncpu1 1 2 3 4 5 6 7 59 0 0\nintr 5\n";
        assert_eq!(parse_steal(stat), vec![40, 59]);
    }
}
