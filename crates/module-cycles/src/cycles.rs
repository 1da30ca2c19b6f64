//! The check itself: at every module, whether its children use each other
//! round. A path written anywhere inside child `a`'s subtree that leads
//! anywhere inside sibling `b`'s subtree is an edge `a -> b` among the
//! children of their common parent; a path from a module to one of its
//! ancestors or descendants is no edge (a child may use its parent's items,
//! a parent its children). Each group of children that reach each other
//! (a strongly connected component of two or more) is one [`Cycle`], with one
//! written path as the example of each of its edges.

use crate::resolve::target;
use crate::tree::{ModPath, Tree};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

/// Where one edge is written: the first such place in file and line order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Example {
    /// The file.
    pub file: PathBuf,
    /// The line, 1-based.
    pub line: usize,
}

/// Children of one module that use each other round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The parent module (`[]` for the crate root).
    pub parent: ModPath,
    /// The file the parent is written in.
    pub parent_file: PathBuf,
    /// The children in the group, sorted.
    pub members: Vec<String>,
    /// Every edge between members, with its example.
    pub edges: Vec<(String, String, Example)>,
}

/// parent module -> (child, child) -> the first place the edge is written.
type Levels = BTreeMap<ModPath, BTreeMap<(String, String), Example>>;

/// The edges among siblings at every level of `tree`.
fn levels(tree: &Tree) -> Levels {
    let mut levels = Levels::new();
    for written in &tree.written {
        let Some(to) = target(tree, &written.module, &written.path) else {
            continue;
        };
        let from = &written.module;
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if common == from.len() || common == to.len() {
            continue;
        }
        let example = Example {
            file: written.file.clone(),
            line: written.line,
        };
        let edge = (from[common].clone(), to[common].clone());
        let slot = levels
            .entry(from[..common].to_vec())
            .or_default()
            .entry(edge)
            .or_insert_with(|| example.clone());
        if example < *slot {
            *slot = example;
        }
    }
    levels
}

/// Every group of siblings that use each other round, at every level.
pub fn cycles(tree: &Tree) -> Vec<Cycle> {
    let mut found = Vec::new();
    for (parent, edges) in levels(tree) {
        let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (a, b) in edges.keys() {
            next.entry(a).or_default().insert(b);
            next.entry(b).or_default();
        }
        for members in components(&next) {
            let inside: BTreeSet<&str> = members.iter().copied().collect();
            found.push(Cycle {
                parent_file: tree
                    .modules
                    .get(&parent)
                    .map(|m| m.file.clone())
                    .unwrap_or_default(),
                parent: parent.clone(),
                members: members.iter().map(|s| s.to_string()).collect(),
                edges: edges
                    .iter()
                    .filter(|((a, b), _)| {
                        inside.contains(a.as_str()) && inside.contains(b.as_str())
                    })
                    .map(|((a, b), e)| (a.clone(), b.clone(), e.clone()))
                    .collect(),
            });
        }
    }
    found
}

/// The strongly connected components of two or more nodes (Tarjan), each
/// sorted.
fn components<'a>(next: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct Walk<'a, 'g> {
        next: &'g BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        groups: Vec<Vec<&'a str>>,
    }
    impl<'a> Walk<'a, '_> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for &w in &self.next[v] {
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
                    group.push(w);
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
        next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for &v in next.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.groups.sort();
    walk.groups
}

impl fmt::Display for Cycle {
    /// The group, then each edge with the line that makes it, read back from
    /// its file so the report shows the code to change.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parent = if self.parent.is_empty() {
            "crate".to_string()
        } else {
            format!("crate::{}", self.parent.join("::"))
        };
        writeln!(
            f,
            "in {parent} ({}), {{{}}} use each other round:",
            self.parent_file.display(),
            self.members.join(", ")
        )?;
        for (a, b, at) in &self.edges {
            let text = std::fs::read_to_string(&at.file)
                .ok()
                .and_then(|s| s.lines().nth(at.line - 1).map(|l| l.trim().to_string()))
                .unwrap_or_default();
            writeln!(f, "  {a} -> {b}  {}:{}: {text}", at.file.display(), at.line)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_find_each_group_and_leave_chains_alone() {
        let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (a, b) in [
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "d"),
            ("d", "e"),
            ("e", "d"),
            ("f", "a"),
        ] {
            next.entry(a).or_default().insert(b);
            next.entry(b).or_default();
        }
        assert_eq!(components(&next), [vec!["a", "b", "c"], vec!["d", "e"]]);
        next.remove("a");
        next.get_mut("f").unwrap().clear();
        next.get_mut("c").unwrap().remove("a");
        assert_eq!(components(&next), [vec!["d", "e"]]);
    }
}
