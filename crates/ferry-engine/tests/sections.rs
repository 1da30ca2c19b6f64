//! Device state as named, versioned sections: what the source's devices
//! save arrives and loads; a section the destination cannot load is refused
//! with its name and both versions, and the source keeps running.

mod common;
use common::*;

use ferry_engine::{migrate, MigrationError, NoProgress};
use ferry_vm::{Backing, Gpa, SectionSpec, Vm};

fn serial(version: u32, min: u32) -> SectionSpec {
    SectionSpec::new("serial", version, min).with_subsection("fifo")
}

fn blk() -> SectionSpec {
    SectionSpec::new("virtio-blk", 1, 1).with_instances(vec![0, 1])
}

/// Migrates a running test VM with `source` devices to a destination whose
/// devices `dest` sets up; returns the source's result, the source VM and
/// what the destination loaded (or its error).
fn migrate_devices(
    source: Devices,
    dest: Devices,
) -> (
    Result<ferry_engine::MigrationSummary, MigrationError>,
    TestVm,
    Result<Vec<ferry_vm::Section>, String>,
) {
    let restored = dest.restored.clone();
    let (to, handle) = spawn_receiver_with(quick_receive(), Backing::Anonymous, move |vm| {
        vm.devices = dest.clone();
    });
    let mut src = running_source();
    src.devices = source;
    let result = migrate(&mut src, &to, &probed(), &NoProgress);
    let loaded = match handle.join().unwrap() {
        Ok(_) => Ok(restored.lock().unwrap().clone()),
        Err(e) => Err(e.chain()),
    };
    (result, src, loaded)
}

#[test]
fn sections_with_their_subsections_arrive_and_load() {
    let devices = Devices {
        specs: vec![serial(2, 1), blk()],
        subsections_needed: true,
        ..Devices::default()
    };
    let saved = devices.save();
    let (result, _src, loaded) = migrate_devices(devices.clone(), devices);
    let summary = result.unwrap();
    assert!(summary.digest_match, "{summary:?}");
    let loaded = loaded.unwrap();
    assert_eq!(loaded, saved);
    assert_eq!(loaded.len(), 3, "serial and two virtio-blk instances");
    assert_eq!(loaded[0].subsection("fifo"), Some(&b"fifo"[..]));
}

#[test]
fn a_missing_optional_subsection_and_an_older_version_load() {
    let source = Devices {
        specs: vec![serial(1, 1)],
        subsections_needed: false,
        ..Devices::default()
    };
    let dest = Devices {
        specs: vec![serial(2, 1)],
        ..Devices::default()
    };
    let (result, _src, loaded) = migrate_devices(source, dest);
    assert!(result.unwrap().digest_match);
    let loaded = loaded.unwrap();
    assert_eq!(loaded[0].id.version, 1);
    assert!(loaded[0].subsections.is_empty());
}

/// A refusal reaches the source with `words` in it, and the source keeps
/// running with its guest intact.
fn refused(source: Devices, dest: Devices, words: &str) {
    let (result, src, loaded) = migrate_devices(source, dest);
    let err = result.unwrap_err().chain();
    assert!(err.contains(words), "source: {err}");
    let dest_err = loaded.unwrap_err();
    assert!(dest_err.contains(words), "destination: {dest_err}");
    assert!(src.is_running(), "the source VM keeps running");
    let before = check(&src);
    wait_for_passes(&src, before.progress + 1);
    assert_eq!(check(&src).errors, 0);
}

#[test]
fn a_version_above_the_destinations_range_is_refused_naming_both() {
    refused(
        Devices {
            specs: vec![serial(3, 1)],
            ..Devices::default()
        },
        Devices {
            specs: vec![serial(2, 1)],
            ..Devices::default()
        },
        "section 'serial' instance 0 is version 3, this VMM loads versions 1 to 2",
    );
}

#[test]
fn an_unknown_section_is_refused_naming_it() {
    refused(
        Devices {
            specs: vec![serial(2, 1), SectionSpec::new("rtc", 4, 1)],
            ..Devices::default()
        },
        Devices {
            specs: vec![serial(2, 1)],
            ..Devices::default()
        },
        "section 'rtc' instance 0 (version 4) is unknown to this VMM, which loads serial",
    );
}

#[test]
fn an_unknown_subsection_is_refused_at_the_switchover() {
    refused(
        Devices {
            specs: vec![serial(2, 1)],
            subsections_needed: true,
            extra_subsection: Some("dma".into()),
            ..Devices::default()
        },
        Devices {
            specs: vec![serial(2, 1)],
            ..Devices::default()
        },
        "subsection 'dma' of section 'serial' instance 0 (version 2) is unknown to this VMM, \
         which loads versions 1 to 2 of it with subsections fifo",
    );
}

#[test]
fn a_device_that_writes_guest_memory_while_saved_moves_that_page() {
    // A page of the system slot the guest never writes: only the device's
    // save puts anything there, after the last round has gone.
    let at = Gpa(0x3000);
    let source = Devices {
        specs: vec![serial(2, 1)],
        save_writes: Some((at, 0x5eed_f00d)),
        ..Devices::default()
    };
    let dest = Devices {
        specs: vec![serial(2, 1)],
        ..Devices::default()
    };
    let restored = dest.restored.clone();
    let (to, handle) = spawn_receiver_with(quick_receive(), Backing::Anonymous, move |vm| {
        vm.devices = dest.clone();
    });
    let mut src = running_source();
    src.devices = source;
    let summary = migrate(&mut src, &to, &probed(), &NoProgress).unwrap();
    assert!(summary.digest_match, "{summary:?}");
    let (dvm, _) = handle.join().unwrap().unwrap();
    assert_eq!(dvm.ram().load_u64(at).unwrap(), 0x5eed_f00d);
    assert_eq!(restored.lock().unwrap().len(), 1);
}

#[test]
fn each_side_hears_start_then_complete_or_abort() {
    let events = |ok: bool| {
        let dest_events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let theirs = dest_events.clone();
        let specs = vec![serial(2, 1)];
        let dest_devices = Devices {
            specs: specs.clone(),
            ..Devices::default()
        };
        let (to, handle) = spawn_receiver_with(quick_receive(), Backing::Anonymous, move |vm| {
            vm.devices = dest_devices.clone();
            vm.events = theirs.clone();
        });
        let mut src = running_source();
        // An unknown subsection fails the migration at the switchover.
        src.devices = Devices {
            specs,
            subsections_needed: true,
            extra_subsection: (!ok).then(|| "dma".to_string()),
            ..Devices::default()
        };
        let result = migrate(&mut src, &to, &probed(), &NoProgress);
        assert_eq!(result.is_ok(), ok);
        assert_eq!(handle.join().unwrap().is_ok(), ok);
        let mine = src.events.lock().unwrap().clone();
        let theirs = dest_events.lock().unwrap().clone();
        (mine, theirs)
    };
    let (src, dest) = events(true);
    assert_eq!(src, ["started", "completed"]);
    assert_eq!(dest, ["started", "completed"]);
    let (src, dest) = events(false);
    assert_eq!(src.len(), 2, "{src:?}");
    assert_eq!(src[0], "started");
    assert!(
        src[1].starts_with("aborted: ") && src[1].contains("'dma'"),
        "{src:?}"
    );
    assert_eq!(dest.len(), 2, "{dest:?}");
    assert!(
        dest[1].starts_with("aborted: ") && dest[1].contains("'dma'"),
        "{dest:?}"
    );
}
