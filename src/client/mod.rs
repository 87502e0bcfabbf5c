//! How code reaches tasks through a store: the submit path, the handles it returns, the
//! periodic tasks ([`Schedule`](crate::Schedule): what a program asks to have submitted at each
//! slot), and the [`Context`](crate::Context) a handler gets (which submits and cancels through
//! the same store), with the thread-local that says which task a handler thread runs.
//!
//! May import `model/`, `observe/` and the store seam (`store/mod.rs`, `store/hub.rs`,
//! `store/registry.rs`, `store/schedule.rs`);
//! never a store's own code, the runtime or the public face.

pub(crate) mod context;
pub(crate) mod current;
pub(crate) mod handle;
pub(crate) mod schedule;
pub(crate) mod submit;
