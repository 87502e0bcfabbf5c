//! The handlers of a pool's task types: what its workers run, by type index.
//!
//! Kept apart from the registry (`registry.rs`), which is what the stores know of each type:
//! a store never runs a handler, so it never sees one, nor the [`Context`] a handler takes.

use std::any::Any;

use crate::client::context::Context;
use crate::model::retry::HandlerError;
use crate::unwind;

/// A handler with its payload and output types erased.
pub(crate) type ErasedHandler = Box<
    dyn Fn(&Context, &(dyn Any + Send)) -> Result<Box<dyn Any + Send + Sync>, HandlerError>
        + Send
        + Sync,
>;

/// `handler`, its payload and output types erased (the registry checks them at submit).
pub(crate) fn erase<P, O, F>(handler: F) -> ErasedHandler
where
    P: Send + 'static,
    O: Send + Sync + 'static,
    F: Fn(&Context, &P) -> Result<O, HandlerError> + Send + Sync + 'static,
{
    Box::new(move |ctx, payload| {
        let payload = payload
            .downcast_ref::<P>()
            .expect("payload type checked at submit");
        handler(ctx, payload).map(|output| Box::new(output) as _)
    })
}

/// Every registered type's handler, in registry order; `None` for a type declared without one.
/// Immutable once the pool is built: workers read it without a lock.
pub(crate) struct Handlers(Vec<Option<ErasedHandler>>);

impl Handlers {
    pub(crate) fn new(handlers: Vec<Option<ErasedHandler>>) -> Self {
        Handlers(handlers)
    }

    /// The handler of the type at `index`, if this pool has one.
    pub(crate) fn get(&self, index: u32) -> Option<&ErasedHandler> {
        self.0.get(index as usize).and_then(Option::as_ref)
    }
}

impl Drop for Handlers {
    /// The handlers are user closures, and so are their captures' `Drop`s: one at a time, each
    /// inside `catch_unwind`.
    fn drop(&mut self) {
        for handler in self.0.drain(..) {
            unwind::drop_quietly(handler);
        }
    }
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handlers")
            .field("types", &self.0.len())
            .finish_non_exhaustive()
    }
}
