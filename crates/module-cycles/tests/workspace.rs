//! No modules use each other round, at any level of any crate of the
//! workspace (every package under `crates/`, and `fuzz/`): CI's
//! `cargo test --workspace` runs this. The tests below it build small trees
//! on disk, with and without a cycle, so the check itself can fail.

use module_cycles::check_package;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every package directory: each folder of `crates/` with a manifest, and
/// `fuzz/` (a workspace of its own, built by nightly only).
fn packages() -> Vec<PathBuf> {
    let root = workspace();
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    found.sort();
    if root.join("fuzz/Cargo.toml").is_file() {
        found.push(root.join("fuzz"));
    }
    found
}

#[test]
fn no_crate_has_modules_that_use_each_other_round() {
    let root = module_cycles::tree::normal(&workspace());
    let packages = packages();
    assert!(
        packages.len() > 10,
        "found only {packages:?} under crates/: the check would check nothing"
    );
    let mut failures = String::new();
    for dir in &packages {
        let report = check_package(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert!(
            report.modules > 1 && report.resolved > 0,
            "{}: {} modules, {} paths resolved: the tree was misread",
            dir.display(),
            report.modules,
            report.resolved
        );
        for cycle in &report.cycles {
            failures.push_str(&cycle.to_string());
        }
        for file in &report.unreached {
            failures.push_str(&format!(
                "no module tree reaches {} (a dead file, or a `mod` the check misread)\n",
                file.display()
            ));
        }
    }
    // Paths from the workspace's root, as a developer opens them.
    let failures = failures.replace(&format!("{}/", root.display()), "");
    assert!(
        failures.is_empty(),
        "modules that use each other round (each edge with one line that makes it):\n{failures}"
    );
}

/// A package on disk, removed when dropped.
struct Fake {
    dir: PathBuf,
}

impl Fake {
    /// Writes `files` (path, text) under a new directory with a manifest.
    fn new(name: &str, files: &[(&str, &str)]) -> Fake {
        let dir = std::env::temp_dir().join(format!("module-cycles-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"fake\"\n").unwrap();
        for (path, text) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        Fake { dir }
    }

    /// Each cycle found, as "parent: {members}" and its edges' "a->b@file:line".
    fn cycles(&self) -> Vec<String> {
        let report = check_package(&self.dir).unwrap();
        assert!(report.unreached.is_empty(), "{:?}", report.unreached);
        report
            .cycles
            .iter()
            .map(|c| {
                let edges: Vec<String> = c
                    .edges
                    .iter()
                    .map(|(a, b, at)| {
                        let file = at.file.strip_prefix(&self.dir).unwrap().display();
                        format!("{a}->{b}@{file}:{}", at.line)
                    })
                    .collect();
                format!(
                    "{}: {{{}}} {}",
                    c.parent.join("::"),
                    c.members.join(", "),
                    edges.join(" ")
                )
            })
            .collect()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `cmd/{a, b}` beside `low`, nested two ways: `cmd/mod.rs` and `cmd/b.rs`
/// with `cmd/b/` under it.
const LIB: &str = "pub mod cmd;\npub mod low;\n";
const CMD: &str = "//! Subcommands.\nmod a;\nmod b;\npub struct Error;\n";
const LOW: &str = "pub fn helper() {}\n";

#[test]
fn a_cycle_through_super_paths_in_nested_modules_is_reported() {
    let fake = Fake::new(
        "super",
        &[
            ("src/lib.rs", LIB),
            ("src/cmd/mod.rs", CMD),
            ("src/low.rs", LOW),
            // a -> b through a `use` group under `super::`.
            ("src/cmd/a.rs", "use super::{Error, b::{self, inner::Thing}};\n"),
            ("src/cmd/b.rs", "pub mod inner;\n"),
            // b -> a from deep inside b, through `super::super`.
            (
                "src/cmd/b/inner.rs",
                "// super::super::a::run is a comment\n\
                 pub struct Thing;\n\
                 fn f() { let s = \"super::super::a\"; super::super::a::run(); crate::low::helper(); }\n",
            ),
        ],
    );
    assert_eq!(
        fake.cycles(),
        ["cmd: {a, b} a->b@src/cmd/a.rs:1 b->a@src/cmd/b/inner.rs:3"]
    );
}

#[test]
fn a_tree_whose_modules_only_use_down_passes() {
    let fake = Fake::new(
        "clean",
        &[
            ("src/lib.rs", LIB),
            ("src/cmd/mod.rs", CMD),
            ("src/low.rs", LOW),
            ("src/cmd/a.rs", "use super::b::inner::Thing;\nuse crate::low;\n"),
            ("src/cmd/b.rs", "pub mod inner;\nfn f() -> super::Error { super::Error }\n"),
            (
                "src/cmd/b/inner.rs",
                "pub struct Thing;\n\
                 #[cfg(test)]\nmod tests {\n    use super::Thing;\n    fn t() { super::super::super::low::helper(); }\n}\n",
            ),
        ],
    );
    assert_eq!(fake.cycles(), Vec::<String>::new());
}

#[test]
fn an_inline_test_module_is_read_as_its_own_module() {
    // In `a`'s `mod tests`, `super::b` is `a::b`, a child of `a`, not the
    // sibling `b`: read as part of `a`, it would make a false cycle.
    let fake = Fake::new(
        "inline",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "mod b { pub fn f() {} }\n#[cfg(test)]\nmod tests {\n    fn t() { super::b::f(); }\n}\n"),
            ("src/b.rs", "fn g() { crate::a::x(); }\n"),
        ],
    );
    assert_eq!(fake.cycles(), Vec::<String>::new());
    // The same test module reaching the real sibling is an edge, and with
    // `b -> a` a cycle.
    let fake = Fake::new(
        "inline-cycle",
        &[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "#[cfg(test)]\nmod tests {\n    fn t() { super::super::b::g(); }\n}\n",
            ),
            ("src/b.rs", "pub fn g() { crate::a::x(); }\n"),
        ],
    );
    assert_eq!(fake.cycles(), [": {a, b} a->b@src/a.rs:3 b->a@src/b.rs:1"]);
}

#[test]
fn a_cycle_through_a_re_export_names_the_defining_module() {
    // `b` uses `crate::Item`, which the root re-exports from `a`.
    let fake = Fake::new(
        "reexport",
        &[
            ("src/lib.rs", "mod a;\nmod b;\npub use a::Item;\n"),
            ("src/a.rs", "pub struct Item;\nfn f() { crate::b::g(); }\n"),
            ("src/b.rs", "pub fn g() -> crate::Item { todo!() }\n"),
        ],
    );
    assert_eq!(fake.cycles(), [": {a, b} a->b@src/a.rs:2 b->a@src/b.rs:1"]);
}

#[test]
fn a_mod_without_a_file_is_an_error_and_an_unreached_file_is_reported() {
    let fake = Fake::new("missing", &[("src/lib.rs", "mod gone;\n")]);
    let err = check_package(&fake.dir).unwrap_err().to_string();
    assert!(err.contains("`mod gone;` has no file"), "{err}");
    let fake = Fake::new(
        "orphan",
        &[
            ("src/lib.rs", "mod a;\n"),
            ("src/a.rs", ""),
            ("src/old.rs", ""),
        ],
    );
    let report = check_package(&fake.dir).unwrap();
    assert_eq!(report.unreached, [fake.dir.join("src/old.rs")]);
}
