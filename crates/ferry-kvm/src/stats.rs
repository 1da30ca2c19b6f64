//! What KVM itself counts for a vCPU: its binary statistics
//! (`KVM_GET_STATS_FD`, Linux 5.14 on), such as `exits`, `pf_fixed` (the
//! second-level page faults it fixed, write-protect faults of dirty
//! logging among them), `signal_exits`, `irq_exits` and `halt_exits`.
//!
//! A VMM sees only the exits that reach userspace; these say what the
//! vCPU did inside KVM_RUN, which is where a throttled guest's time goes
//! when it makes no progress. KVM names the statistics itself, so the
//! list differs by kernel and architecture; this reads every counter it
//! offers and leaves the choice to the caller.
//!
//! The file's layout (Documentation/virt/kvm/api.rst, 4.133): a header,
//! then an id string, then one descriptor per statistic (flags, exponent,
//! size in u64 elements, offset into the data block, bucket size, then its
//! name in `name_size` bytes), then the data block of u64 values.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// What went wrong reading KVM's statistics.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The kernel has no binary statistics (before Linux 5.14), or refused.
    #[error("KVM_GET_STATS_FD failed")]
    Open(#[source] vmm_sys_util::errno::Error),
    /// Reading the statistics file failed.
    #[error("reading KVM's statistics at offset {offset}")]
    Read {
        /// Where in the file.
        offset: u64,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file does not have the documented layout.
    #[error("KVM's statistics are malformed: {0}")]
    Malformed(String),
}

/// One counter's place in the data block.
#[derive(Debug, Clone, PartialEq)]
struct Counter {
    name: String,
    /// Byte offset of its value from the start of the file.
    at: u64,
}

/// A vCPU's (or a VM's) statistics file, its layout read once.
#[derive(Debug)]
pub struct KvmStats {
    file: File,
    counters: Vec<Counter>,
}

/// The header's size: six u32 (`struct kvm_stats_header`).
const HEADER_LEN: usize = 24;
/// A descriptor's size before its name (`struct kvm_stats_desc`).
const DESC_LEN: usize = 16;
/// A statistic's type, in its flags: a count that only grows.
const TYPE_MASK: u32 = kvm_bindings::KVM_STATS_TYPE_MASK;
const CUMULATIVE: u32 = kvm_bindings::KVM_STATS_TYPE_CUMULATIVE;
/// More descriptors than any kernel has (about 60 per x86 vCPU): a bound
/// on what a malformed header can make this read.
const MAX_DESCS: u32 = 4096;

impl KvmStats {
    /// The statistics of `vcpu`.
    pub fn of_vcpu(vcpu: &kvm_ioctls::VcpuFd) -> Result<Self, StatsError> {
        let file = crate::ioctls::stats_fd(vcpu).map_err(StatsError::Open)?;
        let counters = layout(|offset, buf| {
            file.read_exact_at(buf, offset)
                .map_err(|source| StatsError::Read { offset, source })
        })?;
        Ok(KvmStats { file, counters })
    }

    /// Every cumulative counter's value now, by KVM's name (a histogram or
    /// an instant value, such as `guest_mode`, is left out), in one read of
    /// the span that holds them.
    pub fn read(&self) -> Result<BTreeMap<String, u64>, StatsError> {
        let (Some(first), Some(end)) = (
            self.counters.iter().map(|c| c.at).min(),
            self.counters.iter().map(|c| c.at + 8).max(),
        ) else {
            return Ok(BTreeMap::new());
        };
        let mut span = vec![0u8; (end - first) as usize];
        self.file
            .read_exact_at(&mut span, first)
            .map_err(|source| StatsError::Read {
                offset: first,
                source,
            })?;
        let value = |at: u64| {
            let i = (at - first) as usize;
            u64::from_ne_bytes(span[i..i + 8].try_into().expect("8 bytes"))
        };
        Ok(self
            .counters
            .iter()
            .map(|c| (c.name.clone(), value(c.at)))
            .collect())
    }
}

/// Reads the header and descriptors through `read_at(offset, buf)`, and
/// returns where each cumulative single-value counter is.
fn layout(
    read_at: impl Fn(u64, &mut [u8]) -> Result<(), StatsError>,
) -> Result<Vec<Counter>, StatsError> {
    let mut header = [0u8; HEADER_LEN];
    read_at(0, &mut header)?;
    let field =
        |i: usize| u32::from_ne_bytes(header[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let (name_size, num_desc, desc_offset, data_offset) = (field(1), field(2), field(4), field(5));
    if num_desc > MAX_DESCS {
        return Err(StatsError::Malformed(format!(
            "{num_desc} descriptors (at most {MAX_DESCS} expected)"
        )));
    }
    if name_size == 0 || name_size > 4096 {
        return Err(StatsError::Malformed(format!("a name size of {name_size}")));
    }
    let entry = DESC_LEN + name_size as usize;
    let mut descs = vec![0u8; entry * num_desc as usize];
    read_at(u64::from(desc_offset), &mut descs)?;
    let mut counters = Vec::new();
    for d in descs.chunks_exact(entry) {
        let u32_at = |i: usize| u32::from_ne_bytes(d[i..i + 4].try_into().expect("4 bytes"));
        let (flags, size, offset) = (u32_at(0), u16::from_ne_bytes([d[6], d[7]]), u32_at(8));
        let name = &d[DESC_LEN..];
        let name = String::from_utf8_lossy(
            &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())],
        )
        .into_owned();
        if flags & TYPE_MASK != CUMULATIVE || size != 1 {
            continue;
        }
        counters.push(Counter {
            name,
            at: u64::from(data_offset) + u64::from(offset),
        });
    }
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A statistics file as the kernel lays it out, with the descriptors
    /// `(flags, size, offset, name)`.
    fn file_with(name_size: u32, descs: &[(u32, u16, u32, &str)]) -> Vec<u8> {
        let desc_offset = (HEADER_LEN + 8) as u32; // after an 8-byte id
        let data_offset = desc_offset + descs.len() as u32 * (DESC_LEN as u32 + name_size);
        let mut f = Vec::new();
        for v in [
            0,
            name_size,
            descs.len() as u32,
            HEADER_LEN as u32,
            desc_offset,
            data_offset,
        ] {
            f.extend(v.to_ne_bytes());
        }
        f.extend(b"kvm-1/0\0");
        for (flags, size, offset, name) in descs {
            f.extend(flags.to_ne_bytes());
            f.extend(0i16.to_ne_bytes());
            f.extend(size.to_ne_bytes());
            f.extend(offset.to_ne_bytes());
            f.extend(0u32.to_ne_bytes());
            let mut n = name.as_bytes().to_vec();
            n.resize(name_size as usize, 0);
            f.extend(n);
        }
        f
    }

    fn read_from(f: &[u8]) -> impl Fn(u64, &mut [u8]) -> Result<(), StatsError> + '_ {
        move |offset, buf| {
            let at = offset as usize;
            match f.get(at..at + buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    Ok(())
                }
                None => Err(StatsError::Read {
                    offset,
                    source: std::io::ErrorKind::UnexpectedEof.into(),
                }),
            }
        }
    }

    #[test]
    fn finds_the_cumulative_counters_and_skips_the_rest() {
        let instant = kvm_bindings::KVM_STATS_TYPE_INSTANT;
        let f = file_with(
            32,
            &[
                (CUMULATIVE, 1, 0, "exits"),
                (instant, 1, 8, "guest_mode"),
                (CUMULATIVE, 1, 16, "pf_fixed"),
                (
                    kvm_bindings::KVM_STATS_TYPE_LOG_HIST,
                    32,
                    24,
                    "halt_wait_hist",
                ),
            ],
        );
        let data = f.len() as u64;
        let counters = layout(read_from(&f)).unwrap();
        assert_eq!(
            counters,
            vec![
                Counter {
                    name: "exits".into(),
                    at: data
                },
                Counter {
                    name: "pf_fixed".into(),
                    at: data + 16
                },
            ]
        );
    }

    #[test]
    fn a_malformed_header_is_refused_not_followed() {
        let mut f = file_with(32, &[(CUMULATIVE, 1, 0, "exits")]);
        f[8..12].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(matches!(
            layout(read_from(&f)),
            Err(StatsError::Malformed(_))
        ));
        let f = file_with(32, &[(CUMULATIVE, 1, 0, "exits")]);
        let cut = &f[..f.len() - 10];
        assert!(matches!(
            layout(read_from(cut)),
            Err(StatsError::Read { .. })
        ));
    }

    #[test]
    fn a_vcpu_counts_its_exits() {
        if !crate::require_kvm("a_vcpu_counts_its_exits") {
            return;
        }
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let stats = KvmStats::of_vcpu(&vcpu).unwrap();
        let values = stats.read().unwrap();
        assert!(values.contains_key("exits"), "{values:?}");
        assert!(values.contains_key("pf_fixed"), "{values:?}");
    }
}
