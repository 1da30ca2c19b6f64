//! Device state as named, versioned sections: QEMU's vmstate model, in the
//! shape of Firecracker's `Persist`.
//!
//! A VMM describes each kind of state it migrates with a [`SectionSpec`]: a
//! name (`serial`, `virtio-blk`), the version it saves, the oldest version
//! it can still load, the subsections it knows, and the instances it has.
//! At the switchover, once the VM is paused, the source's VMM saves one
//! [`Section`] per instance; a subsection goes along only when it is needed
//! (state that is usually at its default, or that only a newer VMM has), so
//! an older destination can still load the section when it is absent.
//!
//! ```text
//!   stream header:  sections [ {serial, 0, v2}, {virtio-blk, 0, v1} ]   ← refused here, before any memory,
//!                                                                          if a name or version cannot load
//!   switchover:     Sections [ serial#0 v2 data [+ "fifo" subsection],  ← refused here if a subsection
//!                              virtio-blk#0 v1 data ]                      is unknown
//! ```
//!
//! The destination's VMM restores from the bytes and from what it holds
//! itself (its own fds, paths, the disk image it opened): the arguments
//! Firecracker passes to `Persist::restore` are the destination VM's own
//! fields here, since its factory built it from the stream header.

use serde::{Deserialize, Serialize};

/// A section of one instance, as a stream names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SectionId {
    /// What kind of state (`serial`, `virtio-blk`, ...).
    pub name: String,
    /// Which device of that kind (0 for the first).
    pub instance: u32,
    /// The format version of its data. A VMM saving a section may leave
    /// it 0: the engine sets its spec's version.
    pub version: u32,
}

impl std::fmt::Display for SectionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "'{}' instance {}", self.name, self.instance)
    }
}

/// What a VMM saves and loads of one kind of state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionSpec {
    /// The section's name.
    pub name: String,
    /// The version this VMM saves, and the newest it loads.
    pub version: u32,
    /// The oldest version this VMM loads.
    pub min_version: u32,
    /// The subsections this VMM knows; a stream carrying another is refused.
    pub subsections: Vec<String>,
    /// The instances this VM has (saved in this order).
    pub instances: Vec<u32>,
    /// The most one instance's saved state (its data and subsections)
    /// takes, in bytes, if the VMM knows. A destination checks it against
    /// what it takes before any memory moves, and a source whose state
    /// outgrows it at the pause fails there, naming the section, and runs
    /// on. Device state that may outgrow one frame (32 MiB) must declare
    /// it: the source then sends it in parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

impl SectionSpec {
    /// One instance (0) of `name` at `version`, loading `min_version`
    /// onwards, with no subsections.
    pub fn new(name: &str, version: u32, min_version: u32) -> Self {
        SectionSpec {
            name: name.into(),
            version,
            min_version,
            subsections: Vec::new(),
            instances: vec![0],
            max_bytes: None,
        }
    }

    /// The same, its state declared to take at most `bytes` per instance.
    pub fn with_max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// The most all its instances take, as declared (`None`: undeclared).
    pub fn declared_bytes(&self) -> Option<u64> {
        self.max_bytes
            .map(|b| b.saturating_mul(self.instances.len() as u64))
    }

    /// The same, knowing `subsection` too.
    pub fn with_subsection(mut self, subsection: &str) -> Self {
        self.subsections.push(subsection.into());
        self
    }

    /// The same, with these instances.
    pub fn with_instances(mut self, instances: Vec<u32>) -> Self {
        self.instances = instances;
        self
    }

    /// Whether this VMM loads data of `version`.
    pub fn loads(&self, version: u32) -> bool {
        (self.min_version..=self.version).contains(&version)
    }

    /// The ids of the sections a source with this spec saves.
    pub fn ids(&self) -> impl Iterator<Item = SectionId> + '_ {
        self.instances.iter().map(|&instance| SectionId {
            name: self.name.clone(),
            instance,
            version: self.version,
        })
    }
}

/// Optional state inside a section, sent only when needed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subsection {
    /// Its name, unique within the section.
    pub name: String,
    /// Its bytes, in the VMM's own format.
    pub data: Vec<u8>,
}

/// One instance's saved state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// Which section, and the version of `data`.
    pub id: SectionId,
    /// Its bytes, in the VMM's own format.
    pub data: Vec<u8>,
    /// Subsections that were needed this time.
    pub subsections: Vec<Subsection>,
}

impl Section {
    /// Instance 0 of `name`, holding `data`. Its version is its spec's
    /// ([`SectionSpec::version`]): the engine sets it as the section is
    /// sent, so a VMM states each version once.
    pub fn new(name: &str, data: Vec<u8>) -> Self {
        Section {
            id: SectionId {
                name: name.into(),
                instance: 0,
                version: 0,
            },
            data,
            subsections: Vec::new(),
        }
    }

    /// Instance 0 of `name`, holding `state` serialized (JSON: made for
    /// register-sized state; a large blob is better raw bytes through
    /// [`Section::new`]). [`Section::decode`] reads it back.
    pub fn encode<T: Serialize>(name: &str, state: &T) -> Result<Self, crate::VmError> {
        let data = serde_json::to_vec(state).map_err(|e| crate::VmError::BadSection {
            section: format!("'{name}'"),
            reason: format!("cannot be serialized: {e}"),
        })?;
        Ok(Section::new(name, data))
    }

    /// The state [`Section::encode`] saved, or why it cannot be read
    /// ([`crate::VmError::BadSection`], naming the section).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, crate::VmError> {
        serde_json::from_slice(&self.data).map_err(|e| crate::VmError::BadSection {
            section: self.id.to_string(),
            reason: format!("not the state this VMM saves: {e}"),
        })
    }

    /// The same, for `instance`.
    pub fn instance(mut self, instance: u32) -> Self {
        self.id.instance = instance;
        self
    }

    /// The same, carrying subsection `name` this time.
    pub fn with_subsection(mut self, name: &str, data: Vec<u8>) -> Self {
        self.subsections.push(Subsection {
            name: name.into(),
            data,
        });
        self
    }

    /// The subsection `name`, if it was sent.
    pub fn subsection(&self, name: &str) -> Option<&[u8]> {
        self.subsections
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.data.as_slice())
    }
}

/// Device state sent while the guest runs (QEMU's iterative save, VFIO's
/// pre-copy): a capability a VMM implements only for devices with large
/// state that changes little at a time. [`crate::Vm::live_state`] hands it
/// to the engine.
///
/// Each live section is a stream of chunks in the VMM's format: during the
/// precopy rounds the source sends what [`LiveState::save`] has ready,
/// and the destination passes each chunk, in order, to
/// [`LiveState::load`]; at the pause, the section's [`Section`] from
/// `save_sections` carries the rest (what is still pending), and
/// `restore_sections` loads it last. The switchover rule counts
/// [`LiveState::pending`] with the dirty memory, so the downtime promise
/// holds with large device state.
pub trait LiveState {
    /// The sections that send live (each also among `state_sections`).
    fn live_sections(&self) -> Vec<SectionId>;
    /// The bytes `id` has pending: what its save at the pause would carry
    /// if the pause came now.
    fn pending(&self, id: &SectionId) -> u64;
    /// A chunk of `id`'s state ready to send, at most `max` bytes (empty:
    /// nothing more now). What it covers is no longer pending, until the
    /// device changes it again.
    fn save(&mut self, id: &SectionId, max: usize) -> Result<Vec<u8>, crate::VmError>;
    /// Destination: the next chunk of `id`'s stream, in the order sent.
    fn load(&mut self, id: &SectionId, chunk: &[u8]) -> Result<(), crate::VmError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Uart {
        lcr: u8,
        fifo: Vec<u8>,
    }

    #[test]
    fn serde_state_round_trips() {
        let state = Uart {
            lcr: 3,
            fifo: b"hi".to_vec(),
        };
        let s = Section::encode("uart", &state).unwrap().instance(1);
        assert_eq!((s.id.instance, s.id.version), (1, 0));
        assert_eq!(s.decode::<Uart>().unwrap(), state);
    }

    #[test]
    fn foreign_bytes_name_the_section() {
        let s = Section::new("uart", b"not json".to_vec());
        let e = s.decode::<Uart>().unwrap_err().to_string();
        assert!(e.contains("'uart' instance 0"), "{e}");
    }
}
