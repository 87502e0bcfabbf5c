//! The one place that catches panics: a handler's panic becomes a permanent failure.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

/// Runs `f`, turning a panic into `Err(message)`.
///
/// `AssertUnwindSafe` is sound here because nothing `f` may have left half-updated is looked at
/// after a panic: the closure borrows only the task's payload (returned to the engine unchanged in
/// type, and dead-lettered, never run again automatically) and the context. The engine's own state
/// is never borrowed across the call; the pool lock is not held while user code runs.
pub(crate) fn catch<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    panic::catch_unwind(AssertUnwindSafe(f)).map_err(|payload| message(&*payload))
}

/// The panic's message, when it was a string (as `panic!` makes), or a placeholder.
fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_panic_message() {
        assert_eq!(
            catch(|| panic!("boom {}", 7)),
            Err::<(), _>("boom 7".to_owned())
        );
        assert_eq!(
            catch(|| std::panic::panic_any(5u8)),
            Err::<(), _>("a panic with a non-string payload".to_owned())
        );
        assert_eq!(catch(|| 3), Ok(3));
    }
}
