//! The check that no modules use each other round, at any level of any
//! crate's module tree.
//!
//! A cycle among modules means neither can be read, tested or moved without
//! the other: the layering `main.rs` and `docs/design.md` describe holds only
//! while none exists. `ferry-engine`'s `tests/layers.rs` checks the engine's
//! top-level modules against its layer table; this checks every module of
//! every crate, nested ones included, which a scan of `crate::x` lines cannot
//! do: `cmd/local.rs` reaching `cmd/migrate.rs` writes `super::migrate`.
//!
//! It reads source, not rustc's output, so it needs nothing built and runs in
//! CI's `cargo test --workspace` (`tests/workspace.rs`). The steps, a module
//! each: [`lex`] the source (comments and strings dropped), [`scan`] each
//! file's `mod` items, `use` trees and paths, read the [`tree`] of files,
//! [`resolve`] each path to the module it leads into, and find the
//! [`cycles`] among each module's children. [`targets`] lists a package's
//! crate roots.
//!
//! It is a crate of its own, not a test of one of the crates it checks,
//! because it checks them all (and itself), and has no dependency of theirs.
//! `cargo run -p module-cycles -- DIR…` prints the same report for the
//! packages named.

pub mod cycles;
pub mod lex;
pub mod resolve;
pub mod scan;
pub mod targets;
pub mod tree;

use cycles::Cycle;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Why a package could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Its targets could not be listed.
    #[error(transparent)]
    Targets(#[from] targets::TargetsError),
    /// One of its module trees could not be read.
    #[error(transparent)]
    Tree(#[from] tree::TreeError),
}

/// What the check found in one package.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The groups of sibling modules that use each other round, each once
    /// (a file shared by several targets, such as `tests/common`, is
    /// reported for the first).
    pub cycles: Vec<Cycle>,
    /// How many modules the package's trees hold, all targets together.
    pub modules: usize,
    /// How many paths they resolve into the crate.
    pub resolved: usize,
    /// `.rs` files beside the targets' roots that no tree reaches: dead
    /// files, or a tree the check misread.
    pub unreached: Vec<PathBuf>,
}

/// Checks the package whose `Cargo.toml` is in `dir`.
pub fn check_package(dir: &Path) -> Result<Report, CheckError> {
    let roots = targets::roots(dir)?;
    let mut report = Report::default();
    let mut seen = BTreeSet::new();
    let mut reached = BTreeSet::new();
    for root in &roots {
        let tree = tree::Tree::read(root)?;
        report.modules += tree.modules.len();
        report.resolved += tree
            .written
            .iter()
            .filter(|w| resolve::target(&tree, &w.module, &w.path).is_some())
            .count();
        reached.extend(tree.files());
        for cycle in cycles::cycles(&tree) {
            if seen.insert((cycle.parent_file.clone(), cycle.members.clone())) {
                report.cycles.push(cycle);
            }
        }
    }
    let normal: BTreeSet<PathBuf> = reached.iter().map(|p| tree::normal(p)).collect();
    report.unreached = targets::sources(&roots, dir)?
        .into_iter()
        .filter(|p| !normal.contains(&tree::normal(p)))
        .collect();
    Ok(report)
}
