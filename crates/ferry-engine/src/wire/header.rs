//! The stream header: everything the destination must know to build the VM
//! before the first page arrives, and to refuse a stream it cannot take.
//!
//! It is JSON inside a checksummed frame: read once, and easy to extend
//! without a format version bump for every new workload field.

use ferry_backend::types::human_bytes;
use ferry_backend::{BackendKind, MemoryLayout, Vm, VmConfig, WorkloadError, PAGE_SIZE};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// What the source announces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamHeader {
    /// The whole VM configuration (backend, workload, backing).
    pub config: VmConfig,
    /// The guest-physical layout the source runs.
    pub layout: MemoryLayout,
    /// Bytes of guest RAM.
    pub memory_bytes: u64,
    /// vCPU count.
    pub vcpus: u32,
    /// Page size of the page batches.
    pub page_size: u32,
    /// The source's dirty-tracking method, for the record.
    pub dirty_tracking: String,
}

/// What the destination expects of a stream, checked before any VM is built.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpectedVm {
    /// Bytes of guest memory the destination has room for.
    pub memory_bytes: Option<u64>,
    /// vCPUs the destination will run.
    pub vcpus: Option<u32>,
    /// Backend the destination runs.
    pub backend: Option<BackendKind>,
}

/// A header the destination cannot take.
#[derive(Debug, Error)]
pub enum HeaderError {
    /// Not JSON of the right shape.
    #[error("cannot parse the stream header")]
    Parse(#[source] serde_json::Error),
    /// The header contradicts itself.
    #[error("stream header is inconsistent: {0}")]
    Inconsistent(String),
    /// The workload in the header cannot be run.
    #[error("stream header carries a workload that cannot run")]
    Workload(#[source] WorkloadError),
    /// Different memory size.
    #[error(
        "destination has {} of guest memory, stream carries {}",
        human_bytes(*dest),
        human_bytes(*stream)
    )]
    MemorySize {
        /// Destination bytes.
        dest: u64,
        /// Stream bytes.
        stream: u64,
    },
    /// Different vCPU count.
    #[error("destination has {dest} vCPUs, stream carries {stream}")]
    Vcpus {
        /// Destination vCPUs.
        dest: u32,
        /// Stream vCPUs.
        stream: u32,
    },
    /// Different backend.
    #[error("stream comes from a {stream} VM but the destination runs {dest}: both ends must use the same backend")]
    Backend {
        /// Destination backend.
        dest: BackendKind,
        /// Stream backend.
        stream: BackendKind,
    },
    /// Same size, different slots.
    #[error("destination memory slots {dest:?} differ from the stream's {stream:?}")]
    Layout {
        /// Destination slot sizes.
        dest: Vec<u64>,
        /// Stream slot sizes.
        stream: Vec<u64>,
    },
}

impl StreamHeader {
    /// The header describing `vm`.
    pub fn for_vm(vm: &dyn Vm) -> Self {
        let config = vm.config().clone();
        let layout = config.layout();
        StreamHeader {
            memory_bytes: vm.ram().size(),
            vcpus: config.workload.vcpus,
            page_size: PAGE_SIZE as u32,
            dirty_tracking: vm.dirty_tracking(),
            layout,
            config,
        }
    }

    /// The JSON payload.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses a payload and checks that it is self-consistent.
    pub fn decode(payload: &[u8]) -> Result<Self, HeaderError> {
        let h: StreamHeader = serde_json::from_slice(payload).map_err(HeaderError::Parse)?;
        h.validate()?;
        Ok(h)
    }

    /// Guest pages.
    pub fn pages(&self) -> u64 {
        self.memory_bytes / PAGE_SIZE as u64
    }

    fn validate(&self) -> Result<(), HeaderError> {
        let bad = |s: String| Err(HeaderError::Inconsistent(s));
        if self.page_size as usize != PAGE_SIZE {
            return bad(format!(
                "{}-byte pages, this ferry uses {PAGE_SIZE}",
                self.page_size
            ));
        }
        self.config
            .workload
            .validate()
            .map_err(HeaderError::Workload)?;
        if self.layout != self.config.layout() {
            return bad("the layout does not follow from the workload".into());
        }
        if self.memory_bytes != self.layout.total_bytes() {
            return bad(format!(
                "{} bytes of memory but a layout of {}",
                self.memory_bytes,
                self.layout.total_bytes()
            ));
        }
        if self.vcpus != self.config.workload.vcpus {
            return bad(format!(
                "{} vCPUs but a workload of {}",
                self.vcpus, self.config.workload.vcpus
            ));
        }
        Ok(())
    }

    /// Checks the header against what the destination was told to expect.
    pub fn check_expected(&self, expect: &ExpectedVm) -> Result<(), HeaderError> {
        if let Some(dest) = expect.memory_bytes.filter(|&m| m != self.memory_bytes) {
            return Err(HeaderError::MemorySize {
                dest,
                stream: self.memory_bytes,
            });
        }
        if let Some(dest) = expect.vcpus.filter(|&v| v != self.vcpus) {
            return Err(HeaderError::Vcpus {
                dest,
                stream: self.vcpus,
            });
        }
        if let Some(dest) = expect.backend.filter(|&b| b != self.config.backend) {
            return Err(HeaderError::Backend {
                dest,
                stream: self.config.backend,
            });
        }
        Ok(())
    }

    /// Checks the VM the destination built against the header.
    pub fn check_destination(&self, vm: &dyn Vm) -> Result<(), HeaderError> {
        let cfg = vm.config();
        self.check_expected(&ExpectedVm {
            memory_bytes: Some(vm.ram().size()),
            vcpus: Some(cfg.workload.vcpus),
            backend: Some(cfg.backend),
        })?;
        let dest: Vec<u64> = vm.ram().slots().iter().map(|s| s.size).collect();
        let stream = self.layout.slot_sizes().to_vec();
        if dest != stream {
            return Err(HeaderError::Layout { dest, stream });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_backend::{Backing, Workload};

    fn header() -> StreamHeader {
        let config = VmConfig {
            backend: BackendKind::Soft,
            workload: Workload {
                vcpus: 2,
                bytes_per_vcpu: 4 << 20,
                ..Workload::default()
            },
            backing: Backing::Anonymous,
        };
        let layout = config.layout();
        StreamHeader {
            memory_bytes: layout.total_bytes(),
            vcpus: 2,
            page_size: PAGE_SIZE as u32,
            dirty_tracking: "bitmap".into(),
            layout,
            config,
        }
    }

    #[test]
    fn header_round_trips() {
        let h = header();
        assert_eq!(StreamHeader::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn mismatches_say_what_differs() {
        let h = header();
        let err = h
            .check_expected(&ExpectedVm {
                memory_bytes: Some(1 << 30),
                ..ExpectedVm::default()
            })
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "destination has 1.0 GiB of guest memory, stream carries 10.0 MiB"
        );
        let err = h
            .check_expected(&ExpectedVm {
                vcpus: Some(4),
                ..ExpectedVm::default()
            })
            .unwrap_err()
            .to_string();
        assert_eq!(err, "destination has 4 vCPUs, stream carries 2");
        let err = h
            .check_expected(&ExpectedVm {
                backend: Some(BackendKind::Kvm),
                ..ExpectedVm::default()
            })
            .unwrap_err();
        assert!(matches!(err, HeaderError::Backend { .. }));
        assert!(h.check_expected(&ExpectedVm::default()).is_ok());
    }

    #[test]
    fn crafted_huge_sizes_are_refused_not_overflowed() {
        for (vcpus, bytes_per_vcpu) in [(64, !((2u64 << 20) - 1)), (2, 1 << 63), (64, 1 << 58)] {
            let mut h = header();
            h.config.workload.vcpus = vcpus;
            h.vcpus = vcpus;
            h.config.workload.bytes_per_vcpu = bytes_per_vcpu;
            let err = StreamHeader::decode(&h.encode()).unwrap_err();
            assert!(matches!(err, HeaderError::Workload(_)), "{err}");
        }
    }

    #[test]
    fn inconsistent_or_garbage_headers_are_refused() {
        let mut h = header();
        h.memory_bytes += 4096;
        assert!(matches!(
            StreamHeader::decode(&h.encode()),
            Err(HeaderError::Inconsistent(_))
        ));
        let mut h = header();
        h.config.workload.vcpus = 0;
        h.vcpus = 0;
        assert!(StreamHeader::decode(&h.encode()).is_err());
        assert!(matches!(
            StreamHeader::decode(b"\xff\x00{"),
            Err(HeaderError::Parse(_))
        ));
    }
}
