//! Every dirty log of a VM as one: its own ([`Vm::dirty_log`]: KVM's log,
//! the soft MMU's), if it has one; its dirty sources
//! (devices that keep their own), and the VMM's tracked writes
//! ([`ferry_vm::GuestRam::take_vmm_dirty`]). Migrations and the
//! prediction's sample read them the same way.

use crate::error::MigrationError;
use ferry_vm::{DirtyPages, Vm};

/// Starts every dirty log: the dirty sources first, so that one that cannot
/// report refuses (naming it) before the VM starts logging; then the VM's;
/// then the VMM's own, which records writes all the time, is emptied.
///
/// Why empty it: what the VMM wrote before now (the boot's writes of the
/// guest's image, say) is in the first pass over all memory that every
/// caller makes after this, so it is not news; left in, the first
/// harvest would call every page the VMM ever wrote dirty (a snapshot's
/// working set would be the whole guest).
pub(crate) fn start(vm: &mut dyn Vm) -> Result<(), MigrationError> {
    let sources = vm.dirty_sources();
    for i in 0..sources.len() {
        if let Err(why) = sources[i].start() {
            sources[..i].iter_mut().for_each(|s| s.stop());
            return Err(MigrationError::DirtySource {
                name: sources[i].name().to_string(),
                source: why,
            });
        }
    }
    if let Some(Err(e)) = vm.dirty_log().map(|log| log.start_dirty_log()) {
        vm.dirty_sources().iter_mut().for_each(|s| s.stop());
        return Err(MigrationError::backend("start dirty logging")(e));
    }
    vm.ram()
        .take_vmm_dirty(&mut DirtyPages::new(vm.ram().pages()));
    Ok(())
}

/// Adds what every log holds to `into`, and re-arms them.
pub(crate) fn collect(vm: &mut dyn Vm, into: &mut DirtyPages) -> Result<(), MigrationError> {
    if let Some(log) = vm.dirty_log() {
        log.harvest_dirty(into)
            .map_err(MigrationError::backend("harvest the dirty log"))?;
    }
    for source in vm.dirty_sources() {
        source
            .collect(into)
            .map_err(|why| MigrationError::DirtySource {
                name: source.name().to_string(),
                source: why,
            })?;
    }
    vm.ram().take_vmm_dirty(into);
    // A discarded frame written since is data again.
    vm.ram().forget_discarded(into);
    Ok(())
}

/// Stops every dirty log (`when` says when, for the log line of a failure).
pub(crate) fn stop(vm: &mut dyn Vm, when: &str) {
    if let Some(Err(e)) = vm.dirty_log().map(|log| log.stop_dirty_log()) {
        tracing::warn!("stopping dirty logging {when}: {e}");
    }
    vm.dirty_sources().iter_mut().for_each(|s| s.stop());
}
