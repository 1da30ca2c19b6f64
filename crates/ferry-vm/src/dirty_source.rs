//! Writers of guest memory besides the vCPUs and the VMM's own tracked
//! writes: a device doing DMA through a mapping of its own, a vhost-user
//! backend, an accelerator. Each must say what it wrote, or the pages it
//! writes during a migration are never sent again.
//!
//! The engine starts every source when dirty logging starts, collects them
//! at every harvest (with the VM's own log and [`crate::GuestRam`]'s
//! bitmap), and stops them at the end. A source that cannot report (its
//! device has no dirty log) fails [`DirtySource::start`], and the migration
//! refuses to start, naming it: a migration that would lose that device's
//! writes never begins.

use crate::bitmap::DirtyPages;

/// One writer of guest memory that keeps its own dirty log.
pub trait DirtySource: Send {
    /// What it is, for messages ("virtio-net rx", "vhost-user-fs").
    fn name(&self) -> &str;
    /// Starts logging. An error ([`DirtySourceError::CannotReport`] where
    /// it has no log): the migration refuses to start.
    fn start(&mut self) -> Result<(), DirtySourceError>;
    /// Adds every frame written since the last call (or since `start`) to
    /// `into`.
    fn collect(&mut self, into: &mut DirtyPages) -> Result<(), DirtySourceError>;
    /// Stops logging.
    fn stop(&mut self);
}

/// Why a dirty source failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirtySourceError {
    /// It cannot report its writes (its device has no dirty log, or not
    /// now), in its own words.
    #[error("cannot report what it writes: {0}")]
    CannotReport(String),
    /// Reading or re-arming its log failed.
    #[error("{what}")]
    Failed {
        /// What it was doing.
        what: String,
        /// Why it failed.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl DirtySourceError {
    /// `what` failed, for `source`.
    pub fn failed(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        DirtySourceError::Failed {
            what: what.into(),
            source: Some(Box::new(source)),
        }
    }
}
