//! The VM's access log ([`ferry_vm::AccessLog`]) while a snapshot reads
//! it, for its working set (`super::working_set`): the pages the guest
//! read, which the dirty logs cannot see.
//!
//! A hint, never a proof: a touch it misses costs the restored guest a
//! fault, never data. So a log that fails is dropped with a warning, and
//! the working set is then what the dirty logs saw written.

use ferry_vm::{DirtyPages, Vm};

/// What a snapshot without the log falls back to, for its warnings.
const WITHOUT: &str = "the working set is what the dirty logs saw written";

/// The access log, on from [`Accesses::start`] to [`Accesses::stop`].
#[derive(Default)]
pub struct Accesses {
    on: bool,
    used: bool,
}

impl Accesses {
    /// Starts the VM's access log, where it has one and `wanted`.
    pub fn start(&mut self, vm: &mut dyn Vm, wanted: bool) {
        let Some(log) = vm.access_log().filter(|_| wanted) else {
            return;
        };
        match log.start_access_log() {
            Ok(()) => (self.on, self.used) = (true, true),
            Err(e) => tracing::warn!("the VM's access log does not start ({e}): {WITHOUT}"),
        }
    }

    /// Whether the log was read at all (it may have failed since).
    pub fn used(&self) -> bool {
        self.used
    }

    /// The pages the guest accessed since the last harvest, sized to its
    /// RAM as the log's own bitmap is (None where the log is off).
    pub fn harvest(&mut self, vm: &mut dyn Vm) -> Option<DirtyPages> {
        if !self.on {
            return None;
        }
        let mut accessed = DirtyPages::new(vm.ram().pages());
        match vm
            .access_log()
            .map(|log| log.harvest_accessed(&mut accessed))
        {
            Some(Ok(_)) => Some(accessed),
            Some(Err(e)) => {
                tracing::warn!("the VM's access log failed ({e}): {WITHOUT}");
                self.stop(vm);
                None
            }
            None => {
                self.on = false;
                None
            }
        }
    }

    /// Stops the log, if on.
    pub fn stop(&mut self, vm: &mut dyn Vm) {
        if !std::mem::take(&mut self.on) {
            return;
        }
        if let Some(Err(e)) = vm.access_log().map(|log| log.stop_access_log()) {
            tracing::warn!("the VM's access log does not stop: {e}");
        }
    }
}
