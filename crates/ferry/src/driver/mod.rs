//! A migration this process runs, as `ferry migrate` and `ferry demo` run
//! one and as a VM served over its control socket ([`crate::serve`]) runs
//! the ones it is asked for: the flags and the engine's options they ask
//! for ([`args`]), the source's side ([`source`]), how it ends on screen
//! ([`finish`]), and what both ends of a same-host upgrade share
//! ([`local`]). Below the subcommands, so that each subcommand stays a
//! parse of its arguments and a call here.

mod args;
mod finish;
pub mod local;
mod source;

pub use args::MigrationArgs;
pub use finish::{finish, source_still_runs};
pub use source::{boot_and_migrate, check_policy, migrate_running, warm_up};
