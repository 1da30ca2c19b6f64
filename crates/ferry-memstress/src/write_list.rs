//! The write-list program: a second guest program of ferry's own VMs, run
//! instead of the memstress loop where a test needs the guest itself to
//! write pages the host chooses (the engine's conformance kit). Both
//! backends run it, over the memstress layout, with the same protocol.
//!
//! ```text
//!  the list, in the system slot where memstress keeps its shadow arrays
//!  (unused by this program):
//!    LIST_GPA + GENERATION  u64  the generation the host asks for
//!    LIST_GPA + COUNT       u64  entries in the list
//!    LIST_GPA + VCPUS       u64  vCPUs sharing it out
//!    LIST_GPA + ENTRIES     u64  guest-physical address of each page to write
//!
//!  each vCPU, for ever:
//!    progress.accesses += 1                      (a heartbeat: memory changes while it runs)
//!    if list.generation != progress.pass:
//!      for i in vcpu, vcpu + vcpus, ... < count:
//!        lock or qword [entry[i]], 0             (a write that keeps the contents)
//!      progress.pass = list.generation            (done)
//! ```
//!
//! A locked `or` of zero is a write access (it dirties the page in every
//! dirty log, KVM's and the soft MMU's alike) that leaves the page as it
//! was, so the host may name page tables or code, and atomic, so two vCPUs
//! naming one word lose nothing. The host writes the list through
//! `GuestRam` (its pages are dirty by the host's hand too), then the
//! generation, and waits for each vCPU to publish it.

use crate::{MemoryLayout, Workload, SHADOW_GPA};
use ferry_vm::{Gfn, Gpa, GuestRam, RamError, PAGE_SIZE};
use std::time::{Duration, Instant};

/// Where the list starts.
pub const LIST_GPA: Gpa = SHADOW_GPA;
/// Offset of the generation the host asks for.
pub const GENERATION: u64 = 0;
/// Offset of the entry count.
pub const COUNT: u64 = 8;
/// Offset of the number of vCPUs the entries are shared out among.
pub const VCPUS: u64 = 16;
/// Offset of the first entry.
pub const ENTRIES: u64 = 24;
/// How often the host looks for the vCPUs' answer.
const POLL: Duration = Duration::from_millis(1);

/// Why the guest did not write a list.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum WriteListError {
    /// More pages than the list holds.
    #[error("{pages} pages asked, the list holds {capacity}")]
    TooMany {
        /// Pages asked.
        pages: usize,
        /// Entries the list holds.
        capacity: u64,
    },
    /// A page outside guest RAM.
    #[error("frame {0:#x} is not guest RAM")]
    NotRam(u64),
    /// Reading or writing the list failed.
    #[error("the write list in guest memory")]
    Ram(#[from] RamError),
    /// Some vCPU did not finish in time (not running, or not running this
    /// program).
    #[error(
        "vCPU {vcpu} did not write generation {generation} of the list within {deadline:?} \
         (is the VM running the write-list program?)"
    )]
    Timeout {
        /// The first vCPU still behind.
        vcpu: u32,
        /// The generation asked.
        generation: u64,
        /// How long the host waited.
        deadline: Duration,
    },
}

/// Entries the list of `workload`'s layout holds.
pub fn capacity(workload: &Workload) -> u64 {
    let layout = MemoryLayout::for_workload(workload);
    (layout.system_bytes - LIST_GPA.0 - ENTRIES) / 8
}

/// Has the vCPUs of a running VM on `ram`, running the write-list program
/// of `workload`, write each of `pages`, and returns once every vCPU has
/// done its share, or fails after `deadline`.
pub fn write_pages(
    ram: &GuestRam,
    workload: &Workload,
    pages: &[Gfn],
    deadline: Duration,
) -> Result<(), WriteListError> {
    let capacity = capacity(workload);
    if pages.len() as u64 > capacity {
        return Err(WriteListError::TooMany {
            pages: pages.len(),
            capacity,
        });
    }
    if let Some(g) = pages.iter().find(|g| !ram.is_ram(**g)) {
        return Err(WriteListError::NotRam(g.0));
    }
    let at = |offset: u64| LIST_GPA.add(offset);
    let generation = ram.load_u64(at(GENERATION))? + 1;
    let entries: Vec<u8> = pages
        .iter()
        .flat_map(|g| (g.0 * PAGE_SIZE as u64).to_le_bytes())
        .collect();
    ram.write_bytes(at(ENTRIES), &entries)?;
    ram.store_u64(at(COUNT), pages.len() as u64)?;
    ram.store_u64(at(VCPUS), u64::from(workload.vcpus.max(1)))?;
    // Last: the vCPUs read the list once they see a new generation.
    ram.store_u64(at(GENERATION), generation)?;
    let until = Instant::now() + deadline;
    loop {
        let behind = crate::read_progress(ram, workload.vcpus)?
            .iter()
            .position(|p| p.passes != generation);
        match behind {
            None => return Ok(()),
            Some(vcpu) if Instant::now() >= until => {
                return Err(WriteListError::Timeout {
                    vcpu: vcpu as u32,
                    generation,
                    deadline,
                })
            }
            Some(_) => std::thread::sleep(POLL),
        }
    }
}
