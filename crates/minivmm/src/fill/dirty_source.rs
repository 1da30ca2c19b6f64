//! The fill backend's writes to guest memory as the engine collects them:
//! a [`DirtySource`] over the fill device's vhost-user dirty log
//! ([`super::log`]), which the device starts, reads and stops, since it is
//! the device that tells the backend where the log is.

use super::device::FillDevice;
use super::FillError;
use crate::Devices;
use ferry_engine::vmm::{DirtyPages, DirtySource, DirtySourceError};
use std::sync::Arc;

/// The backend's writes, as the engine collects them.
pub struct FillDirtySource {
    devices: Arc<Devices>,
}

impl FillDirtySource {
    /// The fill device of `devices`.
    pub fn new(devices: Arc<Devices>) -> Self {
        FillDirtySource { devices }
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut FillDevice) -> Result<T, FillError>,
    ) -> Result<T, DirtySourceError> {
        let fill =
            self.devices.fill.as_ref().ok_or_else(|| {
                DirtySourceError::CannotReport("this VM has no fill device".into())
            })?;
        let mut fill = fill.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut fill).map_err(|e| DirtySourceError::failed("the vhost-user dirty log", e))
    }
}

impl DirtySource for FillDirtySource {
    fn name(&self) -> &str {
        "vhost-user fill device"
    }
    fn start(&mut self) -> Result<(), DirtySourceError> {
        self.with(|fill| fill.start_log())
    }
    fn collect(&mut self, into: &mut DirtyPages) -> Result<(), DirtySourceError> {
        self.with(|fill| fill.collect_log(into))
    }
    fn stop(&mut self) {
        let _ = self.with(|fill| {
            fill.stop_log();
            Ok(())
        });
    }
}
