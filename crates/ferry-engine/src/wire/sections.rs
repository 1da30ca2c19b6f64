//! The device-state sections at the switchover, and the destination's
//! checks of them (see [`ferry_vm::section`] for the model).
//!
//! ```text
//!   Sections frame:  u32 count, then per section
//!     u16 name length, name (UTF-8), u32 instance, u32 version,
//!     u32 data length, data,
//!     u16 subsection count, per subsection: u16 name length, name, u32 length, data
//! ```
//!
//! Little-endian; every length is checked against what is left of the
//! payload before it sizes anything. The destination checks the header's
//! list of sections against what its VM loads before any memory moves
//! ([`check_manifest`]), and the sections that arrive against that list and
//! its subsections ([`check_sections`]); each refusal names the section and
//! both versions.

use ferry_vm::{Section, SectionId, SectionSpec, Subsection};
use std::collections::BTreeMap;
use thiserror::Error;

/// Most sections one stream carries.
pub const MAX_SECTIONS: usize = 4096;
/// The largest part of the sections' payload in one frame, when it goes in
/// parts (capability `section-parts`).
pub const PART_BYTES: usize = 16 << 20;
/// What the encoding adds to each section besides its bytes, at most.
const SECTION_OVERHEAD: u64 = 2 + MAX_NAME as u64 + 4 + 4 + 4 + 2;
/// Longest section or subsection name, in bytes.
pub const MAX_NAME: usize = 255;

/// A section the destination cannot take.
#[non_exhaustive]
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SectionError {
    /// The destination's VMM has no section of that name.
    #[error(
        "section {id} (version {}) is unknown to this VMM, which loads {}",
        id.version,
        name_list(.known)
    )]
    Unknown {
        /// The stream's section.
        id: SectionId,
        /// The names this VMM loads.
        known: Vec<String>,
    },
    /// A version outside the range the destination loads.
    #[error(
        "section {id} is version {}, this VMM loads versions {min} to {max}",
        id.version
    )]
    Version {
        /// The stream's section.
        id: SectionId,
        /// Oldest version the destination loads.
        min: u32,
        /// Newest version the destination loads.
        max: u32,
    },
    /// A subsection the destination does not know.
    #[error(
        "subsection '{subsection}' of section {id} (version {}) is unknown to this VMM, \
         which loads versions {min} to {max} of it{}",
        id.version,
        if .known.is_empty() { " with no subsections".to_string() } else { format!(" with subsections {}", .known.join(", ")) }
    )]
    UnknownSubsection {
        /// The section it came in.
        id: SectionId,
        /// Its name.
        subsection: String,
        /// Oldest version of the section the destination loads.
        min: u32,
        /// Newest version of the section the destination loads.
        max: u32,
        /// The subsections the destination knows.
        known: Vec<String>,
    },
    /// The sections that came differ from those the header announced.
    #[error("the switchover carried {got}, the stream header announced {announced}")]
    NotAnnounced {
        /// What came.
        got: String,
        /// What the header said.
        announced: String,
    },
    /// Bytes that are not a list of sections.
    #[error("malformed sections: {0}")]
    Malformed(String),
    /// The source's VMM saved a section at another version than its spec
    /// states (a VMM leaves a section's version 0 to take its spec's).
    #[error(
        "section {id} was saved as version {}, but its spec states version {stated}",
        id.version
    )]
    SavedVersion {
        /// The section as saved.
        id: SectionId,
        /// The version its spec states.
        stated: u32,
    },
    /// A section may take more than the destination takes.
    #[error(
        "section '{name}' may take up to {} ({} in all its instances), and device state may \
         take {} in all: more than this destination takes ({}, ReceiveOptions::max_device_bytes)",
        human(*.per_instance), human(*.section), human(*.total), human(*.limit)
    )]
    OverLimit {
        /// The section.
        name: String,
        /// What it declares per instance.
        per_instance: u64,
        /// ... and for all its instances.
        section: u64,
        /// What every section declares together.
        total: u64,
        /// What the destination takes.
        limit: u64,
    },
    /// A section saved at the pause took more than its VMM declared.
    #[error(
        "section {id} took {} at the pause, more than the {} its VMM declared \
         (SectionSpec::max_bytes)",
        human(*.bytes), human(*.declared)
    )]
    Outgrew {
        /// The section.
        id: SectionId,
        /// What it took.
        bytes: u64,
        /// What was declared.
        declared: u64,
    },
    /// The device state came to more than one frame holds, and the
    /// destination does not take it in parts.
    #[error(
        "the device state saved at the pause takes {}, more than one frame holds ({}), and \
         this destination does not take it in parts{}",
        human(*.bytes), human(u64::from(super::MAX_FRAME_LEN)),
        if *.declared { "" } else { ": declare each large section's size (SectionSpec::max_bytes) so that the source asks for capability section-parts" }
    )]
    TooLargeForOneFrame {
        /// What it takes.
        bytes: u64,
        /// Whether the sections declared their sizes (and so the source
        /// asked for parts, and was refused).
        declared: bool,
    },
    /// More device state arrived than this destination takes.
    #[error("more than {} of device state arrived, more than this destination takes", human(*.limit))]
    ArrivedOverLimit {
        /// What it takes.
        limit: u64,
    },
}

fn human(bytes: u64) -> String {
    ferry_vm::types::human_bytes(bytes)
}

fn name_list(names: &[String]) -> String {
    if names.is_empty() {
        "no sections".into()
    } else {
        names.join(", ")
    }
}

/// What `specs` declare each instance of a section takes
/// ([`SectionSpec::max_bytes`]), by section name: the header carries it.
pub fn declared(specs: &[SectionSpec]) -> BTreeMap<String, u64> {
    specs
        .iter()
        .filter_map(|s| Some((s.name.clone(), s.max_bytes?)))
        .collect()
}

/// The most the announced sections' payload may take, as declared (an
/// undeclared section counts as its encoding's overhead alone).
fn declared_payload(announced: &[SectionId], declared: &BTreeMap<String, u64>) -> u64 {
    announced.iter().fold(4, |sum, id| {
        let bytes = declared.get(&id.name).copied().unwrap_or(0);
        sum.saturating_add(bytes.saturating_add(SECTION_OVERHEAD))
    })
}

/// The device state the announced sections declare, in all (undeclared
/// sections count nothing).
pub fn declared_total(announced: &[SectionId], declared: &BTreeMap<String, u64>) -> u64 {
    announced
        .iter()
        .filter_map(|id| declared.get(&id.name))
        .fold(0, |sum, b| sum.saturating_add(*b))
}

/// Whether the declared sections may outgrow one frame, so that the source
/// needs its destination to take them in parts.
pub fn may_need_parts(announced: &[SectionId], declared: &BTreeMap<String, u64>) -> bool {
    declared_payload(announced, declared) > u64::from(super::MAX_FRAME_LEN)
}

/// A destination's check, before any memory moves, that the device state
/// the source declares fits in what it takes (`limit` bytes), naming the
/// largest section if it does not.
pub fn check_limit(
    announced: &[SectionId],
    declared: &BTreeMap<String, u64>,
    limit: u64,
) -> Result<(), SectionError> {
    let total = declared_payload(announced, declared);
    if total <= limit {
        return Ok(());
    }
    let instances = |name: &str| announced.iter().filter(|id| id.name == name).count() as u64;
    let (name, per_instance) = declared
        .iter()
        .filter(|(name, _)| instances(name) > 0)
        .max_by_key(|(name, bytes)| bytes.saturating_mul(instances(name)))
        .map(|(n, b)| (n.clone(), *b))
        .unwrap_or_default();
    Err(SectionError::OverLimit {
        section: per_instance.saturating_mul(instances(&name)),
        name,
        per_instance,
        total,
        limit,
    })
}

/// A source's check at the pause: each saved section takes its spec's
/// version (`announced`, where the VMM left it 0; another one is refused),
/// and none took more than declared.
pub fn check_saved(
    sections: &mut [Section],
    announced: &[SectionId],
    declared: &BTreeMap<String, u64>,
) -> Result<(), SectionError> {
    for s in sections.iter_mut() {
        let spec = announced
            .iter()
            .find(|a| a.name == s.id.name && a.instance == s.id.instance);
        match spec {
            Some(a) if s.id.version == 0 => s.id.version = a.version,
            Some(a) if s.id.version != a.version => {
                return Err(SectionError::SavedVersion {
                    id: s.id.clone(),
                    stated: a.version,
                })
            }
            _ => {}
        }
        let bytes = s.data.len() as u64
            + s.subsections
                .iter()
                .map(|sub| sub.data.len() as u64)
                .sum::<u64>();
        if let Some(&max) = declared.get(&s.id.name) {
            if bytes > max {
                return Err(SectionError::Outgrew {
                    id: s.id.clone(),
                    bytes,
                    declared: max,
                });
            }
        }
    }
    Ok(())
}

/// A LiveSection frame's payload: which section, then a chunk of its
/// stream.
///
/// ```text
///   u16 name length, name (UTF-8), u32 instance, u32 version, chunk
/// ```
pub fn encode_live(id: &SectionId, chunk: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + id.name.len() + 8 + chunk.len());
    out.extend_from_slice(&(id.name.len() as u16).to_le_bytes());
    out.extend_from_slice(id.name.as_bytes());
    out.extend_from_slice(&id.instance.to_le_bytes());
    out.extend_from_slice(&id.version.to_le_bytes());
    out.extend_from_slice(chunk);
    out
}

/// The section and chunk of a LiveSection payload, checked against the
/// sections the header `announced`.
pub fn decode_live<'a>(
    payload: &'a [u8],
    announced: &[SectionId],
) -> Result<(SectionId, &'a [u8]), SectionError> {
    let bad = |why: &str| SectionError::Malformed(format!("live section: {why}"));
    let len = payload
        .get(..2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
        .ok_or_else(|| bad("no name length"))?;
    let name = payload
        .get(2..2 + len)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(|| bad("its name is cut short or not UTF-8"))?;
    let at = 2 + len;
    let word = |i: usize| {
        payload
            .get(at + i..at + i + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(|| bad("cut short"))
    };
    let id = SectionId {
        name: name.to_string(),
        instance: word(0)?,
        version: word(4)?,
    };
    if !announced.contains(&id) {
        return Err(SectionError::NotAnnounced {
            got: format!("live {id} v{}", id.version),
            announced: format!("{} sections", announced.len()),
        });
    }
    Ok((id, &payload[at + 8..]))
}

/// The ids a source with `specs` announces.
pub fn manifest(specs: &[SectionSpec]) -> Vec<SectionId> {
    specs.iter().flat_map(SectionSpec::ids).collect()
}

/// Checks a stream's announced sections against what the destination VM
/// loads (`specs`).
pub fn check_manifest(announced: &[SectionId], specs: &[SectionSpec]) -> Result<(), SectionError> {
    for id in announced {
        spec_for(id, specs)?;
    }
    Ok(())
}

fn spec_for<'a>(id: &SectionId, specs: &'a [SectionSpec]) -> Result<&'a SectionSpec, SectionError> {
    let spec = specs
        .iter()
        .find(|s| s.name == id.name)
        .ok_or_else(|| SectionError::Unknown {
            id: id.clone(),
            known: specs.iter().map(|s| s.name.clone()).collect(),
        })?;
    if !spec.loads(id.version) {
        return Err(SectionError::Version {
            id: id.clone(),
            min: spec.min_version,
            max: spec.version,
        });
    }
    Ok(spec)
}

/// Checks the sections that arrived against the header's list and the
/// destination's `specs`.
pub fn check_sections(
    sections: &[Section],
    announced: &[SectionId],
    specs: &[SectionSpec],
) -> Result<(), SectionError> {
    let got: Vec<&SectionId> = sections.iter().map(|s| &s.id).collect();
    if got.len() != announced.len() || got.iter().zip(announced).any(|(g, a)| *g != a) {
        let list = |ids: &mut dyn Iterator<Item = &SectionId>| {
            ids.map(|i| format!("{i} v{}", i.version))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(SectionError::NotAnnounced {
            got: format!("[{}]", list(&mut got.iter().copied())),
            announced: format!("[{}]", list(&mut announced.iter())),
        });
    }
    for s in sections {
        let spec = spec_for(&s.id, specs)?;
        if let Some(sub) = s
            .subsections
            .iter()
            .find(|sub| !spec.subsections.contains(&sub.name))
        {
            return Err(SectionError::UnknownSubsection {
                id: s.id.clone(),
                subsection: sub.name.clone(),
                min: spec.min_version,
                max: spec.version,
                known: spec.subsections.clone(),
            });
        }
    }
    Ok(())
}

/// The Sections frame's payload.
pub fn encode(sections: &[Section]) -> Vec<u8> {
    // Sized once: a growing buffer would copy large device state again at
    // every doubling, inside the downtime.
    let mut out = Vec::with_capacity(encoded_len(sections));
    out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    for s in sections {
        put_name(&mut out, &s.id.name);
        out.extend_from_slice(&s.id.instance.to_le_bytes());
        out.extend_from_slice(&s.id.version.to_le_bytes());
        put_bytes(&mut out, &s.data);
        out.extend_from_slice(&(s.subsections.len() as u16).to_le_bytes());
        for sub in &s.subsections {
            put_name(&mut out, &sub.name);
            put_bytes(&mut out, &sub.data);
        }
    }
    out
}

/// Writes what [`encode`] would, in pieces of at most `part` bytes, each
/// passed to `emit` with whether it is the last (the last may be empty):
/// one reused buffer of `part` bytes rather than all of the state copied
/// once more, which matters inside the downtime.
pub fn encode_in_parts<E>(
    sections: &[Section],
    part: usize,
    mut emit: impl FnMut(&[u8], bool) -> Result<(), E>,
) -> Result<(), E> {
    let part = part.max(1);
    let mut buf = Vec::with_capacity(part.min(encoded_len(sections)));
    let mut put = |mut bytes: &[u8], buf: &mut Vec<u8>| -> Result<(), E> {
        while !bytes.is_empty() {
            let n = bytes.len().min(part - buf.len());
            buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if buf.len() == part {
                emit(buf, false)?;
                buf.clear();
            }
        }
        Ok(())
    };
    put(&(sections.len() as u32).to_le_bytes(), &mut buf)?;
    for s in sections {
        let mut head = Vec::with_capacity(2 + MAX_NAME + 12);
        put_name(&mut head, &s.id.name);
        head.extend_from_slice(&s.id.instance.to_le_bytes());
        head.extend_from_slice(&s.id.version.to_le_bytes());
        head.extend_from_slice(&(s.data.len() as u32).to_le_bytes());
        put(&head, &mut buf)?;
        put(&s.data, &mut buf)?;
        put(&(s.subsections.len() as u16).to_le_bytes(), &mut buf)?;
        for sub in &s.subsections {
            let mut head = Vec::with_capacity(2 + MAX_NAME + 4);
            put_name(&mut head, &sub.name);
            head.extend_from_slice(&(sub.data.len() as u32).to_le_bytes());
            put(&head, &mut buf)?;
            put(&sub.data, &mut buf)?;
        }
    }
    emit(&buf, true)
}

/// The bytes [`encode`] writes for `sections`.
pub fn encoded_len(sections: &[Section]) -> usize {
    let name = |n: &str| 2 + n.len().min(MAX_NAME);
    4 + sections
        .iter()
        .map(|s| {
            name(&s.id.name)
                + 8
                + 4
                + s.data.len()
                + 2
                + s.subsections
                    .iter()
                    .map(|sub| name(&sub.name) + 4 + sub.data.len())
                    .sum::<usize>()
        })
        .sum::<usize>()
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    let bytes = &name.as_bytes()[..name.len().min(MAX_NAME)];
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_bytes(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
}

/// Parses a Sections frame's payload.
pub fn decode(payload: &[u8]) -> Result<Vec<Section>, SectionError> {
    let mut r = Reader(payload);
    let count = r.u32()? as usize;
    if count > MAX_SECTIONS {
        return Err(SectionError::Malformed(format!(
            "{count} sections, at most {MAX_SECTIONS}"
        )));
    }
    let mut sections = Vec::with_capacity(count);
    for _ in 0..count {
        let name = r.name()?;
        let instance = r.u32()?;
        let version = r.u32()?;
        let data = r.bytes()?;
        let subs = r.u16()?;
        let mut subsections = Vec::with_capacity(usize::from(subs).min(r.0.len()));
        for _ in 0..subs {
            subsections.push(Subsection {
                name: r.name()?,
                data: r.bytes()?,
            });
        }
        sections.push(Section {
            id: SectionId {
                name,
                instance,
                version,
            },
            data,
            subsections,
        });
    }
    if !r.0.is_empty() {
        return Err(SectionError::Malformed(format!(
            "{} bytes after the last section",
            r.0.len()
        )));
    }
    Ok(sections)
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], SectionError> {
        if n > self.0.len() {
            return Err(SectionError::Malformed(format!(
                "{n} bytes wanted, {} left",
                self.0.len()
            )));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u16(&mut self) -> Result<u16, SectionError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().unwrap_or([0; 2]),
        ))
    }
    fn u32(&mut self) -> Result<u32, SectionError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or([0; 4]),
        ))
    }
    fn name(&mut self) -> Result<String, SectionError> {
        let n = usize::from(self.u16()?);
        if n > MAX_NAME {
            return Err(SectionError::Malformed(format!(
                "a {n}-byte name, at most {MAX_NAME}"
            )));
        }
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| SectionError::Malformed("a name that is not UTF-8".into()))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, SectionError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn encoding_in_parts_is_the_encoding_cut_up() {
        let sections: Vec<Section> = (0..3u32)
            .map(|i| {
                let data = (0..(1000 * i + 7)).map(|b| b as u8).collect();
                Section::new("dev", data)
                    .instance(i)
                    .with_subsection("sub", vec![i as u8; 5])
            })
            .collect();
        let whole = encode(&sections);
        assert_eq!(whole.len(), encoded_len(&sections));
        for part in [1, 7, 100, 1024, whole.len(), whole.len() + 1] {
            let mut pieces: Vec<(Vec<u8>, bool)> = Vec::new();
            encode_in_parts(&sections, part, |b, last| {
                pieces.push((b.to_vec(), last));
                Ok::<(), ()>(())
            })
            .unwrap();
            assert!(pieces.iter().all(|(b, _)| b.len() <= part), "{part}");
            let lasts: Vec<bool> = pieces.iter().map(|p| p.1).collect();
            assert_eq!(lasts.iter().filter(|&&l| l).count(), 1, "{part}");
            assert!(*lasts.last().unwrap(), "{part}");
            let joined: Vec<u8> = pieces.into_iter().flat_map(|p| p.0).collect();
            assert_eq!(joined, whole, "{part}");
        }
    }

    use super::*;

    fn specs() -> Vec<SectionSpec> {
        vec![
            SectionSpec::new("serial", 2, 1).with_subsection("fifo"),
            SectionSpec::new("virtio-blk", 1, 1).with_instances(vec![0, 1]),
        ]
    }

    fn section(name: &str, instance: u32, version: u32, subs: &[&str]) -> Section {
        Section {
            id: SectionId {
                name: name.into(),
                instance,
                version,
            },
            data: vec![instance as u8; 3],
            subsections: subs
                .iter()
                .map(|s| Subsection {
                    name: (*s).into(),
                    data: vec![7; 2],
                })
                .collect(),
        }
    }

    #[test]
    fn sections_round_trip_and_truncations_are_refused() {
        let all = vec![
            section("serial", 0, 2, &["fifo"]),
            section("virtio-blk", 1, 1, &[]),
        ];
        let bytes = encode(&all);
        assert_eq!(decode(&bytes).unwrap(), all);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        // A count that claims more than the limit is refused before anything.
        assert!(decode(&u32::MAX.to_le_bytes()).is_err());
    }

    #[test]
    fn refusals_name_the_section_and_both_versions() {
        let specs = specs();
        let too_new = SectionId {
            name: "serial".into(),
            instance: 0,
            version: 3,
        };
        assert_eq!(
            check_manifest(&[too_new], &specs).unwrap_err().to_string(),
            "section 'serial' instance 0 is version 3, this VMM loads versions 1 to 2"
        );
        let unknown = SectionId {
            name: "rtc".into(),
            instance: 0,
            version: 1,
        };
        assert_eq!(
            check_manifest(&[unknown], &specs).unwrap_err().to_string(),
            "section 'rtc' instance 0 (version 1) is unknown to this VMM, which loads serial, virtio-blk"
        );
        let with_extra = section("serial", 0, 2, &["fifo", "dma"]);
        let announced = vec![with_extra.id.clone()];
        assert_eq!(
            check_sections(&[with_extra], &announced, &specs)
                .unwrap_err()
                .to_string(),
            "subsection 'dma' of section 'serial' instance 0 (version 2) is unknown to this VMM, \
             which loads versions 1 to 2 of it with subsections fifo"
        );
    }

    #[test]
    fn a_missing_optional_subsection_and_an_older_version_load() {
        let specs = specs();
        let old = section("serial", 0, 1, &[]);
        let announced = vec![old.id.clone()];
        check_manifest(&announced, &specs).unwrap();
        check_sections(&[old], &announced, &specs).unwrap();
    }

    #[test]
    fn sections_must_be_those_announced() {
        let specs = specs();
        let s = section("virtio-blk", 1, 1, &[]);
        let announced = manifest(&specs);
        let err = check_sections(&[s], &announced, &specs).unwrap_err();
        assert!(matches!(err, SectionError::NotAnnounced { .. }), "{err}");
    }

    #[test]
    fn declared_sizes_sum_per_instance_and_the_largest_over_a_limit_is_named() {
        const MIB: u64 = 1 << 20;
        let specs = vec![
            SectionSpec::new("serial", 1, 1),
            SectionSpec::new("gpu", 1, 1)
                .with_instances(vec![0, 1])
                .with_max_bytes(24 * MIB),
            SectionSpec::new("nic", 1, 1).with_max_bytes(MIB),
        ];
        let announced = manifest(&specs);
        let declared = declared(&specs);
        assert_eq!(declared_total(&announced, &declared), 49 * MIB);
        // 49 MiB and some headers: more than one 32 MiB frame.
        assert!(may_need_parts(&announced, &declared));
        assert!(!may_need_parts(&announced[..2], &declared));
        check_limit(&announced, &declared, 64 * MIB).unwrap();
        let err = check_limit(&announced, &declared, 32 * MIB).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "section 'gpu' may take up to 24.0 MiB (48.0 MiB in all its instances)"
            ),
            "{err}"
        );
    }
}
