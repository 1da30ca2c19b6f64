//! The engine's top-level modules follow the layers drawn in
//! `docs/design.md` ("The engine's layers"): a module uses only modules of
//! its own layer or below, and no group of modules uses each other round in
//! a cycle. A dependency is any `crate::x` path in code, `use` lines and
//! inline paths alike; comment lines are left out, since a doc link is no
//! dependency. A new module fails this until the diagram places it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The layer of each module, read from the design's table: rows of
/// `| N | `a`, `b` | what |` under the heading "The engine's layers".
fn layers_from_design() -> BTreeMap<String, u32> {
    let design = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/design.md");
    let text = std::fs::read_to_string(&design).expect("docs/design.md");
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("The engine's layers"))
        .expect("docs/design.md has a section \"The engine's layers\"");
    let mut layers = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(Ok(layer)) = cells.get(1).map(|c| c.parse::<u32>()) else {
            continue;
        };
        for module in cells[2].split(',') {
            let name = module.trim().trim_matches('`');
            assert!(
                layers.insert(name.to_string(), layer).is_none(),
                "{name} is placed twice"
            );
        }
    }
    assert!(layers.len() > 5, "no layer table found in docs/design.md");
    layers
}

/// The top-level modules: each `.rs` file of `src/` but `lib.rs`, and
/// each directory.
fn modules() -> BTreeSet<String> {
    std::fs::read_dir(src())
        .unwrap()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_stem()?.to_str()?.to_string();
            (path.is_dir() || (path.extension()? == "rs" && name != "lib")).then_some(name)
        })
        .collect()
}

/// The `.rs` files under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The modules `code` names through `crate::`.
fn uses(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices("crate::") {
            // A `use crate::{...}` group is read whole below.
            found.insert(ident(&line[at + "crate::".len()..]));
        }
    }
    // `use crate::{a, b::c}`, on one line or several.
    for (at, _) in code.match_indices("use crate::{") {
        let group = code[at + "use crate::{".len()..]
            .split('}')
            .next()
            .unwrap_or_default();
        for item in group.split(',') {
            let item = item.trim();
            if !item.starts_with("//") {
                found.insert(ident(item));
            }
        }
    }
    found.remove("");
    found
}

/// module -> the other top-level modules it uses.
fn edges(modules: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for file in files {
        let rel = file.strip_prefix(src()).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let module = first.trim_end_matches(".rs").to_string();
        if !modules.contains(&module) {
            continue;
        }
        let code = std::fs::read_to_string(&file).unwrap();
        for used in uses(&code) {
            if used != module && modules.contains(&used) {
                edges.get_mut(&module).unwrap().insert(used);
            }
        }
    }
    edges
}

/// The groups of two or more modules that use each other round (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        groups: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in &self.edges[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.groups.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.groups
}

#[test]
fn every_module_uses_only_its_layer_and_the_layers_below() {
    let layers = layers_from_design();
    let modules = modules();
    let unplaced: Vec<&String> = modules
        .iter()
        .filter(|m| !layers.contains_key(*m))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules missing from the layer table in docs/design.md: {unplaced:?}"
    );
    let gone: Vec<&String> = layers.keys().filter(|m| !modules.contains(*m)).collect();
    assert!(
        gone.is_empty(),
        "docs/design.md places modules that do not exist: {gone:?}"
    );
    let mut upward = Vec::new();
    for (module, used) in edges(&modules) {
        for u in used {
            if layers[&u] > layers[&module] {
                upward.push(format!(
                    "{module} (layer {}) uses {u} (layer {})",
                    layers[&module], layers[&u]
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "modules that reach up a layer:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_modules_use_each_other_round() {
    let groups = cycles(&edges(&modules()));
    assert!(
        groups.is_empty(),
        "modules that use each other round: {groups:?}"
    );
}

#[test]
fn the_scan_reads_use_lines_inline_paths_and_groups() {
    let code = "use crate::wire::Message;\n\
                // crate::docs_only is a comment\n\
                let x = crate::digest::page_hash(p);\n\
                use crate::{error::MigrationError, summary};\n\
                use crate::{\n    transport::Health,\n    tunables::Tunables,\n};\n";
    let found: Vec<String> = uses(code).into_iter().collect();
    assert_eq!(
        found,
        [
            "digest",
            "error",
            "summary",
            "transport",
            "tunables",
            "wire"
        ]
    );
}
