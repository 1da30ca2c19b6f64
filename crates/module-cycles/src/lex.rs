//! Rust source as the few tokens the module check needs: identifiers, `::`,
//! string literals and single punctuation. Comments are dropped (a doc link
//! is no dependency) and so is the text of strings and characters (a path in
//! a test's fixture string is none either), which a line-based scan cannot
//! tell apart from code. Lifetimes and numbers are skipped. The lexer never
//! fails: what it does not know it passes over as punctuation.

/// One token and the line (1-based) it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// What the token is.
    pub kind: Kind,
    /// The line it starts on, 1-based.
    pub line: usize,
}

/// The kinds of token the check reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// An identifier or keyword; `r#x` is `x`, `$crate` is `crate`.
    Ident(String),
    /// `::`.
    PathSep,
    /// A string literal's raw text, between its quotes (for `#[path]`).
    Str(String),
    /// Any other single character but whitespace.
    Punct(char),
}

/// The tokens of `source`.
pub fn tokens(source: &str) -> Vec<Token> {
    Lexer {
        chars: source.chars().collect(),
        at: 0,
        line: 1,
        out: Vec::new(),
    }
    .run()
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    line: usize,
    out: Vec<Token>,
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    /// Moves past one character, counting lines.
    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn push(&mut self, kind: Kind, line: usize) {
        self.out.push(Token { kind, line });
    }

    fn run(mut self) -> Vec<Token> {
        while let Some(c) = self.peek(0) {
            let line = self.line;
            match c {
                c if c.is_whitespace() => {
                    self.bump();
                }
                '/' if self.peek(1) == Some('/') => self.line_comment(),
                '/' if self.peek(1) == Some('*') => self.block_comment(),
                '"' => {
                    let text = self.string();
                    self.push(Kind::Str(text), line);
                }
                '\'' => self.quote(),
                ':' if self.peek(1) == Some(':') => {
                    self.at += 2;
                    self.push(Kind::PathSep, line);
                }
                '$' if self.word_at(1) == "crate" => {
                    self.at += 1 + "crate".len();
                    self.push(Kind::Ident("crate".into()), line);
                }
                c if c.is_ascii_digit() => {
                    while self.peek(0).is_some_and(is_ident_char) {
                        self.bump();
                    }
                }
                c if is_ident_start(c) => self.word(),
                c => {
                    self.bump();
                    self.push(Kind::Punct(c), line);
                }
            }
        }
        self.out
    }

    /// The identifier characters starting `ahead` characters on.
    fn word_at(&self, ahead: usize) -> String {
        self.chars[(self.at + ahead).min(self.chars.len())..]
            .iter()
            .take_while(|c| is_ident_char(**c))
            .collect()
    }

    /// An identifier, or a literal with a prefix: `r"…"`, `r#"…"#`, `b"…"`,
    /// `br#"…"#`, `c"…"`, `b'x'`, and a raw identifier `r#name`.
    fn word(&mut self) {
        let line = self.line;
        let word = self.word_at(0);
        let after = self.peek(word.len());
        let raw = matches!(word.as_str(), "r" | "br" | "cr");
        if raw && matches!(after, Some('"') | Some('#')) {
            let hashes = self.chars[self.at + word.len()..]
                .iter()
                .take_while(|c| **c == '#')
                .count();
            if self.peek(word.len() + hashes) == Some('"') {
                self.at += word.len() + hashes;
                let text = self.raw_string(hashes);
                self.push(Kind::Str(text), line);
                return;
            }
            if word == "r" && hashes == 1 {
                // r#ident
                self.at += 2;
                let name = self.word_at(0);
                self.at += name.len();
                self.push(Kind::Ident(name), line);
                return;
            }
        }
        if matches!(word.as_str(), "b" | "c") && after == Some('"') {
            self.at += 1;
            let text = self.string();
            self.push(Kind::Str(text), line);
            return;
        }
        if word == "b" && after == Some('\'') {
            self.at += 1;
            self.quote();
            return;
        }
        self.at += word.len();
        self.push(Kind::Ident(word), line);
    }

    fn line_comment(&mut self) {
        while self.peek(0).is_some_and(|c| c != '\n') {
            self.bump();
        }
    }

    /// `/* … */`, nested as Rust nests them.
    fn block_comment(&mut self) {
        self.at += 2;
        let mut depth = 1;
        while depth > 0 {
            match (self.peek(0), self.peek(1)) {
                (Some('/'), Some('*')) => {
                    self.at += 2;
                    depth += 1;
                }
                (Some('*'), Some('/')) => {
                    self.at += 2;
                    depth -= 1;
                }
                (Some(_), _) => {
                    self.bump();
                }
                (None, _) => return,
            }
        }
    }

    /// A `"…"` string starting at the opening quote; returns its text.
    fn string(&mut self) -> String {
        self.bump();
        let mut text = String::new();
        while let Some(c) = self.bump() {
            match c {
                '\\' => {
                    text.push(c);
                    if let Some(next) = self.bump() {
                        text.push(next);
                    }
                }
                '"' => break,
                c => text.push(c),
            }
        }
        text
    }

    /// A raw string starting at its opening quote, closed by `"` and
    /// `hashes` `#`s.
    fn raw_string(&mut self, hashes: usize) -> String {
        self.bump();
        let mut text = String::new();
        while let Some(c) = self.bump() {
            if c == '"' && (0..hashes).all(|i| self.peek(i) == Some('#')) {
                self.at += hashes;
                break;
            }
            text.push(c);
        }
        text
    }

    /// A character literal (`'a'`, `'\n'`, `'\u{1F600}'`) or a lifetime or
    /// label (`'a`, `'static`), both skipped.
    fn quote(&mut self) {
        self.bump();
        match (self.peek(0), self.peek(1)) {
            (Some('\\'), _) => {
                while let Some(c) = self.bump() {
                    if c == '\\' {
                        self.bump();
                    } else if c == '\'' {
                        break;
                    }
                }
            }
            (Some(_), Some('\'')) => {
                self.bump();
                self.bump();
            }
            _ => {
                while self.peek(0).is_some_and(is_ident_char) {
                    self.bump();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(source: &str) -> Vec<String> {
        tokens(source)
            .into_iter()
            .filter_map(|t| match t.kind {
                Kind::Ident(s) => Some(s),
                Kind::PathSep => Some("::".into()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_strings_and_chars_hide_their_text() {
        let source = "a // crate::x\n/* b /* nested */ crate::y */ c \"crate::z\" \
                      r#\"crate::w \"q\" \"# 'x' '\\'' b'y' br\"k\" d";
        assert_eq!(idents(source), ["a", "c", "d"]);
    }

    #[test]
    fn lifetimes_raw_idents_and_dollar_crate() {
        let source = "fn f<'a>(x: &'a str) -> r#type { $crate::m::f() }";
        assert_eq!(
            idents(source),
            ["fn", "f", "x", "str", "type", "crate", "::", "m", "::", "f"]
        );
    }

    #[test]
    fn lines_are_counted_through_comments_and_strings() {
        let source = "a\n/* \n */ \"\n\" b\n// c\nd";
        let lines: Vec<usize> = tokens(source).iter().map(|t| t.line).collect();
        assert_eq!(lines, [1, 3, 4, 6]);
    }

    #[test]
    fn a_string_keeps_its_text() {
        let found: Vec<Kind> = tokens("#[path = \"../x.rs\"]")
            .into_iter()
            .map(|t| t.kind)
            .collect();
        assert_eq!(
            found,
            [
                Kind::Punct('#'),
                Kind::Punct('['),
                Kind::Ident("path".into()),
                Kind::Punct('='),
                Kind::Str("../x.rs".into()),
                Kind::Punct(']'),
            ]
        );
    }
}
