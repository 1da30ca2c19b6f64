//! Turning an error, its causes, or a thread's panic into one line for
//! people.

use std::any::Any;
use std::error::Error;
use std::panic::{catch_unwind, AssertUnwindSafe};

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

/// Runs `body` and returns what it panicked with, if it did: the message
/// given to `panic!`, or a placeholder for a payload that is not text.
///
/// For the body of a vCPU thread. A thread that dies unwinding leaves its
/// state as it was, "running", and the VMM's pause would then wait for it
/// for ever; with this, the thread records a failure and parks instead.
pub fn catch_panic(body: impl FnOnce()) -> Option<String> {
    catch_unwind(AssertUnwindSafe(body))
        .err()
        .map(|payload| panic_text(&*payload))
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    match (
        payload.downcast_ref::<&str>(),
        payload.downcast_ref::<String>(),
    ) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_with_its_message() {
        assert_eq!(catch_panic(|| {}), None);
        assert_eq!(
            catch_panic(|| panic!("static text")).as_deref(),
            Some("static text")
        );
        let n = 7;
        assert_eq!(
            catch_panic(|| panic!("queue {n} is broken")).as_deref(),
            Some("queue 7 is broken")
        );
        let other = catch_panic(|| std::panic::panic_any(42u32));
        assert_eq!(other.as_deref(), Some("a panic without a message"));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open /dev/kvm")]
    struct Open(#[source] std::io::Error);

    #[test]
    fn causes_are_joined_once() {
        let e = Open(std::io::Error::other("permission denied"));
        assert_eq!(error_chain(&e), "cannot open /dev/kvm: permission denied");
    }
}
