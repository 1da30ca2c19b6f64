//! Whether guest RAM can be backed by transparent huge pages: the kernel's
//! own verdict for each mapping (`THPeligible` in `/proc/self/smaps`,
//! Linux 5.0 on), which weighs the system's setting
//! (`/sys/kernel/mm/transparent_hugepage/enabled`), the mapping's advice
//! (`MADV_HUGEPAGE`, `MADV_NOHUGEPAGE`) and its kind (anonymous, shmem).
//!
//! Why a destination asks: a page placed with `UFFDIO_COPY` is always a 4
//! KiB page, and memory registered with userfaultfd is never collapsed
//! into huge pages afterwards, so a guest whose RAM could have been on 2
//! MiB pages would run on 4 KiB ones after the move. Its second-level page
//! tables then map it 4 KiB at a time too: every page the guest touches
//! after the resume takes a fault of its own, where a huge page takes one
//! per 2 MiB, and the TLB covers 512 times less.

use std::ops::Range;

/// Whether every byte of `ranges` (host virtual addresses) lies in a
/// mapping the kernel says may be backed by transparent huge pages; `None`
/// where `/proc/self/smaps` cannot be read or does not say (before Linux
/// 5.0).
pub fn eligible(ranges: &[Range<usize>]) -> Option<bool> {
    let smaps = read_smaps().ok()?;
    eligible_in(&smaps, ranges)
}

/// `/proc/self/smaps`, read in chunks: `std::fs::read_to_string` asks the
/// file's size first (`statx`), which a destination's seccomp filter does
/// not allow; this needs only `openat`, `read` and `close`.
fn read_smaps() -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open("/proc/self/smaps")?;
    let (mut text, mut chunk) = (Vec::new(), vec![0u8; 64 << 10]);
    loop {
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(text).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// [`eligible`] over the text of an smaps file.
fn eligible_in(smaps: &str, ranges: &[Range<usize>]) -> Option<bool> {
    let vmas = vmas(smaps)?;
    Some(ranges.iter().all(|r| covered(&vmas, r)))
}

/// Each mapping's range and whether it is eligible, in address order.
fn vmas(smaps: &str) -> Option<Vec<(Range<usize>, bool)>> {
    let mut vmas: Vec<(Range<usize>, Option<bool>)> = Vec::new();
    for line in smaps.lines() {
        if let Some(range) = header(line) {
            vmas.push((range, None));
        } else if let Some(v) = line.strip_prefix("THPeligible:") {
            if let Some(last) = vmas.last_mut() {
                last.1 = Some(v.trim() == "1");
            }
        }
    }
    // A kernel that says it for no mapping does not say it at all.
    if vmas.iter().all(|(_, e)| e.is_none()) {
        return None;
    }
    Some(
        vmas.into_iter()
            .map(|(r, e)| (r, e.unwrap_or(false)))
            .collect(),
    )
}

/// A mapping's first line (`start-end perms offset dev inode [path]`,
/// addresses in hex), as its range.
fn header(line: &str) -> Option<Range<usize>> {
    let (span, rest) = line.split_once(' ')?;
    // Field lines ("Rss:   4 kB") have a key ending in ':' instead.
    if !rest.starts_with(['r', '-']) {
        return None;
    }
    let (start, end) = span.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    (start < end).then_some(start..end)
}

/// Whether eligible mappings cover `r` without a gap.
fn covered(vmas: &[(Range<usize>, bool)], r: &Range<usize>) -> bool {
    let mut at = r.start;
    for (vma, ok) in vmas {
        if at >= r.end {
            break;
        }
        if vma.end <= at {
            continue;
        }
        if vma.start > at || !ok {
            return false;
        }
        at = vma.end;
    }
    at >= r.end
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0000400000 rw-p 00000000 00:00 0 
Size:               4096 kB
Rss:                   0 kB
THPeligible:    1
7f0000400000-7f0000800000 rw-p 00000000 00:00 0 
Size:               4096 kB
THPeligible:    1
7f0000800000-7f0000a00000 rw-s 00000000 00:01 12 /memfd:guest (deleted)
Size:               2048 kB
THPeligible:    0
";

    #[test]
    fn a_range_is_eligible_only_where_every_mapping_under_it_is() {
        let base = 0x7f00_0000_0000usize;
        let yes = base..base + 0x80_0000;
        assert_eq!(eligible_in(SMAPS, std::slice::from_ref(&yes)), Some(true));
        let into_memfd = base + 0x70_0000..base + 0x90_0000;
        assert_eq!(eligible_in(SMAPS, &[yes, into_memfd]), Some(false));
        let past_the_end = base + 0x90_0000..base + 0xb0_0000;
        assert_eq!(eligible_in(SMAPS, &[past_the_end]), Some(false));
        let unmapped = base - 0x1000..base + 0x1000;
        assert_eq!(eligible_in(SMAPS, &[unmapped]), Some(false));
    }

    #[test]
    fn a_kernel_that_does_not_say_is_not_guessed_for() {
        let old = "7f0000000000-7f0000400000 rw-p 00000000 00:00 0 \nRss: 0 kB\n";
        assert_eq!(
            eligible_in(
                old,
                std::slice::from_ref(&(0x7f00_0000_0000..0x7f00_0000_1000))
            ),
            None
        );
    }

    /// The kernel's own answer for this process: an anonymous mapping
    /// advised MADV_HUGEPAGE is eligible wherever THP is not off, and one
    /// advised MADV_NOHUGEPAGE never is.
    #[test]
    fn the_kernel_answers_for_advised_mappings() {
        let enabled = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        let Ok(enabled) = enabled else {
            println!("SKIP: no transparent huge pages here");
            return;
        };
        let len = 4 << 20;
        let map = |advice| {
            // SAFETY: a fresh private anonymous mapping, used by nothing
            // else; the advice changes only how the kernel backs it.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                assert_eq!(libc::madvise(p, len, advice), 0);
                p as usize
            }
        };
        let (advised, refused) = (map(libc::MADV_HUGEPAGE), map(libc::MADV_NOHUGEPAGE));
        let on = !enabled.contains("[never]");
        assert_eq!(
            eligible(std::slice::from_ref(&(advised..advised + len))),
            Some(on),
            "{enabled}"
        );
        assert_eq!(
            eligible(std::slice::from_ref(&(refused..refused + len))),
            Some(false)
        );
        for p in [advised, refused] {
            // SAFETY: each is the mapping made above, used by nothing else.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
        }
    }
}
