//! What postcopy did on the destination, as plain data: the destination
//! sends it to the source in its final report, and both summaries carry it.
//! [`crate::postcopy`] fills it in.

use serde::{Deserialize, Serialize};

/// What postcopy did on the destination (in its report to the source).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PostcopyReport {
    /// Time vCPUs spent waiting for requested pages: from the fault's
    /// arrival at the handler to the page's placement, once per request
    /// (a second vCPU waiting on the same page is not counted twice).
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
}

impl PostcopyReport {
    /// Adds the counts of a pager that ran over an earlier set of
    /// connections.
    pub(crate) fn add(&mut self, earlier: &PostcopyReport) {
        self.faults += earlier.faults;
        self.pages_requested += earlier.pages_requested;
    }
}
