//! Which module of the tree a written path leads into. `crate::` starts at
//! the root, each `super::` one module up from where the path is written
//! (inline modules count: `super::` in a file's `mod tests` is the file's
//! module), `self::` where it is written, and a bare first segment at a child
//! module or a `use`d name of the module it is written in. From there each
//! segment that names a child module goes down, and one that names a name a
//! `use` item of that module binds (a re-export, or a parent's import its
//! child reaches through `super::Name`) continues from where that `use`
//! leads: a dependency through a re-export is a dependency on the module
//! that defines the item (or, for a name taken from another crate, on the
//! module that takes it). The first segment that is neither is an item of
//! the module reached.

use crate::tree::{ModPath, Tree};

/// How many `use` names one path may pass through: more is a `use` that
/// leads back to itself, which rustc rejects anyway.
const MAX_HOPS: usize = 16;

/// The module `path`, written in `from`, leads into; `None` for a path out
/// of the crate (`std::`, another crate, a local type's `Self::`).
pub fn target(tree: &Tree, from: &[String], path: &[String]) -> Option<ModPath> {
    walk(tree, from, path, 0)
}

fn walk(tree: &Tree, from: &[String], path: &[String], hops: usize) -> Option<ModPath> {
    if hops > MAX_HOPS {
        return None;
    }
    let (first, rest) = path.split_first()?;
    let mut at: ModPath = from.to_vec();
    let mut rest = rest;
    match first.as_str() {
        "crate" => at.clear(),
        "self" => {}
        "super" => {
            at.pop()?;
            while rest.first().is_some_and(|s| s == "super") {
                at.pop()?;
                rest = &rest[1..];
            }
        }
        _ => rest = path,
    }
    let bare = !matches!(first.as_str(), "crate" | "self" | "super");
    for (i, segment) in rest.iter().enumerate() {
        let module = tree.modules.get(&at)?;
        if module.children.contains(segment) {
            at.push(segment.clone());
        } else if let Some(imported) = module.imports.get(segment) {
            let mut through: Vec<String> = imported.clone();
            through.extend(rest[i + 1..].iter().cloned());
            // A name this module takes from outside the crate is still
            // this module's name to whoever reaches it here.
            return walk(tree, &at, &through, hops + 1).or(Some(at));
        } else if bare && i == 0 {
            // Another crate's name (`std::`, `ferry_vm::`), or a type's.
            return None;
        } else {
            break;
        }
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Module;

    /// crate { a { x }, b, c { tests (inline) } }; `c` imports `crate::b`
    /// as `bee`, and re-exports `a::x::Thing`.
    fn tree() -> Tree {
        let mut tree = Tree::default();
        let mut add = |path: &[&str], children: &[&str], imports: &[(&str, &str)]| {
            tree.modules.insert(
                path.iter().map(|s| s.to_string()).collect(),
                Module {
                    file: "f.rs".into(),
                    children: children.iter().map(|s| s.to_string()).collect(),
                    imports: imports
                        .iter()
                        .map(|(n, p)| (n.to_string(), p.split("::").map(String::from).collect()))
                        .collect(),
                },
            );
        };
        add(&[], &["a", "b", "c"], &[]);
        add(&["a"], &["x"], &[]);
        add(&["a", "x"], &[], &[]);
        add(&["b"], &[], &[]);
        add(
            &["c"],
            &["tests"],
            &[("bee", "crate::b"), ("Thing", "super::a::x::Thing")],
        );
        add(&["c", "tests"], &[], &[]);
        tree
    }

    fn to(from: &str, path: &str) -> Option<String> {
        let from: Vec<String> = from
            .split('/')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let path: Vec<String> = path.split("::").map(String::from).collect();
        target(&tree(), &from, &path).map(|m| m.join("/"))
    }

    #[test]
    fn crate_self_and_super_start_where_rust_starts() {
        assert_eq!(to("b", "crate::a::x::f").as_deref(), Some("a/x"));
        assert_eq!(to("a", "self::x::T").as_deref(), Some("a/x"));
        assert_eq!(to("a/x", "super::super::b::g").as_deref(), Some("b"));
        assert_eq!(to("c/tests", "super::f").as_deref(), Some("c"));
        assert_eq!(to("", "super::f"), None);
    }

    #[test]
    fn bare_paths_start_at_a_child_or_an_import() {
        assert_eq!(to("a", "x::f").as_deref(), Some("a/x"));
        assert_eq!(to("c", "bee::g").as_deref(), Some("b"));
        assert_eq!(to("c", "std::mem::drop"), None);
    }

    #[test]
    fn a_name_a_module_imports_leads_where_its_use_leads() {
        // A child reaching its parent's import through `super::`.
        assert_eq!(to("c/tests", "super::bee::g").as_deref(), Some("b"));
        // A re-export, through to the module that defines the item.
        assert_eq!(to("b", "crate::c::Thing").as_deref(), Some("a/x"));
    }
}
