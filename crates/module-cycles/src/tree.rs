//! One crate target's module tree, read from its files the way rustc finds
//! them: from the root file, each `mod x;` is `x.rs` or `x/mod.rs` beside
//! a `mod.rs` (or the root), and under `foo/` beside a `foo.rs`; inside an
//! inline `mod a { … }` one directory deeper; `#[path]` relative to the
//! declaring file's directory. A file loaded through `#[path]` places its own
//! children as a `mod.rs` does, as rustc does.

use crate::lex::tokens;
use crate::scan::{scan, PathRef};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Component, Path, PathBuf};

/// Why a tree could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// A file of the tree could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A `mod x;` whose file is in none of the places rustc looks.
    #[error("{file}:{line}: `mod {name};` has no file (looked for {tried:?})")]
    NoFile {
        /// The declaring file.
        file: PathBuf,
        /// The declaration's line.
        line: usize,
        /// The module's name.
        name: String,
        /// Where it was looked for.
        tried: Vec<PathBuf>,
    },
}

/// A module path from the crate root: `[]` is the root, `["cmd", "migrate"]`
/// is `crate::cmd::migrate`.
pub type ModPath = Vec<String>;

/// One module of the tree.
#[derive(Debug, Clone, Default)]
pub struct Module {
    /// The file it is written in (an inline module's is its parent's).
    pub file: PathBuf,
    /// Its child modules by name.
    pub children: BTreeSet<String>,
    /// The names its `use` items bind, each to the path as written.
    pub imports: BTreeMap<String, Vec<String>>,
}

/// A path written in a module, where it was written.
#[derive(Debug, Clone)]
pub struct Written {
    /// The module (inline modules included) it is written in.
    pub module: ModPath,
    /// Its segments as written.
    pub path: Vec<String>,
    /// The file.
    pub file: PathBuf,
    /// The line.
    pub line: usize,
}

/// A crate target's modules and the paths written in them.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    /// Every module, the root (`[]`) included.
    pub modules: BTreeMap<ModPath, Module>,
    /// Every path written in code.
    pub written: Vec<Written>,
}

impl Tree {
    /// Reads the tree whose root file is `root`.
    pub fn read(root: &Path) -> Result<Tree, TreeError> {
        let mut tree = Tree::default();
        let root_dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut queue = VecDeque::from([(normal(root), ModPath::new(), normal(&root_dir))]);
        while let Some((file, module, child_dir)) = queue.pop_front() {
            let source = std::fs::read_to_string(&file).map_err(|source| TreeError::Read {
                path: file.clone(),
                source,
            })?;
            let found = scan(&tokens(&source));
            let at =
                |within: &[String]| -> ModPath { module.iter().chain(within).cloned().collect() };
            tree.add(&at(&[]), &file);
            for inline in &found.inline {
                tree.add(&at(inline), &file);
            }
            for import in found.imports {
                tree.modules
                    .entry(at(&import.within))
                    .or_default()
                    .imports
                    .entry(import.name)
                    .or_insert(import.path);
            }
            for PathRef { within, path, line } in found.refs {
                tree.written.push(Written {
                    module: at(&within),
                    path,
                    file: file.clone(),
                    line,
                });
            }
            for decl in found.mods {
                let base: PathBuf = decl.within.iter().fold(child_dir.clone(), |d, m| d.join(m));
                let (tried, mod_rs) = match &decl.path_attr {
                    Some(attr) if decl.within.is_empty() => (
                        vec![file.parent().unwrap_or(Path::new(".")).join(attr)],
                        true,
                    ),
                    Some(attr) => (vec![base.join(attr)], true),
                    None => (
                        vec![
                            base.join(format!("{}.rs", decl.name)),
                            base.join(&decl.name).join("mod.rs"),
                        ],
                        false,
                    ),
                };
                let Some(child_file) = tried.iter().find(|p| p.is_file()).map(|p| normal(p)) else {
                    return Err(TreeError::NoFile {
                        file: file.clone(),
                        line: decl.line,
                        name: decl.name,
                        tried,
                    });
                };
                let is_mod_rs = mod_rs || child_file.file_name().is_some_and(|n| n == "mod.rs");
                let dir = child_file.parent().unwrap_or(Path::new(".")).to_path_buf();
                let grandchild_dir = if is_mod_rs { dir } else { dir.join(&decl.name) };
                let mut path = at(&decl.within);
                path.push(decl.name);
                queue.push_back((child_file, path, grandchild_dir));
            }
        }
        Ok(tree)
    }

    /// Adds `module` (and its place among its parent's children).
    fn add(&mut self, module: &[String], file: &Path) {
        self.modules.entry(module.to_vec()).or_default().file = file.to_path_buf();
        if let Some((name, parent)) = module.split_last() {
            self.modules
                .entry(parent.to_vec())
                .or_default()
                .children
                .insert(name.clone());
        }
    }

    /// The files the tree is read from.
    pub fn files(&self) -> BTreeSet<PathBuf> {
        self.modules.values().map(|m| m.file.clone()).collect()
    }
}

/// `path` with each `dir/..` taken out, so a file reached through
/// `#[path = "../x.rs"]` has one name.
pub fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            Component::CurDir => {}
            part => out.push(part),
        }
    }
    out
}
