//! What one file declares and names: its `mod` declarations (to find the
//! module tree's files), its inline modules, the names its `use` items bind
//! (a sibling may reach an item through them: `super::Name`) and every path
//! it writes that may lead into the crate, `use` trees and inline paths
//! alike. Nothing is resolved here: a path is kept as written, with the
//! inline module it was written in.

use crate::lex::{Kind, Token};

/// A `mod name;` declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModDecl {
    /// The inline modules around it, outermost first (empty at file level).
    pub within: Vec<String>,
    /// The declared module's name.
    pub name: String,
    /// Its `#[path = "…"]`, if it has one.
    pub path_attr: Option<String>,
    /// The line of the declaration.
    pub line: usize,
}

/// A name a `use` item binds: `use a::b::C;` binds `C` to `a::b::C`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    /// The inline modules around the `use`.
    pub within: Vec<String>,
    /// The name bound (the alias of `as`, or the path's last segment).
    pub name: String,
    /// The path as written.
    pub path: Vec<String>,
}

/// A path in code: `crate::a::b`, `super::x`, `self::y::Z`, `m::f` (which
/// may name a module in scope), or one leaf of a `use` tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRef {
    /// The inline modules around it.
    pub within: Vec<String>,
    /// Its segments as written; a leading `::` (an external crate) is kept
    /// as a `::` segment, which resolves to nothing.
    pub path: Vec<String>,
    /// The line it starts on.
    pub line: usize,
}

/// Everything [`scan`] found in one file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileScan {
    /// `mod name;` declarations.
    pub mods: Vec<ModDecl>,
    /// Inline modules (`mod name { … }`), each as its full inline path.
    pub inline: Vec<Vec<String>>,
    /// Names bound by `use` items.
    pub imports: Vec<Import>,
    /// Paths written in code.
    pub refs: Vec<PathRef>,
}

/// Scans one file's tokens.
pub fn scan(tokens: &[Token]) -> FileScan {
    let mut scanner = Scanner {
        tokens,
        at: 0,
        depth: 0,
        stack: Vec::new(),
        pending_path: None,
        out: FileScan::default(),
    };
    scanner.run();
    scanner.out
}

struct Scanner<'a> {
    tokens: &'a [Token],
    at: usize,
    /// Braces open at this point.
    depth: usize,
    /// The inline modules open here, each with the depth outside its brace.
    stack: Vec<(String, usize)>,
    /// A `#[path = "…"]` seen since the last item ended.
    pending_path: Option<String>,
    out: FileScan,
}

impl Scanner<'_> {
    fn kind(&self, ahead: usize) -> Option<&Kind> {
        self.tokens.get(self.at + ahead).map(|t| &t.kind)
    }

    fn ident(&self, ahead: usize) -> Option<&str> {
        match self.kind(ahead) {
            Some(Kind::Ident(s)) => Some(s),
            _ => None,
        }
    }

    fn is_punct(&self, ahead: usize, c: char) -> bool {
        self.kind(ahead) == Some(&Kind::Punct(c))
    }

    fn line(&self) -> usize {
        self.tokens
            .get(self.at)
            .or(self.tokens.last())
            .map_or(0, |t| t.line)
    }

    fn within(&self) -> Vec<String> {
        self.stack.iter().map(|(name, _)| name.clone()).collect()
    }

    fn run(&mut self) {
        while self.at < self.tokens.len() {
            if self.path_attribute() || self.module() || self.use_item() || self.path() {
                continue;
            }
            match self.kind(0) {
                Some(Kind::Punct('{')) => self.depth += 1,
                Some(Kind::Punct('}')) => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.stack.last().is_some_and(|(_, d)| *d == self.depth) {
                        self.stack.pop();
                    }
                    self.pending_path = None;
                }
                Some(Kind::Punct(';')) => self.pending_path = None,
                _ => {}
            }
            self.at += 1;
        }
    }

    /// `#[path = "…"]`: kept for the `mod` it stands on.
    fn path_attribute(&mut self) -> bool {
        if !(self.is_punct(0, '#') && self.is_punct(1, '[') && self.ident(2) == Some("path")) {
            return false;
        }
        let (Some(Kind::Punct('=')), Some(Kind::Str(path))) = (self.kind(3), self.kind(4)) else {
            return false;
        };
        self.pending_path = Some(path.clone());
        self.at += 5;
        true
    }

    /// `mod name;` or `mod name {`.
    fn module(&mut self) -> bool {
        if self.ident(0) != Some("mod") {
            return false;
        }
        let Some(name) = self.ident(1).map(str::to_string) else {
            return false;
        };
        if self.is_punct(2, ';') {
            self.out.mods.push(ModDecl {
                within: self.within(),
                name,
                path_attr: self.pending_path.take(),
                line: self.line(),
            });
            self.at += 3;
            return true;
        }
        if self.is_punct(2, '{') {
            self.stack.push((name, self.depth));
            self.out.inline.push(self.within());
            self.pending_path = None;
            // The brace itself is counted by `run`.
            self.at += 2;
            return true;
        }
        false
    }

    /// `use tree;` (not `use<'a>`, precise capturing).
    fn use_item(&mut self) -> bool {
        if self.ident(0) != Some("use") {
            return false;
        }
        let starts_tree = matches!(
            self.kind(1),
            Some(Kind::Ident(_)) | Some(Kind::PathSep) | Some(Kind::Punct('{'))
        );
        if !starts_tree {
            return false;
        }
        self.at += 1;
        self.use_tree(Vec::new());
        // Whatever the tree left unread, up to the item's end.
        while self.at < self.tokens.len() && !self.is_punct(0, ';') {
            self.at += 1;
        }
        true
    }

    /// One use tree under `prefix`: `a::b`, `a::b as c`, `a::{…}`, `a::*`.
    fn use_tree(&mut self, prefix: Vec<String>) {
        let line = self.line();
        let mut path = prefix;
        if self.kind(0) == Some(&Kind::PathSep) {
            self.at += 1;
            if path.is_empty() {
                path.push("::".into());
            }
        }
        loop {
            match self.kind(0) {
                Some(Kind::Ident(s)) if s != "as" => {
                    path.push(s.clone());
                    self.at += 1;
                    if self.kind(0) == Some(&Kind::PathSep) {
                        self.at += 1;
                        continue;
                    }
                    break;
                }
                Some(Kind::Punct('{')) => {
                    self.at += 1;
                    while self.at < self.tokens.len() && !self.is_punct(0, '}') {
                        let before = self.at;
                        self.use_tree(path.clone());
                        if self.is_punct(0, ',') {
                            self.at += 1;
                        } else if self.at == before {
                            // Something a use tree cannot hold: pass it.
                            self.at += 1;
                        }
                    }
                    self.at += 1;
                    return;
                }
                Some(Kind::Punct('*')) => {
                    self.at += 1;
                    self.push_ref(path, line);
                    return;
                }
                _ => break,
            }
        }
        if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
        let mut name = path.last().cloned();
        if self.ident(0) == Some("as") {
            name = self.ident(1).map(str::to_string);
            self.at += 2;
        }
        if let Some(name) = name.filter(|n| n != "_" && !path.is_empty()) {
            self.out.imports.push(Import {
                within: self.within(),
                name,
                path: path.clone(),
            });
        }
        if !path.is_empty() {
            self.push_ref(path, line);
        }
    }

    fn push_ref(&mut self, path: Vec<String>, line: usize) {
        self.out.refs.push(PathRef {
            within: self.within(),
            path,
            line,
        });
    }

    /// A path in code: `crate::…`, `super::…`, `self::…`, or `name::name…`
    /// not after a `::` (the tail of a path already read, or an external
    /// crate's `::name`).
    fn path(&mut self) -> bool {
        let Some(first) = self.ident(0) else {
            return false;
        };
        let after_sep = self.at > 0 && self.tokens[self.at - 1].kind == Kind::PathSep;
        let keyword = matches!(first, "crate" | "super" | "self");
        let continues = self.kind(1) == Some(&Kind::PathSep)
            && (keyword || matches!(self.kind(2), Some(Kind::Ident(_))));
        if after_sep || !continues {
            return false;
        }
        let line = self.line();
        let mut path = vec![first.to_string()];
        self.at += 1;
        while self.kind(0) == Some(&Kind::PathSep) {
            let Some(next) = self.ident(1) else { break };
            path.push(next.to_string());
            self.at += 2;
        }
        self.push_ref(path, line);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lex::tokens;

    fn paths(source: &str) -> Vec<String> {
        scan(&tokens(source))
            .refs
            .into_iter()
            .map(|r| format!("{}@{}:{}", r.within.join("/"), r.line, r.path.join("::")))
            .collect()
    }

    #[test]
    fn use_groups_nest_and_self_names_the_prefix() {
        let found = paths("use crate::{a, b::{self, c as d}, e::*};\nuse super::super::f;");
        assert_eq!(
            found,
            [
                "@1:crate::a",
                "@1:crate::b",
                "@1:crate::b::c",
                "@1:crate::e",
                "@2:super::super::f"
            ]
        );
        let names: Vec<(String, String)> = scan(&tokens("use crate::{b::{self, c as d}, e as _};"))
            .imports
            .into_iter()
            .map(|i| (i.name, i.path.join("::")))
            .collect();
        assert_eq!(
            names,
            [
                ("b".into(), "crate::b".into()),
                ("d".into(), "crate::b::c".into())
            ]
        );
    }

    #[test]
    fn inline_paths_keep_their_inline_module() {
        let source = "fn f() { crate::a::g(); x.y::<T>(); pub(super) fn h() {} }\n\
                      mod tests {\n    fn t() { super::b::c(); Vec::<self::d::E>::new(); ::std::mem::drop(1); }\n}\n\
                      fn after() { m::n(); }";
        assert_eq!(
            paths(source),
            [
                "@1:crate::a::g",
                "tests@3:super::b::c",
                "tests@3:self::d::E",
                "@5:m::n"
            ]
        );
    }

    #[test]
    fn mod_declarations_with_their_path_attribute() {
        let found = scan(&tokens(
            "mod a;\n#[cfg(test)]\n#[path = \"x/y.rs\"]\npub(crate) mod b;\nmod c { mod d; }",
        ));
        let mods: Vec<(String, String, Option<String>)> = found
            .mods
            .into_iter()
            .map(|m| (m.within.join("/"), m.name, m.path_attr))
            .collect();
        assert_eq!(
            mods,
            [
                ("".into(), "a".into(), None),
                ("".into(), "b".into(), Some("x/y.rs".into())),
                ("c".into(), "d".into(), None),
            ]
        );
        assert_eq!(found.inline, [vec!["c".to_string()]]);
    }
}
