//! A package's crate targets, each the root file of a module tree of its
//! own: the library, the binaries, the tests, the examples and the benches
//! cargo finds by convention, and every `path = "…"` the manifest gives a
//! target (the fuzz targets have only those).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Why a package's targets could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum TargetsError {
    /// The manifest or a directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// What was read.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn read_err(path: &Path) -> impl FnOnce(std::io::Error) -> TargetsError + '_ {
    move |source| TargetsError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// The manifest's sections that describe one target.
const TARGET_SECTIONS: [&str; 5] = ["[lib]", "[[bin]]", "[[test]]", "[[example]]", "[[bench]]"];

/// The root files of the package in `dir` (which holds its `Cargo.toml`).
pub fn roots(dir: &Path) -> Result<BTreeSet<PathBuf>, TargetsError> {
    let mut roots = BTreeSet::new();
    for file in ["src/lib.rs", "src/main.rs", "build.rs"] {
        let path = dir.join(file);
        if path.is_file() {
            roots.insert(path);
        }
    }
    for folder in ["src/bin", "tests", "examples", "benches"] {
        let folder = dir.join(folder);
        if !folder.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&folder).map_err(read_err(&folder))? {
            let path = entry.map_err(read_err(&folder))?.path();
            if path.extension().is_some_and(|e| e == "rs") {
                roots.insert(path);
            } else if path.join("main.rs").is_file() {
                roots.insert(path.join("main.rs"));
            }
        }
    }
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).map_err(read_err(&manifest))?;
    let mut in_target = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_target = TARGET_SECTIONS.contains(&line);
        } else if in_target && line.starts_with("path") {
            if let Some(path) = line.split('"').nth(1) {
                roots.insert(dir.join(path));
            }
        }
    }
    Ok(roots)
}

/// Every `.rs` file under the directories that hold `roots`, `target/`
/// left out: the files a tree should reach.
pub fn sources(roots: &BTreeSet<PathBuf>, dir: &Path) -> Result<BTreeSet<PathBuf>, TargetsError> {
    let mut found = BTreeSet::new();
    let tops: BTreeSet<PathBuf> = roots
        .iter()
        .filter_map(|r| r.strip_prefix(dir).ok()?.components().next())
        .map(|c| dir.join(c))
        .filter(|p| p.is_dir())
        .collect();
    for top in tops {
        walk(&top, &mut found)?;
    }
    Ok(found)
}

fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) -> Result<(), TargetsError> {
    for entry in std::fs::read_dir(dir).map_err(read_err(dir))? {
        let path = entry.map_err(read_err(dir))?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                walk(&path, out)?;
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.insert(path);
        }
    }
    Ok(())
}
