//! The source's connections to its destination, as one concern: the main
//! channel, the data connections' senders, postcopy's page server, the
//! health they share, and the session they belong to. A postcopy recovery
//! replaces all of them but the session; what the old set sent is kept in
//! `bytes_before`.

use super::page_server::PageServer;
use super::senders::Senders;
use crate::error::MigrationError;
use crate::transport::{Health, MainChannel};
use std::sync::Arc;

/// The connections of one migration's source.
pub(crate) struct Links {
    pub(crate) ctl: MainChannel,
    pub(crate) senders: Option<Senders>,
    /// Health of the current set of connections (a postcopy recovery
    /// starts a new one).
    pub(crate) health: Arc<Health>,
    /// Bytes sent over earlier sets of connections.
    pub(crate) bytes_before: u64,
    /// Postcopy's page server, when the migration may switch to postcopy.
    pub(crate) server: Option<PageServer>,
    /// The migration's session id (the same on every set of connections).
    pub(crate) session: u64,
}

impl Links {
    /// The data connections' senders (gone once the migration aborted).
    pub(crate) fn senders(&mut self) -> Result<&mut Senders, MigrationError> {
        self.senders.as_mut().ok_or(MigrationError::Aborted)
    }

    /// Bytes sent so far, over every set of connections.
    pub(crate) fn bytes_sent(&self) -> u64 {
        self.bytes_before + self.health.data_bytes() + self.ctl.bytes_sent()
    }
}
