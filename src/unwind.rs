//! The one place that catches panics: a handler's panic becomes a permanent failure, and every
//! other piece of user code the engine runs (a `Display`, a `Drop`) is run here too, so that no
//! user panic can take a worker thread or the pool's lock with it.
//!
//! Why `AssertUnwindSafe` is sound in each of these: the closures touch no engine state. A
//! handler sees only its own payload and context; a `Drop` or `Display` sees only its own value.
//! Whatever the user's value was left in after a panic is either dropped or never read again.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

crate::sync::thread_local! {
    // Not `const`-initialised: loom's `thread_local!` does not take that form.
    #[allow(clippy::missing_const_for_thread_local)]
    /// Whether the panic hook should stay silent for panics on this thread: set on the worker
    /// threads of pools built with [`Builder::quiet_panics`](crate::Builder::quiet_panics).
    static QUIET: std::cell::Cell<bool> = std::cell::Cell::new(false);
}

/// Makes the process's panic hook skip panics on the calling thread, for the rest of its life.
///
/// The first call installs, once per process, a hook that wraps the hook in place at that
/// moment: panics on quiet threads are not reported, every other panic goes to the wrapped hook
/// as before. A program that sets its own hook later replaces this one (and its own decides).
pub(crate) fn quiet_this_thread() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    QUIET.with(|quiet| quiet.set(true));
}

/// Runs `f`, turning a panic into its message.
pub(crate) fn catch<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    panic::catch_unwind(AssertUnwindSafe(f)).map_err(into_message)
}

/// Drops `value` (user code: its `Drop`), swallowing a panic. The panic hook has already
/// reported it; the pool has nobody else to report it to.
pub(crate) fn drop_quietly<T>(value: T) {
    if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(move || drop(value))) {
        drop_payload(payload);
    }
}

/// A panic's message, with the payload dropped safely.
fn into_message(payload: Box<dyn Any + Send>) -> String {
    let message = if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    };
    drop_payload(payload);
    message
}

/// Drops a panic payload, whose `Drop` is user code that may panic in turn (`panic_any` takes any
/// type). A payload that panics while being dropped is dropped once more inside a
/// `catch_unwind`; a payload of *that* panic is leaked rather than risk an endless chain.
fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(second) = panic::catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(second);
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

    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("bomb dropped");
        }
    }

    #[test]
    fn a_payload_that_panics_when_dropped_is_contained() {
        assert_eq!(
            catch(|| std::panic::panic_any(Bomb)),
            Err::<(), _>("a panic with a non-string payload".to_owned())
        );
        drop_quietly(Bomb);
    }
}
