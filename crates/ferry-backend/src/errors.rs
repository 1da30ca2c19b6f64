//! Turning an error and its causes into one line for people.

use std::error::Error;

/// `e` and every cause under it, joined by `": "`. A cause whose text the
/// message already contains is skipped, so wrapping errors that repeat their
/// source (as `thiserror`'s `transparent` or `{0}` do) print it once.
pub fn error_chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open /dev/kvm")]
    struct Open(#[source] std::io::Error);

    #[test]
    fn causes_are_joined_once() {
        let e = Open(std::io::Error::other("permission denied"));
        assert_eq!(error_chain(&e), "cannot open /dev/kvm: permission denied");
    }
}
