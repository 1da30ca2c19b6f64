//! Guest RAM that two processes map at once: the files behind each region
//! (a same-host live upgrade hands them to the next VMM process with
//! `SCM_RIGHTS`), and RAM built on files received that way. Only
//! file-backed memory (memfd, hugetlbfs files) can be shared like this;
//! anonymous memory belongs to one process.

use crate::ram::{Backing, GuestRam, RamError, RamSlot};
use crate::types::{Gpa, PAGE_SIZE};
use std::fs::File;
use std::num::NonZeroUsize;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap};

/// One region of guest RAM on a file, as another process hands it over.
#[derive(Debug)]
pub struct SharedRegion {
    /// Where the region starts in the guest.
    pub gpa: Gpa,
    /// Its size.
    pub size: u64,
    /// The file (a memfd, say) holding its bytes.
    pub file: File,
    /// Where in the file the region starts.
    pub offset: u64,
}

impl GuestRam {
    /// The file behind each region, with the offset the region starts at,
    /// in slot order; `None` if any region has no file (anonymous memory).
    pub fn region_files(&self) -> Option<Vec<(RamSlot, &File, u64)>> {
        self.slots()
            .iter()
            .zip(self.memory().iter())
            .map(|(slot, region)| {
                let mapping: &vm_memory::MmapRegion<AtomicBitmap> = region;
                mapping
                    .file_offset()
                    .map(|f| (slot.clone(), f.file(), f.start()))
            })
            .collect()
    }

    /// Guest RAM mapped (shared) from the files of `regions`, which another
    /// process's RAM is built on; each region gets its own dirty bitmap.
    pub fn from_files(regions: Vec<SharedRegion>, backing: Backing) -> Result<Self, RamError> {
        let page = NonZeroUsize::new(PAGE_SIZE).expect("non-zero");
        let mut mapped = Vec::with_capacity(regions.len());
        for r in regions {
            let map_err = |source| RamError::Map {
                size: r.size,
                backing,
                hint: " from the file another process handed over",
                source,
            };
            let builder = MmapRegionBuilder::new_with_bitmap(
                r.size as usize,
                AtomicBitmap::new(r.size as usize, page),
            )
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_SHARED | libc::MAP_NORESERVE)
            .with_hugetlbfs(backing == Backing::Hugetlb)
            .with_file_offset(FileOffset::new(r.file, r.offset));
            let mapping = builder.build().map_err(map_err)?;
            let region = GuestRegionMmap::new(mapping, GuestAddress(r.gpa.0))
                .ok_or_else(|| RamError::Regions(format!("the region at {} overflows", r.gpa)))?;
            mapped.push(region);
        }
        let mem =
            GuestMemoryMmap::from_regions(mapped).map_err(|e| RamError::Regions(e.to_string()))?;
        GuestRam::from_memory(mem, backing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_ram_is_seen_by_a_second_mapping_of_its_files() {
        let layout = [(Gpa(0), 2 << 20), (Gpa(8 << 20), 4 << 20)];
        let a = GuestRam::with_regions(&layout, Backing::Memfd).unwrap();
        let files = a.region_files().expect("memfd regions have files");
        let regions = files
            .iter()
            .map(|(slot, file, offset)| SharedRegion {
                gpa: slot.gpa,
                size: slot.size,
                file: file.try_clone().unwrap(),
                offset: *offset,
            })
            .collect();
        let b = GuestRam::from_files(regions, Backing::Memfd).unwrap();
        assert_eq!(b.slots(), a.slots());
        a.store_u64(Gpa((8 << 20) + 4096), 0xfeed).unwrap();
        assert_eq!(b.load_u64(Gpa((8 << 20) + 4096)).unwrap(), 0xfeed);
        b.store_u64(Gpa(16), 7).unwrap();
        assert_eq!(a.load_u64(Gpa(16)).unwrap(), 7);
    }

    #[test]
    fn anonymous_ram_has_no_files_to_share() {
        let a = GuestRam::with_regions(&[(Gpa(0), 2 << 20)], Backing::Anonymous).unwrap();
        assert!(a.region_files().is_none());
    }
}
