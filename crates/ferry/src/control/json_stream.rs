//! QMP's framing: the input is a stream of JSON values, as QEMU's monitor
//! reads it, not a line protocol. A command may arrive split across reads,
//! several may come in one read, and any whitespace may stand between them
//! (`qemu.qmp` sends each command with no newline after it). Text that
//! cannot start a JSON object is a syntax error; the splitter reports it
//! and goes on at the next object, as QEMU's parser recovers.

/// What the splitter found.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// One whole top-level object, as text (still to be parsed).
    Object(String),
    /// Text outside any object that is not whitespace.
    Junk(String),
}

/// Splits a byte stream into top-level JSON objects.
#[derive(Default)]
pub struct JsonSplitter {
    current: Vec<u8>,
    junk: Vec<u8>,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The object under way outgrew [`MAX_OBJECT`]: its bytes are dropped
    /// until it ends, so nothing inside it (a string, say) is taken for a
    /// command.
    discarding: bool,
}

/// The longest object taken (QEMU's own limit is 64 MiB of tokens; a
/// command is a few hundred bytes).
const MAX_OBJECT: usize = 1 << 20;

impl JsonSplitter {
    /// Feeds `bytes`; appends what they completed to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<Piece>) {
        for &b in bytes {
            if self.depth == 0 {
                match b {
                    b'{' => {
                        self.flush_junk(out);
                        self.current.push(b);
                        self.depth = 1;
                    }
                    b' ' | b'\t' | b'\r' | b'\n' => self.flush_junk(out),
                    _ if self.junk.len() < MAX_JUNK => self.junk.push(b),
                    _ => {}
                }
                continue;
            }
            if !self.discarding {
                self.current.push(b);
            }
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
            } else {
                match b {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => self.depth -= 1,
                    _ => {}
                }
            }
            if self.depth == 0 {
                if self.discarding {
                    self.discarding = false;
                    out.push(Piece::Junk(format!(
                        "an object of more than {MAX_OBJECT} bytes"
                    )));
                } else {
                    let text = String::from_utf8_lossy(&self.current).into_owned();
                    out.push(Piece::Object(text));
                }
                self.current.clear();
            } else if self.current.len() > MAX_OBJECT {
                self.discarding = true;
                self.current.clear();
            }
        }
    }

    fn flush_junk(&mut self, out: &mut Vec<Piece>) {
        if !self.junk.is_empty() {
            out.push(Piece::Junk(
                String::from_utf8_lossy(&self.junk).into_owned(),
            ));
            self.junk.clear();
        }
    }
}

/// The most junk kept for the error message (the rest is dropped).
const MAX_JUNK: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&str]) -> Vec<Piece> {
        let mut s = JsonSplitter::default();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c.as_bytes(), &mut out);
        }
        out
    }

    fn obj(s: &str) -> Piece {
        Piece::Object(s.into())
    }

    #[test]
    fn a_command_split_across_reads_is_one_object() {
        assert_eq!(
            split(&[r#"{"execute": "qmp_ca"#, r#"pabilities"}"#]),
            [obj(r#"{"execute": "qmp_capabilities"}"#)]
        );
    }

    #[test]
    fn two_commands_in_one_read_with_no_whitespace_are_two() {
        assert_eq!(
            split(&[r#"{"execute":"a"}{"execute":"b","arguments":{"x":[1,{}]}}"#]),
            [
                obj(r#"{"execute":"a"}"#),
                obj(r#"{"execute":"b","arguments":{"x":[1,{}]}}"#)
            ]
        );
    }

    #[test]
    fn braces_and_quotes_inside_strings_do_not_count() {
        assert_eq!(
            split(&[r#"{"id": "}{\"}", "execute": "a"}"#, "\r\n"]),
            [obj(r#"{"id": "}{\"}", "execute": "a"}"#)]
        );
    }

    #[test]
    fn an_oversized_object_is_dropped_whole_and_nothing_inside_it_runs() {
        let inner = r#"{\"execute\":\"quit\"}"#;
        let big = format!(
            r#"{{"x": "{}{inner}"}}{{"execute":"a"}}"#,
            "y".repeat(MAX_OBJECT)
        );
        let got = split(&[&big]);
        assert_eq!(
            got.len(),
            2,
            "{:?}",
            got.iter()
                .map(|p| format!("{p:?}").len())
                .collect::<Vec<_>>()
        );
        assert!(matches!(&got[0], Piece::Junk(j) if j.contains("more than")));
        assert_eq!(got[1], obj(r#"{"execute":"a"}"#));
    }

    #[test]
    fn junk_between_objects_is_reported_and_the_next_object_is_read() {
        assert_eq!(
            split(&["nonsense {\"execute\":\"a\"}"]),
            [Piece::Junk("nonsense".into()), obj(r#"{"execute":"a"}"#)]
        );
    }
}
