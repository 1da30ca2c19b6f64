//! Turning a thread's panic into one line for people, so that a vCPU
//! thread that panics records a failure instead of dying "running".

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

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
}
