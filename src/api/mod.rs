//! The pool's public face: the [`Builder`](crate::Builder) that checks the settings, picks the
//! store and starts the runtime, and the [`Pool`](crate::Pool) that owns them afterwards.
//!
//! The top layer: it may import every other one, and nothing imports it.

pub(crate) mod builder;
mod console;
mod dead_letters;
#[cfg(feature = "postgres")]
mod durable;
mod oversight;
mod pause;
pub(crate) mod pool;
mod queues;
mod schedules;
pub(crate) mod type_options;
