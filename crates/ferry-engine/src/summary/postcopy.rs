//! What postcopy did on the destination, as plain data: the destination
//! sends it to the source in its final report, and both summaries carry it.
//! [`crate::postcopy`] fills it in.

use serde::{Deserialize, Serialize};

/// What postcopy did on the destination (in its report to the source).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PostcopyReport {
    /// Time vCPUs spent waiting for requested pages: from the fault's
    /// arrival at the handler to the page's placement, once per request
    /// (a second vCPU waiting on the same page is not counted twice; each
    /// thread's own waits are in [`PostcopyReport::blocked`]).
    pub block_ms: f64,
    /// Page requests sent on the priority connection.
    pub page_requests: u64,
    /// Fault events read (a fault on a page already asked for counts too).
    pub faults: u64,
    /// Pages that arrived as answers to requests.
    pub pages_requested: u64,
    /// Guest resumed to the last page placed.
    pub postcopy_ms: f64,
    /// Missing pages at switchover.
    pub missing_pages: u64,
    /// Times the connections broke mid-postcopy and were set up again.
    #[serde(default)]
    pub recoveries: u32,
    /// How a vCPU's touch of a missing page reached the pager: "vcpu
    /// exit" (the vCPU asked itself: annotated exits, soft) or
    /// "userfaultfd" (a handler thread read the fault).
    #[serde(default)]
    pub fault_path: String,
    /// Memory-fault exits of vCPUs that asked for pages themselves.
    #[serde(default)]
    pub vcpu_exits: u64,
    /// Faults of devices in other processes (vhost-user backends) served.
    #[serde(default)]
    pub device_faults: u64,
    /// Each thread that waited for pages, vCPUs first: where it waited
    /// and when. Empty from a peer that did not count it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<BlockedThread>,
    /// Width of each [`BlockedThread::blocked_pct`] bin, in ms.
    #[serde(default)]
    pub blocked_bin_ms: f64,
}

/// What one thread waited for pages in postcopy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BlockedThread {
    /// The vCPU it is, where the VM names its vCPU threads
    /// (`ferry_vm::Vm::vcpu_threads`); `None`: another thread, or a fault
    /// that did not name its thread.
    pub vcpu: Option<u32>,
    /// Its kernel thread id (0: not named).
    pub thread: u32,
    /// The kernel's name for it (`/proc/TID/comm`). On KVM a vCPU's touch
    /// of a missing page is often served by a kernel worker (`kworker/…`:
    /// KVM's async page fault, while the vCPU halts), which no vCPU names.
    #[serde(default)]
    pub name: String,
    /// Time it waited, from each fault to the page's placement, in ms
    /// (its waits on one page with other threads count for each).
    pub blocked_ms: f64,
    /// Pages it waited on.
    pub waits: u64,
    /// Its share of each bin of postcopy spent waiting, in %, from the
    /// guest's resume on ([`PostcopyReport::blocked_bin_ms`] each).
    pub blocked_pct: Vec<f64>,
}

impl PostcopyReport {
    /// Adds the counts of a pager that ran over an earlier set of
    /// connections.
    pub(crate) fn add(&mut self, earlier: &PostcopyReport) {
        self.faults += earlier.faults;
        self.pages_requested += earlier.pages_requested;
    }
}
