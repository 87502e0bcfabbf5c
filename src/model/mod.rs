//! The vocabulary every layer shares: what a task is (its type, id, states and outcome), the
//! errors, the retry policy, dead letters, the cancellation token and the clock.
//!
//! Owns no behaviour of the pool's: each file is a value type with its own rules. May import
//! only `sync.rs` and `unwind.rs`; everything else imports it.

pub(crate) mod cancel;
pub(crate) mod clock;
#[cfg(feature = "postgres")]
pub(crate) mod codec;
pub(crate) mod completion;
#[cfg(feature = "cron")]
pub(crate) mod cron;
pub(crate) mod dead_letter;
pub(crate) mod error;
pub(crate) mod id;
pub(crate) mod pause;
pub(crate) mod queue_limit;
pub(crate) mod retry;
pub(crate) mod schedule;
pub(crate) mod state;
pub(crate) mod task;
