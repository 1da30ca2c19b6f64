//! Real drains on a small fleet built on this machine (`ferry drain
//! --netns`): every VM a real guest, every migration a real one over a
//! shaped network, under the planner and under the platforms' admission,
//! each policy's measured makespan beside the simulator's prediction.
//!
//! ```text
//!   mini_fleet which hosts, which guests, and the same as ferry_fleet sees it
//!   procs      the VMs (`ferry run --control`) and destinations (`ferry receive`)
//!   exec       one policy's drain: the simulator's Policy, driven by real ends
//!   measured   one VM's migration as it went (what exec records, replan reads)
//!   replan     the planner's drain planned again when it runs slower than planned
//!   policies   each policy's drain in turn, after the simulator's prediction
//!   report     each policy's median run against its prediction: JSON, tables
//! ```
//!
//! `mini_fleet` says which fleet: the few hosts built here, not the
//! `ferry_fleet` crate's model of any fleet (which it also gives).

pub mod exec;
pub mod measured;
pub mod mini_fleet;
pub mod policies;
pub mod procs;
pub mod replan;
pub mod report;

use std::path::PathBuf;

/// Why a real drain could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The namespaces could not be made.
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    /// A file or process could not be made.
    #[error("cannot {what}")]
    Io {
        /// What was tried.
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A VM or destination did not come up.
    #[error("{vm} did not start: {why} (its log: {})", log.display())]
    Boot {
        /// Which.
        vm: String,
        /// What happened.
        why: String,
        /// Where it wrote.
        log: PathBuf,
    },
    /// A control socket did not answer as it should.
    #[error("control socket {}: {why}", socket.display())]
    Control {
        /// The socket.
        socket: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// The policy started a VM that is not running.
    #[error("the policy started VM {0}, which is not running on its host")]
    NotRunning(String),
    /// The policy will not start what is left.
    #[error("{policy} is stuck: {why}")]
    Stuck {
        /// The policy.
        policy: String,
        /// Why, if it says.
        why: String,
    },
    /// Nothing ended for too long.
    #[error("no migration ended in {0} s; the drain was given up")]
    Quiet(u64),
}
