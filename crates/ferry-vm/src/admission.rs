//! Admission: does a guest of this size fit on this host at all? Checked
//! before a VM is built, on either end of a migration, so a request that
//! cannot fit is refused at once with the numbers, not after minutes of
//! warm-up or in the middle of a stream.
//!
//! ```text
//!   anon, thp, memfd   guest memory ≤ MemAvailable (/proc/meminfo)
//!   hugetlb            guest memory ≤ HugePages_Free × Hugepagesize
//! ```
//!
//! Guest memory is mapped MAP_NORESERVE, so the kernel itself would accept
//! any size and fail only when the guest touches a page it cannot back.

use crate::ram::Backing;
use crate::types::human_bytes;

/// A guest that does not fit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdmissionError {
    /// More memory than the host has available.
    #[error(
        "guest needs {}, this host has {} available; use a smaller --mem-per-vcpu or fewer --vcpus",
        human_bytes(*need),
        human_bytes(*available)
    )]
    Memory {
        /// Guest memory in bytes.
        need: u64,
        /// MemAvailable in bytes.
        available: u64,
    },
    /// More than the free huge-page pool.
    #[error(
        "guest needs {} of huge pages, the pool has {} free; reserve more in /proc/sys/vm/nr_hugepages or use another --backing",
        human_bytes(*need),
        human_bytes(*free)
    )]
    HugePages {
        /// Guest memory in bytes.
        need: u64,
        /// Free huge-page memory in bytes.
        free: u64,
    },
}

/// What the host can give, from `/proc/meminfo`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct HostMemory {
    /// MemAvailable, bytes.
    pub available: u64,
    /// HugePages_Free × Hugepagesize, bytes.
    pub huge_free: u64,
}

impl HostMemory {
    /// Reads `/proc/meminfo`; `None` where it cannot be read (then nothing
    /// is refused here and the kernel decides).
    pub fn read() -> Option<Self> {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .map(|t| Self::parse(&t))
    }

    fn parse(meminfo: &str) -> Self {
        let field = |name: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        HostMemory {
            available: field("MemAvailable").saturating_mul(1024),
            huge_free: field("HugePages_Free")
                .saturating_mul(field("Hugepagesize").saturating_mul(1024)),
        }
    }

    /// Whether a guest of `need` bytes on `backing` fits.
    pub fn admit(&self, need: u64, backing: Backing) -> Result<(), AdmissionError> {
        match backing {
            Backing::Hugetlb if need > self.huge_free => Err(AdmissionError::HugePages {
                need,
                free: self.huge_free,
            }),
            Backing::Hugetlb => Ok(()),
            _ if need > self.available => Err(AdmissionError::Memory {
                need,
                available: self.available,
            }),
            _ => Ok(()),
        }
    }
}

/// Refuses a guest that cannot fit on this host (see the module docs).
pub fn admit(need: u64, backing: Backing) -> Result<(), AdmissionError> {
    HostMemory::read().map_or(Ok(()), |h| h.admit(need, backing))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24000000 kB\nMemAvailable:   23697817 kB\nHugePages_Free:       64\nHugepagesize:       2048 kB\n";

    #[test]
    fn too_big_is_refused_with_both_sizes() {
        let host = HostMemory::parse(MEMINFO);
        assert_eq!(host.huge_free, 128 << 20);
        let err = host.admit(64 << 30, Backing::Thp).unwrap_err().to_string();
        assert!(
            err.starts_with("guest needs 64.0 GiB, this host has 22.6 GiB available"),
            "{err}"
        );
        assert!(host.admit(1 << 30, Backing::Thp).is_ok());
        let err = host.admit(1 << 30, Backing::Hugetlb).unwrap_err();
        assert!(matches!(err, AdmissionError::HugePages { .. }), "{err}");
    }
}
