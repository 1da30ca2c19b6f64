//! `ferry bench ...`: the experiments' names and flags; [`crate::bench`]
//! runs each one, prints its tables and writes its files.

use crate::args::resolve_backend;
use crate::bench;
use crate::error::CmdError;
use clap::Subcommand;
use std::process::ExitCode;

/// The experiments.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Dirty-memory pass time and get/clear dirty log cost: per KVM tracking
    /// mode (kvm), or eager split vs split on fault over 1-16 vCPUs (soft;
    /// the eager-splitting seed's two tables).
    DirtyLog(bench::dirty_log::DirtyLogArgs),
    /// Zap a sparse (the iterator seed's 18 tables) and a dense table tree:
    /// present-only iteration vs full scan, loop steps and time (soft MMU).
    Zap(bench::zap::ZapArgs),
    /// Write-protect all memory and harvest the log for 1-64 GiB: O(1)
    /// generation bump vs walk, and the faults that follow (soft MMU).
    WriteProtect(bench::write_protect::WriteProtectArgs),
    /// The first pass of an idle guest over 1, 2 and 4 connections, with and
    /// without compression, against raw loopback TCP measured in the same run.
    Link(bench::link::LinkArgs),
    /// Each convergence policy against guests that dirty faster than the
    /// link: the dirty-quota seed's table A (migration time per policy) and
    /// table B (guest runtime and progress for writer/reader mixes).
    Converge(bench::converge::ConvergeArgs),
    /// Postcopy's fault path alone (no network), the annotated-faults
    /// seed's table: pages/s against vCPUs for userfaultfd variants on kvm
    /// (4K/2M, MISSING/MINOR, poll/busy, prefetch) and for the shared fault
    /// queue vs vCPU-direct exits on soft.
    DemandPaging(bench::demand_paging::DemandPagingArgs),
    /// Same-host live upgrade (the memory's memfd files handed to the new
    /// process) at 1, 4 and 16 GiB: downtime and total time, with TCP
    /// precopy of the same VM in the same run for contrast. `--json` ends
    /// with `cells` (mem_gib, downtime_ms, total_ms).
    Local(bench::upgrade::LocalArgs),
    /// A write-heavy guest ping-pongs between two ends, A→B→A..., every
    /// hop verified (digest and guest stamps); `--json` ends with `hops`
    /// and `failed`.
    Soak(bench::soak::SoakArgs),
    /// A guest whose device has large state that changes at a fixed rate
    /// (256 MiB, a 64 KiB block rewritten every millisecond) migrates with
    /// that state sent live and, interleaved in the same run, all at the
    /// pause: downtime against `--downtime-ms`, the prediction beside it,
    /// and the device's state compared on both ends.
    DeviceState(bench::device_state::DeviceStateArgs),
    /// Draining a rack of simulated fat-trees (128 to 1,024 hosts, seeds
    /// 1-5): the planner against KubeVirt's, HCO's, Nova's and vSphere's
    /// admission, every migration on ferry's model. `--json` ends with
    /// `cells` (hosts, drained_hosts, vms, seed, policies).
    Fleet(bench::simulated_drain::FleetArgs),
    /// A live snapshot of 1 and 4 GiB guests, idle and writing a hot set,
    /// then its restore from the same file eagerly, lazily and lazily with
    /// the working set first: first instruction, working set resident,
    /// faults that held a vCPU, and the guest's first second against its
    /// second before. `--json` ends with `{"cells": [...]}`.
    Snapshot(bench::snapshot::SnapshotArgs),
}

/// Runs `ferry bench ...` (a backend of `auto` resolved first).
pub fn run(cmd: BenchCommand) -> Result<ExitCode, CmdError> {
    match cmd {
        BenchCommand::DirtyLog(a) => bench::dirty_log::run(a),
        BenchCommand::Zap(a) => bench::zap::run(a),
        BenchCommand::Link(mut a) => {
            a.backend = resolve_backend(&a.backend);
            bench::link::run_and_print(&a)
        }
        BenchCommand::Fleet(a) => bench::simulated_drain::run_and_print(&a),
        BenchCommand::DeviceState(a) => bench::device_state::run_and_print(&a),
        BenchCommand::Converge(a) => bench::converge::run_and_print(&a),
        BenchCommand::Local(mut a) => {
            a.backend = resolve_backend(&a.backend);
            bench::upgrade::run_and_print(&a)
        }
        BenchCommand::DemandPaging(a) => bench::demand_paging::run(a),
        BenchCommand::Soak(mut a) => {
            a.backend = resolve_backend(&a.backend);
            bench::soak::run_and_print(&a)
        }
        BenchCommand::WriteProtect(a) => bench::write_protect::run(a),
        BenchCommand::Snapshot(mut a) => {
            a.backend.backend = resolve_backend(&a.backend.backend);
            bench::snapshot::run_and_print(&a)
        }
    }
}
