//! Which kernel log lines are warnings: a lockup, a stall, a clocksource
//! the kernel gave up on, a WARN or BUG, an oops. The kernel's notices that
//! carry such a word but report nothing that happened are not.

/// True when the kernel log `line` reports trouble.
pub fn is_warning(line: &str) -> bool {
    const ALWAYS: [&str; 8] = [
        "WARNING:",
        "BUG:",
        "Oops",
        "Kernel panic",
        "soft lockup",
        "hard LOCKUP",
        "hung task",
        "blocked for more than",
    ];
    // "rcu" and "clocksource" start many normal boot lines: only a stall
    // and an unstable or skewed clocksource count.
    let rcu = line.contains("rcu") && line.contains("stall");
    let clock = line.contains("clocksource")
        && ["unstable", "skew", "watchdog"]
            .iter()
            .any(|w| line.contains(w));
    // The command line echoes its parameters (`rcupdate.rcu_cpu_stall_cputime=1`).
    let cmdline = line.contains("Command line:") || line.contains("command line:");
    let notice = cmdline || line.contains("Speculative Return Stack Overflow: WARNING: See");
    !notice && (rcu || clock || ALWAYS.iter().any(|w| line.contains(w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trouble_counts_and_boot_chatter_does_not() {
        assert!(is_warning("WARNING: CPU: 0 PID: 0 at kernel/x.c:1 f+0x1"));
        assert!(is_warning(
            "rcu: INFO: rcu_preempt self-detected stall on CPU"
        ));
        assert!(is_warning(
            "clocksource: timekeeping watchdog on CPU1: Marking clocksource 'tsc' as unstable"
        ));
        assert!(is_warning(
            "INFO: task kworker:1 blocked for more than 120 seconds."
        ));
        assert!(!is_warning(
            "rcu: Preemptible hierarchical RCU implementation."
        ));
        assert!(!is_warning(
            "clocksource: Switched to clocksource kvm-clock"
        ));
        assert!(!is_warning(
            "Kernel command line: console=ttyS0 rcupdate.rcu_cpu_stall_cputime=1"
        ));
        assert!(!is_warning(
            "Speculative Return Stack Overflow: WARNING: See https://kernel.org/doc/srso.html"
        ));
    }
}
