//! Which pages the kit has a VM write, how it names them, and how it sees
//! guest memory change: a hash per page, read from memory, never from what
//! the VM says of itself.

use ferry_vm::{Gfn, GuestRam, RamError, Vm, PAGE_SIZE};
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::xxh3_64;

/// Pages chosen inside each region besides its first and last: enough to
/// cover a region's middle, few enough to list every miss in a message.
const INTERIOR_PAGES: u64 = 14;
/// Pages read at once while hashing memory.
const HASH_CHUNK_PAGES: u64 = 256;
/// How often the kit looks at memory while it waits for it to change.
const POLL: Duration = Duration::from_millis(5);

/// Why guest memory could not be read.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PagesError {
    /// Reading guest RAM failed.
    #[error("reading guest memory at frame {gfn:#x}")]
    Read {
        /// The first frame of the read.
        gfn: u64,
        /// Why.
        #[source]
        source: RamError,
    },
}

/// The pages the kit has a VM write: in every region of `ram`, its first
/// page, its last page and [`INTERIOR_PAGES`] spread evenly between them,
/// in ascending order, each once.
pub fn chosen_pages(ram: &GuestRam) -> Vec<Gfn> {
    let mut pages: Vec<Gfn> = ram
        .slots()
        .iter()
        .filter(|s| s.pages() > 0)
        .flat_map(|s| {
            let (first, n) = (s.first_gfn().0, s.pages());
            let interior =
                (1..=INTERIOR_PAGES).map(move |i| first + i * (n - 1) / (INTERIOR_PAGES + 1));
            std::iter::once(first)
                .chain(interior)
                .chain(std::iter::once(first + n - 1))
                .map(Gfn)
        })
        .collect();
    pages.sort_unstable_by_key(|g| g.0);
    pages.dedup();
    pages
}

/// `gfn` in words a VMM author finds it by: the frame, its region, and its
/// place in the region.
pub fn describe_frame(ram: &GuestRam, gfn: Gfn) -> String {
    let slot = ram
        .slots()
        .iter()
        .enumerate()
        .find(|(_, s)| (s.first_gfn().0..s.first_gfn().0 + s.pages()).contains(&gfn.0));
    match slot {
        Some((i, s)) => {
            let page = gfn.0 - s.first_gfn().0;
            let place = if page == 0 {
                ", its first page".to_string()
            } else if page + 1 == s.pages() {
                ", its last page".to_string()
            } else {
                String::new()
            };
            format!(
                "frame {:#x} (region {i} at {:#x}, page {page} of {}{place})",
                gfn.0,
                s.gpa.0,
                s.pages()
            )
        }
        None => format!("frame {:#x} (in no region)", gfn.0),
    }
}

/// At most this many frames named in one message; the rest are counted.
const LISTED: usize = 16;

/// `frames`, described, at most [`LISTED`] of them, the rest counted.
pub(crate) fn list_frames(ram: &GuestRam, frames: &[Gfn]) -> String {
    let mut text: Vec<String> = frames
        .iter()
        .take(LISTED)
        .map(|&g| describe_frame(ram, g))
        .collect();
    if frames.len() > LISTED {
        text.push(format!("and {} more", frames.len() - LISTED));
    }
    text.join(", ")
}

/// A hash of every page of guest RAM, region by region.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PageHashes(Vec<(Gfn, u64)>);

impl PageHashes {
    /// Hashes every page of `ram` as it is now.
    pub(crate) fn of(ram: &GuestRam) -> Result<Self, PagesError> {
        let mut hashes = Vec::with_capacity(ram.size() as usize / PAGE_SIZE);
        let mut buf = vec![0u8; HASH_CHUNK_PAGES as usize * PAGE_SIZE];
        for slot in ram.slots() {
            let end = slot.first_gfn().0 + slot.pages();
            let mut at = slot.first_gfn().0;
            while at < end {
                let n = (end - at).min(HASH_CHUNK_PAGES);
                let chunk = &mut buf[..n as usize * PAGE_SIZE];
                ram.read_pages(Gfn(at), chunk)
                    .map_err(|source| PagesError::Read { gfn: at, source })?;
                hashes.extend(
                    chunk
                        .chunks(PAGE_SIZE)
                        .enumerate()
                        .map(|(i, page)| (Gfn(at + i as u64), xxh3_64(page))),
                );
                at += n;
            }
        }
        Ok(PageHashes(hashes))
    }

    /// The frames whose contents differ in `later`.
    pub(crate) fn changed(&self, later: &PageHashes) -> Vec<Gfn> {
        self.0
            .iter()
            .zip(&later.0)
            .filter(|(a, b)| a.1 != b.1)
            .map(|(a, _)| a.0)
            .collect()
    }
}

/// Waits until some page of `vm`'s memory differs from `since`, for at
/// most `deadline`: whether its guest writes. `Ok(false)` if none changed.
pub(crate) fn memory_changes(
    vm: &dyn Vm,
    since: &PageHashes,
    deadline: Duration,
) -> Result<bool, PagesError> {
    let until = Instant::now() + deadline;
    loop {
        if !since.changed(&PageHashes::of(vm.ram())?).is_empty() {
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        std::thread::sleep(POLL);
    }
}
