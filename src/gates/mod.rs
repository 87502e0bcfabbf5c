//! What may hold a ready task back before it starts: per-type limits (concurrency and rate),
//! circuit breakers, and aging (which lets a waiting task overtake newer, higher ones).
//!
//! Each file holds a gate's settings and its pure rules; the stores apply them to their tasks
//! (`store/memory/gate.rs`, `store/postgres/gates.rs`). May import `model/` only.

pub(crate) mod aging;
pub(crate) mod breaker;
pub(crate) mod limit;
