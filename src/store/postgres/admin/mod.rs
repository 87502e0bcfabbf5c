//! The operator's face of a durable queue: [`Admin`] reads and steers the rows of a schema
//! without running any task, for the `tasq` command and the dashboard (and any program that
//! wants them). It registers no type and starts no thread: every call is one or two statements
//! on a small pool of connections.
//!
//! It shares its statements with the pools where they act on the fleet (a pause takes the
//! pause fence, a cancel tells the process that runs the task, a retry brings the dependents
//! back as a pool's resubmit does), so what an operator does here is what a pool would do.
//!
//! Every read is bounded at any table size: counts stop at
//! [`COUNT_CAP`](crate::console::COUNT_CAP) rows per range (and say so), pages are keyset pages
//! (`id > after`) that read at most [`SCAN`](crate::console::SCAN) index entries, never an
//! `OFFSET`. Nothing from input reaches SQL but as a parameter.

mod actions;
mod connect;
mod overview;
mod statements;
mod tasks;

pub use connect::{Admin, AdminError};
pub(super) use overview::read as overview;
pub(super) use statements::statements;
