//! Device state: sections saved on one VM, restored into a fresh one and
//! saved again are the same; and a section stamped outside the versions a
//! VMM loads is refused by the engine's own checks (those a destination
//! applies to the stream header and at the switchover), before the VM
//! sees it.

use super::pages::chosen_pages;
use super::{failure, step, Check, Failure, Saved, StepError, Verdict, VmmUnderTest};
use crate::wire::sections::{check_manifest, check_saved, check_sections, declared, manifest};
use crate::wire::SectionError;
use ferry_vm::{Section, SectionId, SectionSpec, Vm};

/// Why [`sections_round_trip`] or [`section_versions_refused`] failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum SectionsError {
    /// A call into the VM or the hook failed.
    #[error(transparent)]
    Step(#[from] StepError),
    /// One of the engine's checks refused what the VM saved or declares,
    /// as it would refuse it in a migration.
    #[error("{what}: {source}")]
    Refused {
        /// Which VM and which check.
        what: &'static str,
        /// The engine's refusal.
        source: Box<SectionError>,
    },
    /// The sections saved again after the restore are not those saved.
    #[error("saved, restored into a fresh VM and saved again, device state differs: {0}")]
    Differs(String),
    /// A spec that loads no version at all.
    #[error("the destination's spec of section '{name}' loads versions {min} to {max}: none")]
    EmptyRange {
        /// The section.
        name: String,
        /// Its oldest version.
        min: u32,
        /// Its newest version.
        max: u32,
    },
    /// A spec with no version outside its range, so nothing can be refused.
    #[error(
        "the destination's spec of section '{name}' loads versions {min} to {max}: every \
         version, so none out of range can be refused"
    )]
    NoOutOfRange {
        /// The section.
        name: String,
        /// Its oldest version.
        min: u32,
        /// Its newest version.
        max: u32,
    },
    /// A section stamped out of range that the engine's check let through.
    #[error(
        "section {id} stamped version {stamped}, outside the versions {min} to {max} its \
         destination loads, was accepted at {at}"
    )]
    Accepted {
        /// The section, as stamped.
        id: SectionId,
        /// The version it was stamped with.
        stamped: u32,
        /// Oldest version the destination loads.
        min: u32,
        /// Newest version the destination loads.
        max: u32,
        /// Which of the destination's checks let it through.
        at: &'static str,
    },
    /// A refusal that does not say what a VMM author needs to read.
    #[error(
        "section {id} stamped version {stamped} was refused at {at}, but not for its version, \
         or without naming the section and the versions: {source}"
    )]
    Unclear {
        /// The section, as stamped.
        id: SectionId,
        /// The version it was stamped with.
        stamped: u32,
        /// Which check refused it.
        at: &'static str,
        /// Its refusal.
        source: Box<SectionError>,
    },
}

/// Saves a source VM's sections after its guest and devices ran and wrote,
/// restores them into a fresh destination VM, saves that one's, and checks
/// that the two saves are the same state ([`VmmUnderTest::same_state`]).
/// Skipped for a VM that declares no sections.
pub fn sections_round_trip<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, Failure> {
    round_trip(vmm).map_err(|e| failure(Check::SectionsRoundTrip, vmm, e))
}

/// Stamps each section a source VM saved one version above, and one below,
/// what a fresh destination VM's spec loads, and checks that the engine's
/// checks (the stream header's, the switchover's) refuse it with an error
/// naming the section and the versions; then that the destination VM,
/// never handed those, still restores the genuine sections and saves them
/// back the same. Skipped for a VM that declares no sections.
pub fn section_versions_refused<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, Failure> {
    versions(vmm).map_err(|e| failure(Check::SectionVersions, vmm, e))
}

fn no_sections() -> Verdict {
    Verdict::skipped("the VM declares no device sections (state_sections is empty)")
}

/// The sections a source saved, and a fresh destination for them.
type SavedAndDestination<V> = (Vec<Section>, <V as VmmUnderTest>::Vm);

/// [`SavedAndDestination`]; `None` for a VM that declares no sections.
fn saved_and_destination<V: VmmUnderTest>(
    vmm: &mut V,
) -> Result<Option<SavedAndDestination<V>>, SectionsError> {
    let mut src = step("building the source VM", vmm.source())?;
    let specs = src.state_sections();
    if specs.is_empty() {
        return Ok(None);
    }
    let saved = saved_by_source(vmm, &mut src, &specs)?;
    let dst = step(
        "building the destination VM",
        vmm.destination(&src.vmm_config()),
    )?;
    Ok(Some((saved, dst)))
}

fn round_trip<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, SectionsError> {
    let Some((saved, mut dst)) = saved_and_destination(vmm)? else {
        return Ok(no_sections());
    };
    let resaved = restored_and_saved(&mut dst, &saved)?;
    compare(vmm, &saved, &resaved)?;
    Ok(Verdict::passed(format!(
        "{} sections ({})",
        saved.len(),
        names(&saved)
    )))
}

fn versions<V: VmmUnderTest>(vmm: &mut V) -> Result<Verdict, SectionsError> {
    let Some((saved, mut dst)) = saved_and_destination(vmm)? else {
        return Ok(no_sections());
    };
    let dst_specs = dst.state_sections();
    let mut refused = 0;
    for s in &saved {
        let spec = loader(&s.id, &dst_specs)?;
        let out_of_range = [spec.version.checked_add(1), spec.min_version.checked_sub(1)];
        if out_of_range.iter().all(Option::is_none) {
            return Err(SectionsError::NoOutOfRange {
                name: spec.name.clone(),
                min: spec.min_version,
                max: spec.version,
            });
        }
        for stamped in out_of_range.into_iter().flatten() {
            must_refuse(s, stamped, spec, &dst_specs)?;
            refused += 1;
        }
    }
    // Never handed a refused section, the destination takes the real ones.
    let resaved = restored_and_saved(&mut dst, &saved)?;
    compare(vmm, &saved, &resaved)?;
    step("the destination VM's health", dst.check_health())?;
    Ok(Verdict::passed(format!(
        "{refused} out-of-range stamps of {} sections ({}) refused, naming them",
        saved.len(),
        names(&saved)
    )))
}

/// The destination's spec of `id`, checked to load some version.
fn loader<'a>(id: &SectionId, specs: &'a [SectionSpec]) -> Result<&'a SectionSpec, SectionsError> {
    let refused = |source| SectionsError::Refused {
        what: "the destination cannot load what its source saves",
        source: Box::new(source),
    };
    let spec = specs.iter().find(|s| s.name == id.name).ok_or_else(|| {
        refused(SectionError::Unknown {
            id: id.clone(),
            known: specs.iter().map(|s| s.name.clone()).collect(),
        })
    })?;
    if spec.min_version > spec.version {
        return Err(SectionsError::EmptyRange {
            name: spec.name.clone(),
            min: spec.min_version,
            max: spec.version,
        });
    }
    Ok(spec)
}

/// `s` stamped `stamped` must be refused for its version, naming it, by
/// the header's check and the switchover's.
fn must_refuse(
    s: &Section,
    stamped: u32,
    spec: &SectionSpec,
    specs: &[SectionSpec],
) -> Result<(), SectionsError> {
    let mut tampered = s.clone();
    tampered.id.version = stamped;
    let announced = [tampered.id.clone()];
    let checks: [(&'static str, Result<(), SectionError>); 2] = [
        (
            "the stream header's check",
            check_manifest(&announced, specs),
        ),
        (
            "the switchover's check",
            check_sections(std::slice::from_ref(&tampered), &announced, specs),
        ),
    ];
    for (at, result) in checks {
        match result {
            Ok(()) => {
                return Err(SectionsError::Accepted {
                    id: tampered.id,
                    stamped,
                    min: spec.min_version,
                    max: spec.version,
                    at,
                })
            }
            Err(e @ SectionError::Version { .. }) if names_it(&e, &tampered.id, spec) => {}
            Err(source) => {
                return Err(SectionsError::Unclear {
                    id: tampered.id,
                    stamped,
                    at,
                    source: Box::new(source),
                })
            }
        }
    }
    Ok(())
}

/// Whether refusal `e` names the section, its stamp and the range loaded.
fn names_it(e: &SectionError, id: &SectionId, spec: &SectionSpec) -> bool {
    let text = e.to_string();
    [
        format!("'{}'", id.name),
        format!("version {}", id.version),
        format!("{} to {}", spec.min_version, spec.version),
    ]
    .iter()
    .all(|part| text.contains(part.as_str()))
}

/// What a source VM saves once its guest and devices ran and wrote (its
/// sections stamped with their versions, as the engine stamps them), after
/// the engine's own checks of them.
fn saved_by_source<V: VmmUnderTest>(
    vmm: &mut V,
    src: &mut V::Vm,
    specs: &[SectionSpec],
) -> Result<Vec<Section>, SectionsError> {
    step("the source VM's start", src.start())?;
    let pages = chosen_pages(src.ram());
    step("the VMM's write_pages", vmm.write_pages(src, &pages))?;
    step("the source VM's pause", src.pause())?;
    let mut saved = step("the source VM's save_sections", src.save_sections())?;
    stamp(&mut saved, specs, "the source's sections as saved")?;
    Ok(saved)
}

/// Stamps `saved` with `specs`' versions and checks it is what they
/// announce, as a source and its destination check it.
fn stamp(
    saved: &mut [Section],
    specs: &[SectionSpec],
    what: &'static str,
) -> Result<(), SectionsError> {
    let announced = manifest(specs);
    check_saved(saved, &announced, &declared(specs))
        .and_then(|()| check_sections(saved, &announced, specs))
        .map_err(|source| SectionsError::Refused {
            what,
            source: Box::new(source),
        })
}

/// `saved` restored into `dst` (after the checks a destination makes) and
/// saved again.
fn restored_and_saved(dst: &mut dyn Vm, saved: &[Section]) -> Result<Vec<Section>, SectionsError> {
    let specs = dst.state_sections();
    let announced: Vec<SectionId> = saved.iter().map(|s| s.id.clone()).collect();
    check_manifest(&announced, &specs)
        .and_then(|()| check_sections(saved, &announced, &specs))
        .map_err(|source| SectionsError::Refused {
            what: "the destination cannot load what its source saves",
            source: Box::new(source),
        })?;
    step(
        "the destination VM's restore_sections",
        dst.restore_sections(saved),
    )?;
    let mut resaved = step(
        "the destination VM's save_sections after its restore",
        dst.save_sections(),
    )?;
    stamp(
        &mut resaved,
        &specs,
        "the destination's sections as saved again",
    )?;
    Ok(resaved)
}

/// Checks that each section saved again is the same state as saved.
fn compare<V: VmmUnderTest>(
    vmm: &V,
    saved: &[Section],
    resaved: &[Section],
) -> Result<(), SectionsError> {
    let ids = |all: &[Section]| all.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
    if ids(saved) != ids(resaved) {
        return Err(SectionsError::Differs(format!(
            "saved sections [{}], saved again [{}]",
            names(saved),
            names(resaved)
        )));
    }
    let differ: Vec<String> = saved
        .iter()
        .zip(resaved)
        .filter(|(a, b)| !vmm.same_state(Saved::Section(a), Saved::Section(b)))
        .map(|(a, b)| difference(a, b))
        .collect();
    if differ.is_empty() {
        Ok(())
    } else {
        Err(SectionsError::Differs(differ.join("; ")))
    }
}

/// Where two saves of one section part.
fn difference(a: &Section, b: &Section) -> String {
    if a.data != b.data {
        return format!(
            "section {} v{}: {} bytes saved, {} saved again, {}",
            a.id,
            a.id.version,
            a.data.len(),
            b.data.len(),
            first_difference(&a.data, &b.data)
        );
    }
    let subs = |s: &Section| {
        s.subsections
            .iter()
            .map(|x| x.name.clone())
            .collect::<Vec<_>>()
    };
    if subs(a) != subs(b) {
        return format!(
            "section {}: subsections [{}] saved, [{}] saved again",
            a.id,
            subs(a).join(", "),
            subs(b).join(", ")
        );
    }
    let sub = a
        .subsections
        .iter()
        .zip(&b.subsections)
        .find(|(x, y)| x.data != y.data)
        .map(|(x, y)| {
            format!(
                "subsection '{}': {}",
                x.name,
                first_difference(&x.data, &y.data)
            )
        })
        .unwrap_or_else(|| "not the same state, by the VMM's own comparison".into());
    format!("section {}: {sub}", a.id)
}

/// Where two byte strings first differ.
pub(crate) fn first_difference(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(at) => format!(
            "first different at byte {at} ({:#04x} saved, {:#04x} saved again)",
            a[at], b[at]
        ),
        None if a.len() != b.len() => format!(
            "the same for the first {} bytes, then one is longer",
            a.len().min(b.len())
        ),
        None => "the same bytes".into(),
    }
}

/// The sections' names and instances, for messages.
fn names(sections: &[Section]) -> String {
    sections
        .iter()
        .map(|s| format!("{} v{}", s.id, s.id.version))
        .collect::<Vec<_>>()
        .join(", ")
}
