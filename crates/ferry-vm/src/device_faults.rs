//! A device in another process (a vhost-user backend) that touches guest
//! memory during a postcopy: on the destination, pages not yet received
//! are missing for it too, and it faults through a userfaultfd of its own
//! (`VHOST_USER_POSTCOPY_ADVISE` hands it to the VMM). The VMM gives the
//! engine that fd and where the device maps each region; the engine serves
//! its faults from the same pages it places for the vCPUs, and wakes the
//! device once each page is in.

use crate::types::Gfn;
use std::os::fd::OwnedFd;

/// One device's userfaultfd, and how its addresses map to guest frames.
#[derive(Debug)]
pub struct DeviceUserfaultfd {
    /// The device, for messages ("vhost-user fill device").
    pub name: String,
    /// The fd, registered by the device over its own mappings of guest
    /// memory (MISSING mode), non-blocking.
    pub fd: OwnedFd,
    /// Where the device maps guest memory.
    pub regions: Vec<DeviceRegion>,
}

/// One region of guest memory as a device maps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRegion {
    /// Its first guest frame.
    pub first: Gfn,
    /// Its frames.
    pub pages: u64,
    /// The device's address of its first frame.
    pub host: u64,
}
