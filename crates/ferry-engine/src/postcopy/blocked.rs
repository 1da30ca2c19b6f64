//! Which threads waited for pages in postcopy, and when: the block clock's
//! count per kernel thread id, named by vCPU where the VM says which thread
//! runs which vCPU, and binned coarsely enough for a report.

use crate::session::{ThreadWaits, BLOCK_BIN};
use crate::summary::BlockedThread;
use crate::summary::PostcopyReport;
use std::collections::HashMap;

/// Most bins a thread's series carries: the clock's fine bins are summed
/// into wider ones past this.
const MAX_BINS: usize = 100;

/// Fills `report.blocked` and `report.blocked_bin_ms` from each thread's
/// waits (`by_thread`), the VM's vCPU thread ids (`vcpu_threads`, in vCPU
/// order) and the postcopy's length (`report.postcopy_ms`).
pub(crate) fn fill(
    report: &mut PostcopyReport,
    by_thread: HashMap<u32, ThreadWaits>,
    vcpu_threads: &[u32],
) {
    let fine_ms = BLOCK_BIN.as_secs_f64() * 1e3;
    let longest = by_thread.values().map(|w| w.bins_ns.len()).max();
    let Some(longest) = longest else {
        return;
    };
    let fine = longest.max((report.postcopy_ms / fine_ms).ceil() as usize);
    let group = fine.div_ceil(MAX_BINS).max(1);
    let bin_ns = BLOCK_BIN.as_nanos() as f64 * group as f64;
    let mut blocked: Vec<BlockedThread> = by_thread
        .into_iter()
        .map(|(thread, w)| {
            let vcpu = (thread != 0)
                .then(|| vcpu_threads.iter().position(|t| *t == thread))
                .flatten()
                .map(|i| i as u32);
            let mut pct = vec![0.0; fine.div_ceil(group)];
            for (i, ns) in w.bins_ns.iter().enumerate() {
                pct[i / group] += *ns as f64 / bin_ns * 100.0;
            }
            BlockedThread {
                vcpu,
                thread,
                name: thread_name(thread),
                blocked_ms: w.ns as f64 / 1e6,
                waits: w.waits,
                blocked_pct: pct.into_iter().map(|p| p.min(100.0)).collect(),
            }
        })
        .collect();
    blocked.sort_by_key(|b| (b.vcpu.is_none(), b.vcpu, b.thread));
    report.blocked = blocked;
    report.blocked_bin_ms = fine_ms * group as f64;
}

/// The kernel's name for thread `tid`, or "" where it is gone or unnamed.
fn thread_name(tid: u32) -> String {
    if tid == 0 {
        return String::new();
    }
    // One read into a buffer of a name's size: read_to_string would stat
    // the file first, a syscall the seccomp filter does not allow.
    let mut name = [0u8; 64];
    let n = std::fs::File::open(format!("/proc/{tid}/comm"))
        .and_then(|mut f| std::io::Read::read(&mut f, &mut name))
        .unwrap_or(0);
    String::from_utf8_lossy(&name[..n]).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(ns: u64, bins_ns: Vec<u64>) -> ThreadWaits {
        ThreadWaits {
            ns,
            waits: 1,
            bins_ns,
        }
    }

    #[test]
    fn threads_are_named_by_vcpu_and_their_bins_widened_to_fit() {
        let mut r = PostcopyReport {
            postcopy_ms: 2_000.0,
            ..Default::default()
        };
        // 10 ms bins: thread 42 waits all of bins 0 and 1, thread 7 half of bin 150.
        let by = HashMap::from([
            (
                7,
                waits(5_000_000, [vec![0; 150], vec![5_000_000]].concat()),
            ),
            (42, waits(20_000_000, vec![10_000_000, 10_000_000])),
            (99, waits(1_000_000, vec![1_000_000])),
        ]);
        fill(&mut r, by, &[42, 7]);
        // 200 fine bins (the postcopy's 2 s) fold two by two into 100.
        assert_eq!(r.blocked_bin_ms, 20.0);
        let names: Vec<_> = r.blocked.iter().map(|b| (b.vcpu, b.thread)).collect();
        assert_eq!(names, [(Some(0), 42), (Some(1), 7), (None, 99)]);
        let v0 = &r.blocked[0];
        assert_eq!(v0.blocked_pct.len(), 100);
        assert!((v0.blocked_pct[0] - 100.0).abs() < 1e-9);
        assert!((v0.blocked_ms - 20.0).abs() < 1e-9);
        assert!((r.blocked[1].blocked_pct[75] - 25.0).abs() < 1e-9);
    }

    #[test]
    fn a_thread_is_named_as_the_kernel_names_it() {
        let me = ferry_vm::current_thread_id();
        std::thread::Builder::new()
            .name("ferry-named".into())
            .spawn(|| {
                assert_eq!(thread_name(ferry_vm::current_thread_id()), "ferry-named");
            })
            .expect("spawn")
            .join()
            .expect("join");
        assert!(!thread_name(me).is_empty());
        assert_eq!(thread_name(0), "");
    }

    #[test]
    fn nobody_waited_leaves_the_report_empty() {
        let mut r = PostcopyReport::default();
        fill(&mut r, HashMap::new(), &[1]);
        assert!(r.blocked.is_empty() && r.blocked_bin_ms == 0.0);
    }
}
