//! The stream header: everything the destination must know to build the VM
//! before the first page arrives, and to refuse a stream it cannot take.
//!
//! It describes the VM as the engine sees it: which VMM built it (a
//! free-form id), vCPU count, memory regions (holes allowed) and page size. What the VMM needs
//! to build the destination VM (its own configuration) travels as JSON the
//! engine carries to the destination's VM factory without reading it; a new
//! VMM or guest is then new JSON, not a new stream format. Every size from the wire is
//! checked with checked arithmetic before it sizes anything.
//!
//! JSON inside a checksummed frame: read once, and easy to extend.

use ferry_vm::types::human_bytes;
use ferry_vm::{Vm, PAGE_SIZE};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Most memory regions a header may describe.
pub const MAX_SLOTS: usize = 64;
/// Most vCPUs a header may describe.
pub const MAX_VCPUS: u32 = 4096;
/// Most guest memory a header may describe (16 TiB).
pub const MAX_MEMORY_BYTES: u64 = 16 << 40;

/// Builds the VM a stream header (or a snapshot's, which is the same)
/// describes: from the VMM it names ([`StreamHeader::vmm`]) and the VMM's
/// own configuration ([`StreamHeader::vmm_config`]). The engine then
/// checks the VM against the header's vCPUs and memory slots. A migration's
/// destination (`receive`) and a snapshot's restore take one; for a VMM
/// with one VM type, `receive_as` and `restore_as` take a factory of that
/// type instead.
pub type CreateVm<'a> =
    dyn FnMut(&StreamHeader) -> Result<Box<dyn ferry_vm::Vm>, ferry_vm::VmError> + 'a;

/// What the source announces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamHeader {
    /// The VMM that built the VM ([`Vm::vmm_id`]); both ends must run the
    /// same, since it names the format of the vCPU state.
    pub vmm: String,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest memory regions, in ascending guest-physical order; the space
    /// between two is a hole, never sent.
    pub regions: Vec<Region>,
    /// Bytes of guest RAM (the regions' sum).
    pub memory_bytes: u64,
    /// Page size of the page batches.
    pub page_size: u32,
    /// The source's dirty-tracking method, for the record.
    pub dirty_tracking: String,
    /// The VMM's own configuration ([`Vm::vmm_config`]), handed to the
    /// destination's VM factory as it came.
    pub vmm_config: serde_json::Value,
    /// The device-state sections the switchover will carry, so that a
    /// destination that cannot load one refuses before any memory moves.
    #[serde(default)]
    pub sections: Vec<ferry_vm::SectionId>,
    /// Wire 6 on: the capabilities this migration may use
    /// ([`super::capabilities`]); the destination answers in Accept. Absent
    /// on wire 5, whose peers have them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<String>>,
    /// What each instance of a section may take, by section name, where
    /// its VMM declared it ([`ferry_vm::SectionSpec::max_bytes`]): the
    /// destination refuses device state larger than it takes before any
    /// memory moves. Absent when none is declared (and from older sources).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub section_bytes: std::collections::BTreeMap<String, u64>,
    /// What the guest was given of its host's CPU ([`Vm::cpu_profile`]),
    /// for the destination's [`Vm::check_cpu`] before any memory moves.
    /// A destination older than this field ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<serde_json::Value>,
    /// Whether the VM keeps vCPU state outside its sections
    /// ([`ferry_vm::VcpuState`]): a destination that differs refuses
    /// before any memory moves. Absent (an older source): it does.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub vcpu_state: bool,
}

/// One region of guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// First guest-physical address.
    pub gpa: u64,
    /// Bytes.
    pub bytes: u64,
}

impl std::fmt::Display for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}+{}", self.gpa, human_bytes(self.bytes))
    }
}

/// The regions of `ram`.
pub fn regions_of(ram: &ferry_vm::GuestRam) -> Vec<Region> {
    ram.slots()
        .iter()
        .map(|s| Region {
            gpa: s.gpa.0,
            bytes: s.size,
        })
        .collect()
}

fn list(regions: &[Region]) -> String {
    let all: Vec<String> = regions.iter().map(Region::to_string).collect();
    format!("[{}]", all.join(", "))
}

/// What the destination expects of a stream, checked before any VM is built.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpectedVm {
    /// Bytes of guest memory the destination has room for.
    pub memory_bytes: Option<u64>,
    /// vCPUs the destination will run.
    pub vcpus: Option<u32>,
    /// The VMM id the destination builds VMs for.
    pub vmm: Option<String>,
}

/// A header the destination cannot take.
#[non_exhaustive]
#[derive(Debug, Error)]
pub enum HeaderError {
    /// The two VMs differ in keeping vCPU state ([`ferry_vm::VcpuState`]).
    #[error("{0}")]
    VcpuState(String),
    /// Not JSON of the right shape.
    #[error("cannot parse the stream header")]
    Parse(#[source] serde_json::Error),
    /// The header contradicts itself, or is out of range.
    #[error("stream header is inconsistent: {0}")]
    Inconsistent(String),
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
    /// A VM of another VMM.
    #[error("stream comes from a {stream} VM but the destination runs {dest}: both ends must use the same VMM")]
    Vmm {
        /// The destination's VMM id.
        dest: String,
        /// The stream's VMM id.
        stream: String,
    },
    /// A section the destination VM cannot load.
    #[error(transparent)]
    Section(#[from] crate::wire::SectionError),
    /// Same size, different regions.
    #[error("destination memory regions {} differ from the stream's {}", list(.dest), list(.stream))]
    Layout {
        /// Destination regions.
        dest: Vec<Region>,
        /// Stream regions.
        stream: Vec<Region>,
    },
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl StreamHeader {
    /// The header describing `vm`.
    pub fn for_vm(vm: &mut dyn Vm) -> Self {
        StreamHeader {
            vmm: vm.vmm_id().to_string(),
            vcpus: vm.vcpus(),
            regions: regions_of(vm.ram()),
            memory_bytes: vm.ram().size(),
            page_size: PAGE_SIZE as u32,
            dirty_tracking: ferry_vm::dirty_tracking(vm).to_string(),
            vmm_config: vm.vmm_config(),
            sections: crate::wire::sections::manifest(&vm.state_sections()),
            section_bytes: crate::wire::sections::declared(&vm.state_sections()),
            capabilities: None,
            cpu: vm.cpu_profile(),
            vcpu_state: vm.vcpu_state().is_some(),
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

    /// The frames guest memory spans, holes included: frames are numbered
    /// `0..pages()`, as in [`ferry_vm::GuestRam::pages`].
    pub fn pages(&self) -> u64 {
        self.regions
            .last()
            .map_or(0, |r| (r.gpa + r.bytes) / PAGE_SIZE as u64)
    }

    fn validate(&self) -> Result<(), HeaderError> {
        let bad = |s: String| Err(HeaderError::Inconsistent(s));
        if self.page_size as usize != PAGE_SIZE {
            return bad(format!(
                "{}-byte pages, this ferry uses {PAGE_SIZE}",
                self.page_size
            ));
        }
        if !(1..=MAX_VCPUS).contains(&self.vcpus) {
            return bad(format!("{} vCPUs, expected 1 to {MAX_VCPUS}", self.vcpus));
        }
        if self.sections.len() > crate::wire::sections::MAX_SECTIONS {
            return bad(format!("{} sections", self.sections.len()));
        }
        if self.regions.is_empty() || self.regions.len() > MAX_SLOTS {
            return bad(format!(
                "{} memory regions, expected 1 to {MAX_SLOTS}",
                self.regions.len()
            ));
        }
        let page = PAGE_SIZE as u64;
        let (mut total, mut end) = (0u64, 0u64);
        for (i, r) in self.regions.iter().enumerate() {
            if r.bytes == 0 || r.bytes % page != 0 || r.gpa % page != 0 {
                return bad(format!("region {i} ({r}) is not whole pages"));
            }
            if r.gpa < end {
                return bad(format!(
                    "region {i} ({r}) starts below the end of the one before"
                ));
            }
            end = match r.gpa.checked_add(r.bytes) {
                Some(e) if e <= MAX_MEMORY_BYTES => e,
                _ => {
                    return bad(format!(
                        "the regions reach past {}",
                        human_bytes(MAX_MEMORY_BYTES)
                    ))
                }
            };
            total += r.bytes;
        }
        if total != self.memory_bytes {
            return bad(format!(
                "{} bytes of memory but regions of {total}",
                self.memory_bytes
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
        if let Some(dest) = expect.vmm.as_ref().filter(|&v| *v != self.vmm) {
            return Err(HeaderError::Vmm {
                dest: dest.clone(),
                stream: self.vmm.clone(),
            });
        }
        Ok(())
    }

    /// Checks the VM the destination built against the header.
    pub fn check_destination(&self, vm: &mut dyn Vm) -> Result<(), HeaderError> {
        self.check_expected(&ExpectedVm {
            memory_bytes: Some(vm.ram().size()),
            vcpus: Some(vm.vcpus()),
            vmm: Some(vm.vmm_id().to_string()),
        })?;
        let dest = regions_of(vm.ram());
        if dest != self.regions {
            return Err(HeaderError::Layout {
                dest,
                stream: self.regions.clone(),
            });
        }
        crate::wire::sections::check_manifest(&self.sections, &vm.state_sections())?;
        let here = vm.vcpu_state().is_some();
        if here != self.vcpu_state {
            let keeps = |yes: bool| if yes { "keeps" } else { "keeps no" };
            return Err(HeaderError::VcpuState(format!(
                "the source's VM {} vCPU state outside its sections, and this one {}",
                keeps(self.vcpu_state),
                keeps(here)
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> StreamHeader {
        StreamHeader {
            vmm: "test-vmm".into(),
            vcpus: 2,
            regions: vec![
                Region {
                    gpa: 0,
                    bytes: 2 << 20,
                },
                Region {
                    gpa: 4 << 20,
                    bytes: 8 << 20,
                },
            ],
            memory_bytes: 10 << 20,
            page_size: PAGE_SIZE as u32,
            dirty_tracking: "bitmap".into(),
            vmm_config: serde_json::json!({"vcpus": 2}),
            sections: Vec::new(),
            section_bytes: Default::default(),
            vcpu_state: true,
            capabilities: None,
            cpu: None,
        }
    }

    #[test]
    fn header_round_trips_and_carries_the_vmm_config_untouched() {
        let h = header();
        assert_eq!(StreamHeader::decode(&h.encode()).unwrap(), h);
        // Configuration the engine knows nothing about travels as it came.
        let mut other = header();
        other.vmm_config = serde_json::json!({"program": "anything", "x": [1, 2]});
        assert_eq!(StreamHeader::decode(&other.encode()).unwrap(), other);
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
                vmm: Some("other-vmm".into()),
                ..ExpectedVm::default()
            })
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "stream comes from a test-vmm VM but the destination runs other-vmm: \
             both ends must use the same VMM"
        );
        assert!(h.check_expected(&ExpectedVm::default()).is_ok());
    }

    #[test]
    fn crafted_huge_sizes_are_refused_not_overflowed() {
        for (gpa, bytes) in [
            (0, u64::MAX - 4095),
            (1 << 63, 1 << 63),
            (MAX_MEMORY_BYTES, 4096),
            (u64::MAX - 4095, 8192),
        ] {
            let mut h = header();
            h.memory_bytes = bytes;
            h.regions = vec![Region { gpa, bytes }];
            let err = StreamHeader::decode(&h.encode()).unwrap_err();
            assert!(
                matches!(&err, HeaderError::Inconsistent(m) if m.contains("reach past")),
                "{err}"
            );
        }
        let mut h = header();
        h.vcpus = u32::MAX;
        assert!(StreamHeader::decode(&h.encode()).is_err());
        let mut h = header();
        h.regions = (0..=MAX_SLOTS as u64)
            .map(|i| Region {
                gpa: i * 4096,
                bytes: 4096,
            })
            .collect();
        h.memory_bytes = 4096 * (MAX_SLOTS as u64 + 1);
        assert!(StreamHeader::decode(&h.encode()).is_err());
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
        h.vcpus = 0;
        assert!(StreamHeader::decode(&h.encode()).is_err());
        let mut h = header();
        h.regions[0].bytes += 1;
        h.memory_bytes += 1;
        assert!(StreamHeader::decode(&h.encode()).is_err());
        let mut h = header();
        h.regions[1].gpa = 1 << 20;
        assert!(StreamHeader::decode(&h.encode()).is_err());
        assert!(matches!(
            StreamHeader::decode(b"\xff\x00{"),
            Err(HeaderError::Parse(_))
        ));
    }
}
